/**
 * How deep JSON that agentd takes from elsewhere (request bodies, a model's tool-call arguments,
 * webhook and hook answers) may nest. Deeper text is refused before it is parsed: JSON.parse takes
 * any depth, but the recursive code downstream (JSON.stringify when it is stored, schema
 * validation, structuredClone) overflows the stack on a few thousand levels, which a few kilobytes
 * of brackets reach, and would fail the request or the run as an internal error.
 */
export const MAX_JSON_DEPTH = 128

/** How deep arrays and objects nest in a JSON text, counting only brackets outside strings; stops once past `limit`. */
export function jsonDepth(text: string, limit = Infinity): number {
  let depth = 0
  let max = 0
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (inString) {
      if (c === 0x5c) i++ // a backslash escapes the next character
      else if (c === 0x22) inString = false
    } else if (c === 0x22) inString = true
    else if (c === 0x5b || c === 0x7b) {
      depth++
      if (depth > max) max = depth
      if (max > limit) return max
    } else if (c === 0x5d || c === 0x7d) depth--
  }
  return max
}
