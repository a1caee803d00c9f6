import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { readSse } from '../helpers/sse.ts'

// Which answer a route gives (SSE or JSON) follows the Accept header as HTTP reads it: media types
// are case-insensitive and a q-value ranks them, q=0 meaning "not this one" (RFC 9110 §12.5.1).

t.test('Accept negotiation between text/event-stream and application/json', async (t) => {
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const finished = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hi' } })
  t.equal(finished.statusCode, 200)
  // A finished run's `done` is stored: with ?until=done a stream of the session replays it and ends.
  const events = (accept: string) => readSse(`${base}/v1/sessions/${session.id}/events?until=done`, { headers: { accept }, timeoutMs: 2000 })
  const post = (accept: string) => readSse(`${base}/v1/sessions/${session.id}/messages`, {
    method: 'POST', headers: { accept }, body: { content: 'again' }, timeoutMs: 2000
  })

  for (const accept of ['text/event-stream;q=0.5, application/json', 'application/json, text/event-stream;q=0', 'text/event-stream;q=0']) {
    t.test(`GET …/events with Accept: ${accept} is the JSON page`, async (t) => {
      const res = await events(accept)
      t.equal(res.status, 200)
      t.match(res.headers['content-type'], /^application\/json/)
      t.equal(JSON.parse(res.body).data.at(-1).type, 'done')
    })
  }
  for (const accept of ['application/json;q=0.5, text/event-stream', 'text/event-stream, application/json', '*/*', 'application/json;q=0']) {
    t.test(`GET …/events with Accept: ${accept} is the stream`, async (t) => {
      const res = await events(accept)
      t.match(res.headers['content-type'], /^text\/event-stream/)
      t.equal(res.events.at(-1)?.type, 'done')
    })
  }
  for (const accept of ['text/event-stream;q=0', 'text/event-stream;q=0.5, application/json']) {
    t.test(`POST …/messages with Accept: ${accept} is the 202, not a stream`, async (t) => {
      const res = await post(accept)
      t.equal(res.status, 202)
      const run = JSON.parse(res.body).run
      await app.agentd.runs.waitFor(session.id, run.id)
    })
  }
  for (const accept of ['Text/Event-Stream', 'application/json;q=0.5, text/event-stream']) {
    t.test(`POST …/messages with Accept: ${accept} streams the run`, async (t) => {
      const res = await post(accept)
      t.equal(res.status, 200)
      t.equal(res.events.at(-1)?.type, 'done')
    })
  }
})

t.test('a streamed POST sent again with the same key and Accept: Text/Event-Stream is the stream again, not a 202', async (t) => {
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const send = () => readSse(`${base}/v1/sessions/${session.id}/messages`, {
    method: 'POST', headers: { accept: 'Text/Event-Stream', 'idempotency-key': 'mixed-case' }, body: { content: 'hi' }, timeoutMs: 2000
  })
  const first = await send()
  t.equal(first.status, 200)
  t.equal(first.events.at(-1)?.type, 'done', 'the first answer streams the run to its end')
  const again = await send()
  t.equal(again.status, 200)
  t.equal(again.headers['idempotent-replayed'], 'true')
  t.same(again.events.map((e) => e.seq), first.events.map((e) => e.seq), 'the same events again')
})
