import { createHash } from 'node:crypto'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { readSse } from '../helpers/sse.ts'

t.test('Idempotency-Key', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const create = (key: string, payload: object) =>
    app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'idempotency-key': key }, payload })

  t.test('the same key and body replay the first response', async (t) => {
    const first = await create('create-1', { metadata: { a: '1' } })
    const second = await create('create-1', { metadata: { a: '1' } })
    t.equal(first.statusCode, 201)
    t.equal(second.statusCode, 201)
    t.same(second.json(), first.json(), 'same body')
    t.equal(second.headers['idempotent-replayed'], 'true')
    const list = (await app.inject({ method: 'GET', url: '/v1/sessions?limit=100' })).json().data
    t.equal(list.filter((s: { id: string }) => s.id === first.json().id).length, 1, 'one session was created')
  })

  t.test('the same key with another body is 422 IDEMPOTENCY_KEY_REUSED', async (t) => {
    await create('create-2', { metadata: { a: '1' } })
    const other = await create('create-2', { metadata: { a: '2' } })
    t.equal(other.statusCode, 422)
    t.equal(other.json().error.code, 'IDEMPOTENCY_KEY_REUSED')
  })

  t.test('the same body with its keys in another order is the same request: its first response again', async (t) => {
    const json = { 'content-type': 'application/json' }
    const first = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { ...json, 'idempotency-key': 'create-reordered' },
      payload: '{"tools":[],"metadata":{"a":"1","b":"2"}}' })
    const again = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { ...json, 'idempotency-key': 'create-reordered' },
      payload: '{"metadata":{"b":"2","a":"1"},"tools":[]}' })
    t.equal(first.statusCode, 201)
    t.equal(again.statusCode, 201, 'not 422 IDEMPOTENCY_KEY_REUSED')
    t.equal(again.json().id, first.json().id, 'the same session')
    t.equal(again.headers['idempotent-replayed'], 'true')
    const other = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { ...json, 'idempotency-key': 'create-reordered' },
      payload: '{"metadata":{"b":"1","a":"2"},"tools":[]}' })
    t.equal(other.statusCode, 422, 'other values are still another request')
  })

  t.test('a key claimed before fingerprints sorted members still replays a retry sent in its own order', async (t) => {
    // What agentd stored before: the request hashed with the body's members in the order sent.
    const body = { tools: [], metadata: { b: '2', a: '1' } }
    const legacy = createHash('sha256').update(JSON.stringify(['POST', '/v1/sessions', {}, {}, body])).digest('hex')
    const at = new Date().toISOString()
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: body })).json()
    await app.agentd.store.claimIdempotency({ tenant: 'default', key: 'from-before', fingerprint: legacy, createdAt: at, leaseUntil: at })
    await app.agentd.store.completeIdempotency('default', 'from-before', { status: 201, body: session })
    const retry = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json', 'idempotency-key': 'from-before' },
      payload: JSON.stringify(body) })
    t.equal(retry.statusCode, 201, 'not 422 IDEMPOTENCY_KEY_REUSED')
    t.same(retry.json(), session, 'the first response again')
    t.equal(retry.headers['idempotent-replayed'], 'true')
    const other = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'idempotency-key': 'from-before' }, payload: { tools: [] } })
    t.equal(other.statusCode, 422, 'another body is still another request')
  })

  t.test('a malformed key is a 400', async (t) => {
    const res = await create('has spaces in it', {})
    t.equal(res.statusCode, 400)
    t.equal(res.json().error.details.fields[0].field, 'headers.idempotency-key')
  })

  t.test('ten concurrent duplicates create exactly one message and one run', async (t) => {
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
    devModel.script({ text: 'only once', delayMs: 50 })
    const results = await Promise.all(Array.from({ length: 10 }, () =>
      app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, headers: { 'idempotency-key': 'msg-race' }, payload: { content: 'hello' } })))
    const statuses = results.map((r) => r.statusCode)
    t.ok(statuses.every((s) => s === 202 || s === 409), `only 202 and 409: ${statuses.join(',')}`)
    t.ok(statuses.includes(202))
    for (const r of results.filter((r) => r.statusCode === 409)) t.equal(r.json().error.code, 'IDEMPOTENCY_IN_PROGRESS')
    const runIds = new Set(results.filter((r) => r.statusCode === 202).map((r) => r.json().run.id))
    t.equal(runIds.size, 1, 'every 202 names the same run')
    await app.agentd.runs.waitFor(session.id, [...runIds][0] as string)
    const messages = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
    t.same(messages.map((m: { role: string }) => m.role), ['user', 'assistant'], 'one user message, one answer')
    const again = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, headers: { 'idempotency-key': 'msg-race' }, payload: { content: 'hello' } })
    t.equal(again.statusCode, 202)
    t.equal(again.json().run.id, [...runIds][0], 'a later retry replays the same run')
  })

  t.test('keys are per tenant', async (t) => {
    const { app: multi } = await buildTestApp(t, { env: { AGENTD_API_KEYS: 'a:aaaaaaaaaaaaaaaa,b:bbbbbbbbbbbbbbbb' } })
    const post = (key: string) => multi.inject({
      method: 'POST', url: '/v1/sessions', headers: { authorization: `Bearer ${key}`, 'idempotency-key': 'shared' }, payload: {}
    })
    const a = await post('aaaaaaaaaaaaaaaa')
    const b = await post('bbbbbbbbbbbbbbbb')
    t.equal(a.statusCode, 201)
    t.equal(b.statusCode, 201)
    t.not(a.json().id, b.json().id, 'each tenant got its own session')
    t.equal(b.headers['idempotent-replayed'], undefined)
  })

  t.test('a retryable failure is not kept: the retry really retries', async (t) => {
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
    devModel.script({ text: 'slow', delayMs: 200 }, { text: 'next' })
    const active = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'a' } })).json()
    const busy = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, headers: { 'idempotency-key': 'busy-1' }, payload: { content: 'b' } })
    t.equal(busy.statusCode, 409)
    await app.agentd.runs.waitFor(session.id, active.run.id)
    const retry = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, headers: { 'idempotency-key': 'busy-1' }, payload: { content: 'b' } })
    t.equal(retry.statusCode, 202)
    await app.agentd.runs.waitFor(session.id, retry.json().run.id)
  })
})

t.test('the replay of a streamed answer whose session was deleted since is 404 SESSION_NOT_FOUND, not a stream that never ends', async (t) => {
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const send = () => readSse(`${base}/v1/sessions/${session.id}/messages`, {
    method: 'POST', headers: { 'idempotency-key': 'stream-then-delete' }, body: { content: 'hi' }, timeoutMs: 3000
  })
  const first = await send()
  t.equal(first.events.at(-1)?.type, 'done', 'the first answer streams the run to its end')
  t.equal((await app.inject({ method: 'DELETE', url: `/v1/sessions/${session.id}` })).statusCode, 204)
  const again = await send()
  t.equal(again.status, 404, 'answered at once')
  t.match(again.body, /"code":"SESSION_NOT_FOUND"/, 'in the envelope')
  t.equal(again.headers['idempotent-replayed'], undefined, 'not the kept answer')
  t.equal(app.streams.count, 0, 'no stream is left open')
})

t.test("a streamed POST sent again with Last-Event-ID (a client reconnecting) gets the run's events after it, none twice", async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'one two three four', chunks: 4 })
  const send = (headers: Record<string, string> = {}) => readSse(`${base}/v1/sessions/${session.id}/messages`, {
    method: 'POST', headers: { 'idempotency-key': 'stream-resume', ...headers }, body: { content: 'hi' }, timeoutMs: 3000
  })
  const first = await send()
  t.equal(first.events.at(-1)?.type, 'done')
  const seqs = first.events.map((e) => e.seq)
  const point = seqs[Math.floor(seqs.length / 2)] as number
  const resumed = await send({ 'last-event-id': String(point) })
  t.equal(resumed.headers['idempotent-replayed'], 'true')
  t.same(resumed.events.map((e) => e.seq), seqs.filter((seq) => seq > point), 'only what came after it, to the done')
  const bad = await send({ 'last-event-id': 'later' })
  t.equal(bad.status, 400, 'a malformed Last-Event-ID is a 400, as on the events route')
})

t.test("a streamed POST sent again with the Last-Event-ID of its run's done ends at once; one beyond the last event is a 400", async (t) => {
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const send = (headers: Record<string, string> = {}) => readSse(`${base}/v1/sessions/${session.id}/messages`, {
    method: 'POST', headers: { 'idempotency-key': 'stream-seen-all', ...headers }, body: { content: 'hi' }, timeoutMs: 2000
  })
  // An earlier run's done lies after seq 0, and after a Last-Event-ID from before this run.
  const earlier = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'earlier' } })
  t.equal(earlier.statusCode, 200)
  const first = await send()
  const done = first.events.at(-1)
  t.equal(done?.type, 'done')
  const whole = await send()
  t.same(whole.events.map((e) => e.seq), first.events.map((e) => e.seq), 'without Last-Event-ID: the whole run again')
  const fromStart = await send({ 'last-event-id': '1' })
  t.same(fromStart.events.map((e) => e.seq), first.events.map((e) => e.seq), 'from before the run: the whole run again')
  // A later run's events follow in the session: they are not this run's, and its done has been seen.
  const later = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'later' } })
  t.equal(later.statusCode, 200)
  const seenAll = await send({ 'last-event-id': String(done?.seq) })
  t.equal(seenAll.status, 200)
  t.equal(seenAll.headers['idempotent-replayed'], 'true')
  t.ok(seenAll.endedByServer, 'the stream ends, not waiting for a done that has passed')
  t.same(seenAll.events, [], 'nothing again')
  const lastSeq = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().lastSeq
  const beyond = await send({ 'last-event-id': String(lastSeq + 1) })
  t.equal(beyond.status, 400, 'as on the events route: no client can have seen that seq')
  t.equal(JSON.parse(beyond.body).error.details.lastSeq, lastSeq)
  t.equal(app.streams.count, 0, 'no stream is left open')
})
