import fc from 'fast-check'
import { _iterSSEMessages } from 'openai/core/streaming'
import t from 'tap'
import { ServerSentEventDecoder, type ServerSentEvent } from '../../src/model/sse.ts'

/** Every event of `pieces`, fed to one decoder in that order, then the end of the stream. */
function decodeAll(pieces: string[]): ServerSentEvent[] {
  const decoder = new ServerSentEventDecoder()
  return [...pieces.flatMap((piece) => decoder.decode(piece)), ...decoder.end()]
}

/** What the openai SDK's own SSE reader makes of the same text: the reference the decoder must match. */
async function decodeWithSdk(text: string): Promise<ServerSentEvent[]> {
  const events: ServerSentEvent[] = []
  for await (const sse of _iterSSEMessages(new Response(text), new AbortController())) events.push({ event: sse.event, data: sse.data })
  return events
}

/** `text` cut at the given offsets. */
function cut(text: string, offsets: number[]): string[] {
  const at = [...new Set(offsets.map((o) => o % (text.length + 1)))].sort((a, b) => a - b)
  return [...at, text.length].map((end, i) => text.slice(i === 0 ? 0 : at[i - 1], end))
}

// Lines of the kinds servers send, with every line ending.
const line = fc.oneof(
  fc.constantFrom('', 'data: {"a":1}', 'data:{"b":2}', 'data', 'data: ', 'data:  two spaces', 'event: error', 'event:', 'id: 7', 'retry: 10', ': keep-alive', ':', 'no colon at all', 'data: [DONE]'),
  fc.string({ maxLength: 12 }).map((s) => `data: ${s.replace(/[\r\n]/g, '')}`)
)
const ending = fc.constantFrom('\n', '\r\n', '\r')
const stream = fc.array(fc.tuple(line, ending).map(([l, e]) => l + e), { maxLength: 14 }).chain((lines) =>
  // Sometimes without the final line end or blank line, as servers sometimes end.
  fc.boolean().map((trim) => (trim ? lines.join('').replace(/[\r\n]+$/, '') : lines.join('')))
)

t.test('the decoder finds the same events as the openai SDK in any stream of data, event, comment and other lines', async (t) => {
  await fc.assert(fc.asyncProperty(stream, async (text) => {
    t.same(decodeAll([text]), await decodeWithSdk(text), JSON.stringify(text))
  }), { numRuns: 300 })
})

t.test('how the stream is cut into reads changes nothing, a \\r\\n cut in two included', async (t) => {
  fc.assert(fc.property(stream, fc.array(fc.nat(), { maxLength: 6 }), (text, offsets) => {
    t.same(decodeAll(cut(text, offsets)), decodeAll([text]), JSON.stringify({ text, offsets }))
  }), { numRuns: 500 })
  t.same(decodeAll(['data: a\r', '\ndata: b\r', '\n\r', '\n']), [{ event: null, data: 'a\nb' }], 'a \\r\\n split between reads is one line end')
})

t.test('data lines of one event are joined with \\n; comments and unknown fields are skipped; the event name is kept', async (t) => {
  t.same(decodeAll([': keep-alive\n\ndata: {"x":\ndata: 1}\nid: 3\n\nevent: error\ndata: {"message":"boom"}\n\n']), [
    { event: null, data: '{"x":\n1}' },
    { event: 'error', data: '{"message":"boom"}' }
  ])
})
