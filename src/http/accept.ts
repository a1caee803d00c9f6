/**
 * The quality (q-value) that an Accept header gives a media type by naming it, or undefined when
 * no range names it: media types are case-insensitive, parameters other than q do not matter, and
 * a q that does not parse counts as 1 (RFC 9110 §12.5.1). Wildcards do not name a type.
 */
function namedQuality(accept: string, type: string): number | undefined {
  let best: number | undefined
  for (const range of accept.split(',')) {
    const [name = '', ...params] = range.split(';').map((part) => part.trim().toLowerCase())
    if (name !== type) continue
    const q = params.find((param) => param.startsWith('q='))
    const value = q === undefined ? 1 : Number(q.slice(2))
    const quality = Number.isFinite(value) && value >= 0 && value <= 1 ? value : 1
    best = Math.max(best ?? 0, quality)
  }
  return best
}

/**
 * True when the answer should be Server-Sent Events rather than JSON. `byDefault` is the answer
 * when the header names neither (…/events streams, POST …/messages does not); when it names
 * text/event-stream, the stream is the answer unless q=0 refuses it or application/json has a higher q.
 * Every route and plugin that tells the two apart asks this, so that they never disagree.
 */
export function wantsEventStream(accept: string | undefined, byDefault: boolean): boolean {
  const stream = namedQuality(accept ?? '', 'text/event-stream')
  const json = namedQuality(accept ?? '', 'application/json') ?? 0
  if (stream === undefined) return byDefault && json === 0
  return stream > 0 && stream >= json
}
