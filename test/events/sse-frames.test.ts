import { createServer } from 'node:http'
import { connect } from 'node:net'
import t from 'tap'
import { LocalEventBus } from '../../src/events/event-bus.ts'
import { EventLog } from '../../src/events/event-log.ts'
import { encodeEvent, openEventStream } from '../../src/events/sse.ts'
import { SqliteStore } from '../../src/store/sqlite.ts'
import type { EventRecord, NewEvent, StoreWrite } from '../../src/store/store.ts'
import { testSession } from '../store/contract.ts'

/** What a frame's data line must be: the SPEC 4 envelope, in its field order, as JSON. */
const envelope = (e: EventRecord) => JSON.stringify({
  seq: e.seq, sessionId: e.sessionId, runId: e.runId, channel: e.channel, type: e.type, at: e.at, requestId: e.requestId, data: e.data
})

const frameOf = (e: EventRecord) => {
  const [id, event, data, blank, end, ...rest] = encodeEvent(e).split('\n')
  t.same([blank, end, rest], ['', '', []], 'one frame, ended by a blank line')
  return { id, event, data: data?.slice('data: '.length) }
}

t.test('a frame carries the envelope whether its data JSON comes from the store or not', async (t) => {
  const store = new SqliteStore(':memory:')
  await store.migrate()
  t.teardown(() => store.close())
  const now = new Date().toISOString()
  await store.createSession(testSession('ses_frames', { tenant: 'default' }))
  const newEvents: NewEvent[] = [
    { sessionId: 'ses_frames', runId: 'run_1', channel: 'progress', type: 'text_chunk', at: now, requestId: 'req_1', data: { step: 1, delta: 'héllo "quoted" \n ✓ \u2028' } },
    { sessionId: 'ses_frames', runId: null, channel: 'monitor', type: 'session_event', at: now, requestId: null, data: { nested: { list: [1, null, { a: 'b' }] }, empty: {} } }
  ]
  const live = await store.commit(newEvents.map((event) => ({ type: 'event' as const, event })))
  const replayed = await store.listEvents('ses_frames', { after: 0 })
  // A record no store made (a test double, another port): encoded from its data.
  const bare: EventRecord = { ...newEvents[0] as NewEvent, seq: 9 }
  // Fields that need escaping are escaped.
  const escaped: EventRecord = { ...bare, seq: 1234567, requestId: 'req "quoted" \\ ✓\u2028', type: 'tool:start', runId: null }
  for (const [label, event] of [
    ...live.map((e) => ['live', e] as const), ...replayed.map((e) => ['replayed', e] as const), ['bare', bare] as const, ['escaped', escaped] as const
  ]) {
    const frame = frameOf(event)
    t.equal(frame.id, `id: ${event.seq}`, `${label}: id line`)
    t.equal(frame.event, `event: ${event.type}`, `${label}: event line`)
    t.equal(frame.data, envelope(event), `${label}: the envelope, byte for byte`)
    const { seq, sessionId, runId, channel, type, at, requestId, data } = event
    t.same(JSON.parse(frame.data ?? ''), { seq, sessionId, runId, channel, type, at, requestId, data }, `${label}: parses back to the event`)
  }
  t.equal(encodeEvent(live[0] as EventRecord), encodeEvent(replayed[0] as EventRecord), 'a replayed frame is the live frame')
  // A copy of a stored event with other data is encoded from its own data, not from the stored text.
  const changed = { ...(live[0] as EventRecord), data: { step: 2, delta: 'changed' } }
  t.equal(frameOf(changed).data, envelope(changed), 'a copy with other data: its own data')
})

/** The chunks of a chunked HTTP/1.1 body, as the server wrote them. */
function httpChunks(body: string): string[] {
  const chunks: string[] = []
  let at = 0
  for (;;) {
    const lineEnd = body.indexOf('\r\n', at)
    if (lineEnd < 0) return chunks
    const size = Number.parseInt(body.slice(at, lineEnd), 16)
    if (size === 0) return chunks
    chunks.push(body.slice(lineEnd + 2, lineEnd + 2 + size))
    at = lineEnd + 2 + size + 2
  }
}

t.test('the events of one unit of work reach a live stream in one write; a large unit is written in parts', async (t) => {
  const store = new SqliteStore(':memory:')
  await store.migrate()
  t.teardown(() => store.close())
  await store.createSession(testSession('ses_batch'))
  const bus = new LocalEventBus()
  const log = new EventLog(store, bus)
  const server = createServer((_req, res) => {
    openEventStream(res, store, bus, { sessionId: 'ses_batch', after: 0, runId: 'run_1', untilDone: true })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise((resolve) => server.close(resolve)))
  const { port } = server.address() as { port: number }

  const socket = connect(port, '127.0.0.1')
  socket.write('GET / HTTP/1.1\r\nhost: agentd\r\n\r\n')
  let raw = ''
  socket.on('data', (data: Buffer) => { raw += data.toString('latin1') })
  t.teardown(() => socket.destroy())
  // The stream is open (its retry frame is out) before the events come.
  while (!raw.includes('retry:')) await new Promise((resolve) => setTimeout(resolve, 5))

  const event = (type: string, data: Record<string, unknown>): StoreWrite => ({
    type: 'event', event: { sessionId: 'ses_batch', runId: 'run_1', channel: 'progress', type, at: new Date().toISOString(), requestId: 'req_1', data }
  })
  const text = Array.from({ length: 22 }, (_, i) => event('text_chunk', { step: 1, delta: `part ${i}` }))
  await log.commit('ses_batch', text)
  // 40 frames of ~1.2 KB: more than one write's worth (32 KiB).
  const large = Array.from({ length: 40 }, (_, i) => event('tool:progress', { step: 1, i, output: 'y'.repeat(1200) }))
  await log.commit('ses_batch', [...large, event('done', { step: 1, reason: 'completed' })])
  // The response ends with the done event (the connection itself is kept alive).
  while (!raw.endsWith('\r\n0\r\n\r\n')) await new Promise((resolve) => setTimeout(resolve, 5))

  const body = raw.slice(raw.indexOf('\r\n\r\n') + 4)
  const chunks = httpChunks(body).filter((chunk) => chunk.startsWith('id: '))
  const ids = (chunk: string) => [...chunk.matchAll(/^id: (\d+)$/gm)].map((m) => Number(m[1]))
  t.same(ids(chunks[0] as string), Array.from({ length: 22 }, (_, i) => i + 1), 'the 22 text events: one chunk, in order')
  const rest = chunks.slice(1)
  t.ok(rest.length >= 2, `the large unit came in parts (${rest.length})`)
  t.ok(rest.every((chunk) => chunk.length < 40 * 1024), 'none far over 32 KiB')
  t.same(rest.flatMap(ids), Array.from({ length: 41 }, (_, i) => i + 23), 'every event of it, once, in order, the done last')
})
