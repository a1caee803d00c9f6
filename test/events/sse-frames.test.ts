import t from 'tap'
import { encodeEvent } from '../../src/events/sse.ts'
import { SqliteStore } from '../../src/store/sqlite.ts'
import type { EventRecord, NewEvent } from '../../src/store/store.ts'

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
  await store.createSession({
    id: 'ses_frames', tenant: 'default', createdAt: now, updatedAt: now, status: 'idle', model: 'm', instructions: null, tools: null,
    approval: { mode: 'auto' }, limits: {}, metadata: {}, lastSeq: 0, usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 }, forkedFrom: null
  })
  const newEvents: NewEvent[] = [
    { sessionId: 'ses_frames', runId: 'run_1', channel: 'progress', type: 'text_chunk', at: now, requestId: 'req_1', data: { step: 1, delta: 'héllo "quoted" \n ✓ \u2028' } },
    { sessionId: 'ses_frames', runId: null, channel: 'monitor', type: 'session_event', at: now, requestId: null, data: { nested: { list: [1, null, { a: 'b' }] }, empty: {} } }
  ]
  const live = await store.commit(newEvents.map((event) => ({ type: 'event' as const, event })))
  const replayed = await store.listEvents('ses_frames', { after: 0 })
  // A record no store made (a test double, another port): encoded from its data.
  const bare: EventRecord = { ...newEvents[0] as NewEvent, seq: 9 }
  for (const [label, event] of [...live.map((e) => ['live', e] as const), ...replayed.map((e) => ['replayed', e] as const), ['bare', bare] as const]) {
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
