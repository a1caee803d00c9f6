/**
 * Turns an MCP tool result's content blocks into text the model can read (SPEC 11). The model's
 * tool message is text, so binary blocks are described (type, size, what was left out) rather
 * than dropped silently or pasted as base64.
 */

type Block = { type: string; [key: string]: unknown }

/**
 * The text of a CallToolResult: its blocks in order, and its structuredContent when there is no
 * content; or the `toolResult` of a server that speaks protocol 2024-10-07 (the SDK still
 * negotiates it), which has neither: left out, the model got an empty result. Null when the
 * content cannot be read as blocks and there is no structuredContent instead.
 */
export function resultText(result: Record<string, unknown>): string | null {
  const blocks = contentBlocks(result['content'])
  if (blocks === null) return result['structuredContent'] === undefined ? null : JSON.stringify(result['structuredContent'])
  const parts = blocks.map((block) => (typeof block === 'object' && block !== null ? describeBlock(block as Block) : '[a content block that is not an object; not shown]'))
  if (parts.length === 0 && result['structuredContent'] !== undefined) return JSON.stringify(result['structuredContent'])
  if (parts.length === 0 && result['content'] === undefined && result['toolResult'] !== undefined) {
    const legacy = result['toolResult']
    return typeof legacy === 'string' ? legacy : JSON.stringify(legacy)
  }
  return parts.join('\n')
}

/**
 * The result's content blocks ([] when it has none, as the SDK takes it). A non-conforming server's
 * bare string or single block stands for itself; anything else (a number, null, an object that is
 * no block) is null: read as no blocks, it gave the model an empty result.
 */
function contentBlocks(content: unknown): unknown[] | null {
  if (Array.isArray(content)) return content
  if (content === undefined) return []
  if (typeof content === 'string') return [{ type: 'text', text: content }]
  if (typeof content === 'object' && content !== null && typeof (content as Block).type === 'string') return [content]
  return null
}

function describeBlock(block: Block): string {
  switch (block.type) {
    case 'text':
      // A non-conforming server's text that is no string is shown as JSON, not as "[object Object]".
      return typeof block['text'] === 'string' ? block['text'] : JSON.stringify(block['text'] ?? '')
    case 'image':
    case 'audio':
      return `[${block.type}: ${String(block['mimeType'] ?? 'unknown type')}, ${base64Bytes(block['data'])} bytes; the ${block.type} itself is not shown here]`
    case 'resource': {
      const resource = (block['resource'] ?? {}) as Record<string, unknown>
      const uri = String(resource['uri'] ?? '')
      if (typeof resource['text'] === 'string') return `[resource ${uri}]\n${resource['text']}`
      return `[resource ${uri}: ${String(resource['mimeType'] ?? 'binary')}, ${base64Bytes(resource['blob'])} bytes; binary content not shown]`
    }
    case 'resource_link':
      return `[resource link: ${String(block['name'] ?? '')} ${String(block['uri'] ?? '')}${block['mimeType'] ? ` (${String(block['mimeType'])})` : ''}${block['description'] ? ` — ${String(block['description'])}` : ''}]`
    default:
      return `[${String(block.type).slice(0, 100)} content; not shown]`
  }
}

function base64Bytes(data: unknown): number {
  if (typeof data !== 'string') return 0
  const padding = data.endsWith('==') ? 2 : data.endsWith('=') ? 1 : 0
  return Math.max(0, Math.floor((data.length * 3) / 4) - padding)
}
