// JSON from elsewhere (request bodies, webhook and hook answers) is checked for depth before it
// is parsed: recursive code downstream (JSON.stringify, validation) overflows the stack on a few
// thousand levels, which a few kilobytes of brackets reach.

/** Deeper JSON is refused before parsing; a request body, a webhook's or a hook's answer alike. */
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
