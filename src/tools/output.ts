/** The UTF-8 prefix of `buf` of at most `maxBytes` bytes, never splitting a character. */
export function utf8Prefix(buf: Buffer, maxBytes: number): string {
  if (buf.length <= maxBytes) return buf.toString('utf8')
  let end = Math.max(0, maxBytes)
  // Step back over continuation bytes (10xxxxxx) so the cut falls between characters.
  while (end > 0 && ((buf[end] ?? 0) & 0xc0) === 0x80) end--
  return buf.subarray(0, end).toString('utf8')
}

/** `text` cut to at most `maxBytes` UTF-8 bytes, or unchanged when it fits. */
export function truncateUtf8(text: string, maxBytes: number): { text: string; truncated: boolean; bytes: number } {
  // A UTF-16 code unit is at most 3 UTF-8 bytes, so short strings need no encoding to be known to fit.
  if (text.length * 3 <= maxBytes) return { text, truncated: false, bytes: Buffer.byteLength(text) }
  const bytes = Buffer.byteLength(text)
  if (bytes <= maxBytes) return { text, truncated: false, bytes }
  return { text: utf8Prefix(Buffer.from(text.slice(0, maxBytes)), maxBytes), truncated: true, bytes }
}

/** The longest prefix of `text` whose JSON string (quotes and escapes included) has at most `maxBytes` UTF-8 bytes; never splits a surrogate pair. */
export function jsonFittingPrefix(text: string, maxBytes: number): string {
  let bytes = 2
  let i = 0
  for (; i < text.length; i++) {
    const c = text.charCodeAt(i)
    let cost: number
    let units = 1
    if (c === 0x22 || c === 0x5c || c === 0x08 || c === 0x09 || c === 0x0a || c === 0x0c || c === 0x0d) cost = 2
    else if (c < 0x20) cost = 6
    else if (c < 0x80) cost = 1
    else if (c < 0x800) cost = 2
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length && (text.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      cost = 4
      units = 2
    } else if (c >= 0xd800 && c <= 0xdfff) cost = 6 // a lone surrogate is escaped as \uXXXX
    else cost = 3
    if (bytes + cost > maxBytes) break
    bytes += cost
    i += units - 1
  }
  return text.slice(0, i)
}

/**
 * A result that lists items under `key`, with only as many of them as fit, with the rest of the
 * result and `note(shown)`, in `maxBytes` of JSON (then `truncated: true`): a larger result
 * reached the model as its JSON text cut mid-item. The result itself when it fits.
 */
export function fitListResult<T extends Record<string, unknown>>(result: T, key: string, maxBytes: number, note: (shown: number) => string): T {
  if (Buffer.byteLength(JSON.stringify(result)) <= maxBytes) return result
  const items = result[key] as unknown[]
  let used = Buffer.byteLength(JSON.stringify({ ...result, [key]: [], truncated: true, note: note(items.length) }))
  let shown = 0
  for (const item of items) {
    // The item's JSON and the comma before it.
    const cost = Buffer.byteLength(JSON.stringify(item)) + (shown > 0 ? 1 : 0)
    if (used + cost > maxBytes) break
    used += cost
    shown++
  }
  return { ...result, [key]: items.slice(0, shown), truncated: true, note: note(shown) }
}

/** The note appended where output was cut, so the model knows it saw only part of it. */
export function truncationNote(shownBytes: number, totalBytes: number | null): string {
  const total = totalBytes === null ? 'more' : `${totalBytes}`
  return `\n[output truncated: showing the first ${shownBytes} of ${total} bytes]`
}

/**
 * Collects a stream's bytes up to `maxBytes` and only counts the rest, so a flood costs no
 * memory beyond the cap.
 */
export class CappedBuffer {
  readonly maxBytes: number
  private readonly chunks: Buffer[] = []
  private kept = 0
  /** Every byte seen, kept or not. */
  total = 0

  constructor(maxBytes: number) {
    this.maxBytes = maxBytes
  }

  /** Keeps what fits of `chunk` and counts all of it. */
  push(chunk: Buffer): void {
    this.total += chunk.length
    const room = this.maxBytes - this.kept
    if (room <= 0) return
    const part = chunk.length <= room ? chunk : chunk.subarray(0, room)
    this.chunks.push(part)
    this.kept += part.length
  }

  /** True once bytes were dropped. */
  get truncated(): boolean {
    return this.total > this.kept
  }

  /** The kept bytes as UTF-8 text, with a truncation note when bytes were dropped. */
  text(): string {
    const text = utf8Prefix(Buffer.concat(this.chunks), this.maxBytes)
    return this.truncated ? text + truncationNote(this.kept, this.total) : text
  }
}
