import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { request } from 'undici'
import { parseFrames, readSse, type StreamedEvent } from '../helpers/sse.ts'
import { until } from '../helpers/server-process.ts'

const types = (events: StreamedEvent[]) => events.map((e) => e.type)

t.test('a text answer streams as an exact event sequence', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'Hello there friend', chunks: 3 })

  const res = await readSse(`${base}/v1/sessions/${session.id}/messages`, {
    method: 'POST', body: { content: 'hi' }, headers: { 'x-request-id': 'stream-req-1' }
  })
  t.equal(res.status, 200)
  t.equal(res.headers['content-type'], 'text/event-stream; charset=utf-8')
  t.equal(res.headers['cache-control'], 'no-cache, no-transform')
  t.equal(res.headers['x-accel-buffering'], 'no')
  t.equal(res.headers['x-request-id'], 'stream-req-1')
  t.equal(res.frames[0]?.retry, 2000, 'opens with retry: 2000')
  t.ok(res.endedByServer, 'the stream ends after done')
  t.same(types(res.events), [
    'state_changed', 'text_chunk_start', 'text_chunk', 'text_chunk', 'text_chunk', 'text_chunk_end',
    'token_usage', 'step_complete', 'state_changed', 'done'
  ])
  t.same(res.events.map((e) => e.seq), res.events.map((_, i) => i + 1), 'seq 1, 2, 3 … without gaps')
  for (const frame of res.frames.slice(1)) t.equal(frame.id, String(JSON.parse(frame.data ?? '{}').seq), 'frame id is the seq')
  t.ok(res.events.every((e) => e.requestId === 'stream-req-1'), 'every event carries the request ID')
  const chunks = res.events.filter((e) => e.type === 'text_chunk').map((e) => e.data.delta).join('')
  t.equal(chunks, 'Hello there friend')
  t.same(res.events.find((e) => e.type === 'text_chunk_end')?.data, { step: 1, text: 'Hello there friend' })
  t.same(res.events.at(-1)?.data, { step: 1, reason: 'completed', runId: res.events[0]?.runId })
  t.same(res.events[0]?.data, { from: 'queued', to: 'running' })
  t.equal(devModel.requests.at(-1)?.headers['x-request-id'], 'stream-req-1', 'the request ID goes upstream')

  const messages = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
  t.same(messages.map((m: { role: string; content: string }) => [m.role, m.content]), [['user', 'hi'], ['assistant', 'Hello there friend']])
})

t.test('wait=true answers 200 with the finished run and the assistant message; usage is summed', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'one' }, { text: 'two' })
  const first = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'a' } })
  t.equal(first.statusCode, 200)
  const body = first.json()
  t.equal(body.run.status, 'completed')
  t.equal(body.run.steps, 1)
  t.equal(body.message.content, 'one')
  t.ok(body.run.usage.totalTokens > 0, 'run usage counted')
  const second = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'b' } })).json()
  const after = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json()
  t.equal(after.usage.totalTokens, body.run.usage.totalTokens + second.run.usage.totalTokens, 'session usage is the sum of its runs')
  t.equal(after.status, 'idle')
  const run = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/runs/${body.run.id}` })
  t.same(run.json(), body.run)
  t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/runs/run_nope` })).json().error.code, 'RUN_NOT_FOUND')
})

t.test('202 without wait; a second message while busy is 409 SESSION_BUSY', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'slow', delayMs: 300 })
  const accepted = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'x' } })
  t.equal(accepted.statusCode, 202)
  t.match(accepted.json(), { message: { role: 'user', content: 'x' }, run: { status: 'queued' } })
  const busy = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'y' } })
  t.equal(busy.statusCode, 409)
  t.equal(busy.json().error.code, 'SESSION_BUSY')
  await app.agentd.runs.waitFor(session.id, accepted.json().run.id)
})

t.test('enqueued messages run in order after the active one', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'first', delayMs: 100 }, { text: 'second' }, { text: 'third' })
  const ids: string[] = []
  for (const content of ['1', '2', '3']) {
    const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content, onBusy: 'enqueue' } })
    t.equal(res.statusCode, 202)
    ids.push(res.json().run.id)
  }
  for (const id of ids) await app.agentd.runs.waitFor(session.id, id)
  const messages = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
  t.same(messages.map((m: { content: string }) => m.content), ['1', 'first', '2', 'second', '3', 'third'])
  const done = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=done`, headers: { accept: 'application/json' } })).json().data
  t.same(done.map((e: StreamedEvent) => e.runId), ids, 'runs finished in the order they were sent')
})

t.test('model errors: retries, fatal failures, timeouts and cut streams', async (t) => {
  const { app, devModel } = await buildTestApp(t, { retryPolicy: { maxRetries: 2, baseMs: 5, capMs: 10 } })
  const post = async (content = 'go') => {
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
    const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content } })
    const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
    return { body: res.json(), events }
  }

  t.test('a 429 with Retry-After is retried, then succeeds', async (t) => {
    devModel.script({ status: 429, headers: { 'retry-after-ms': '30' } }, { text: 'recovered' })
    const { body, events } = await post()
    t.equal(body.run.status, 'completed')
    t.equal(body.message.content, 'recovered')
    const retries = events.filter((e) => e.type === 'model_retry')
    t.equal(retries.length, 1)
    t.same(retries[0]?.data, { attempt: 1, delayMs: 30, code: 'RATE_LIMITED', status: 429 })
    t.equal(retries[0]?.channel, 'monitor')
  })

  t.test('a Retry-After longer than the run can wait fails the run at once: RATE_LIMITED, retryable, the delay in detail', async (t) => {
    devModel.reset()
    devModel.script({ status: 429, headers: { 'retry-after': '3600' } }, { text: 'too late' })
    const started = Date.now()
    const { body, events } = await post()
    t.ok(Date.now() - started < 5000, 'the waiting client is answered at once, not after minutes')
    t.equal(body.run.status, 'failed')
    t.match(body.run.error, { code: 'RATE_LIMITED', retryable: true, fatal: true, detail: { retryAfterMs: 3_600_000, maxWaitMs: 60_000 } })
    t.match(body.run.error.message, /3600 s/)
    t.equal(events.filter((e) => e.type === 'model_retry').length, 0, 'no retry was attempted')
    t.equal(devModel.requests.length, 1, 'the provider was asked once')
    t.match(events.at(-1), { type: 'done', data: { reason: 'failed' } })
    devModel.reset()
  })

  t.test('a 401 fails the run at once with AUTHENTICATION_ERROR', async (t) => {
    devModel.script({ status: 401 })
    const { body, events } = await post()
    t.equal(body.run.status, 'failed')
    t.match(body.run.error, { errorType: 'runtime', code: 'AUTHENTICATION_ERROR', retryable: false, fatal: true })
    t.ok(body.run.error.recommendations.length > 0)
    t.equal(events.filter((e) => e.type === 'model_retry').length, 0, 'not retried')
    const tail = events.slice(-3).map((e) => e.type)
    t.same(tail, ['error', 'state_changed', 'done'])
    t.match(events.at(-3)?.data, { severity: 'error', phase: 'model', detail: { code: 'AUTHENTICATION_ERROR' } })
    t.same(events.at(-1)?.data.reason, 'failed')
  })

  t.test('a 500 is retried until the retries run out', async (t) => {
    devModel.script({ status: 500 }, { status: 500 }, { status: 500 })
    const { body, events } = await post()
    t.equal(body.run.status, 'failed')
    t.match(body.run.error, { code: 'SERVER_ERROR', retryable: true, fatal: true })
    t.same(events.filter((e) => e.type === 'model_retry').map((e) => e.data.attempt), [1, 2])
  })

  t.test('a hanging model is cut by the timeout and retried', async (t) => {
    devModel.script({ hang: true }, { text: 'after the hang' })
    const { body, events } = await post()
    t.equal(body.run.status, 'completed')
    t.match(events.find((e) => e.type === 'model_retry')?.data, { code: 'TIMEOUT' })
  })

  t.test('a stream cut before its first token is retried; after it, the run fails', async (t) => {
    devModel.script({ cutAfterChunks: 0 }, { text: 'whole' })
    const early = await post()
    t.equal(early.body.run.status, 'completed')
    t.match(early.events.find((e) => e.type === 'model_retry')?.data, { code: 'NETWORK_ERROR' })

    devModel.script({ cutAfterChunks: 2, text: 'one two three four five' })
    const late = await post()
    t.equal(late.body.run.status, 'failed')
    t.match(late.body.run.error, { code: 'NETWORK_ERROR' })
    t.equal(late.events.filter((e) => e.type === 'model_retry').length, 0)
    const kinds = late.events.map((e) => e.type)
    t.ok(kinds.indexOf('text_chunk_end') > kinds.indexOf('text_chunk'), 'the opened text is closed before the failure')
  })
})

t.test('interrupt cancels a run mid-stream at once', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ hang: true, afterChunks: 2, text: 'partial answer that never ends' })
  const stream = readSse(`${base}/v1/sessions/${session.id}/messages`, { method: 'POST', body: { content: 'go' } })
  // Wait until text flows, then interrupt.
  const deadline = Date.now() + 3000
  while (Date.now() < deadline) {
    const page = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=text_chunk`, headers: { accept: 'application/json' } })).json()
    if (page.data.length > 0) break
    await new Promise((r) => setTimeout(r, 10))
  }
  const started = Date.now()
  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/interrupt` })
  t.ok(Date.now() - started < 500, 'answers at once, not after a timeout')
  t.equal(res.statusCode, 202)
  t.equal(res.json().status, 'cancelled')
  const { events } = await stream
  t.same(events.at(-1)?.data.reason, 'interrupted')
  t.equal(events.at(-1)?.type, 'done')
  t.match(events.at(-2)?.data, { to: 'cancelled' })

  const none = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/interrupt` })
  t.equal(none.statusCode, 409)
  t.equal(none.json().error.code, 'NO_ACTIVE_RUN')
})

t.test('onBusy interrupt cancels the active run and runs the new message', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ hang: true }, { text: 'fresh' })
  const first = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'old' } })).json()
  const second = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'new', onBusy: 'interrupt' } })
  t.equal(second.json().run.status, 'completed')
  t.equal(second.json().message.content, 'fresh')
  const old = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/runs/${first.run.id}` })).json()
  t.equal(old.status, 'cancelled')
})

t.test('maxSteps ends a run with done max_steps', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [], limits: { maxSteps: 2 } } })).json()
  devModel.script({ toolCalls: [{ name: 'nothing', arguments: {} }] }, { toolCalls: [{ name: 'nothing', arguments: {} }] })
  const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'loop' } })).json()
  t.equal(res.run.steps, 2)
  t.match(res.run.error, { code: 'MAX_STEPS_EXCEEDED', errorType: 'logical' })
  const done = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=done`, headers: { accept: 'application/json' } })).json().data
  t.same(done[0].data, { step: 2, reason: 'max_steps', runId: res.run.id })
})

t.test('reasoning streams as think chunks before the text', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ reasoning: 'let me think', text: 'answer' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'why?' } })
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  const kinds = types(events).filter((type) => type.startsWith('think') || type.startsWith('text'))
  t.equal(kinds[0], 'think_chunk_start')
  t.ok(kinds.indexOf('think_chunk_end') < kinds.indexOf('text_chunk_start'), 'thinking ends before the text starts')
  t.same(events.find((e) => e.type === 'think_chunk_end')?.data, { step: 1, text: 'let me think' })
})

t.test('an idle stream sends a ping comment on its interval', async (t) => {
  const { app } = await buildTestApp(t, { app: { ssePingMs: 50 } })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const res = await readSse(`${base}/v1/sessions/${session.id}/events`, { timeoutMs: 300 })
  t.ok(res.frames.filter((f) => f.comment === 'ping').length >= 2, 'pings keep the connection alive')
})

t.test('a message stored while the active run ends still runs (no lost run)', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'first', delayMs: 50 }, { text: 'second' })
  const first = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'a' } })).json()
  // Storing the second run takes until the first has ended: the session goes idle in between.
  const store = app.agentd.store
  const commit = store.commit
  store.commit = async (writes) => {
    if (writes.some((w) => w.type === 'newRun')) await app.agentd.runs.waitFor(session.id, first.run.id)
    return commit.call(store, writes)
  }
  const second = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'b', onBusy: 'enqueue' } })
  t.equal(second.statusCode, 202)
  const finished = await Promise.race([
    app.agentd.runs.waitFor(session.id, second.json().run.id),
    new Promise((resolve) => setTimeout(() => resolve(null), 3000))
  ])
  t.match(finished, { status: 'completed' }, 'the second run ran')
})

t.test('two interrupting messages sent together are answered in the order accepted; the older gives way to the newer', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  // Only the first run is sure to be running when both interrupts arrive; the older one may be
  // cancelled before or after it starts, depending on when the newer one is accepted.
  devModel.script({ hang: true, afterChunks: 1 }, { text: 'answer' }, { text: 'answer' })
  const first = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: '1' } })).json()
  const [older, newer] = await Promise.all(['2', '3'].map((content) =>
    app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content, onBusy: 'interrupt' } }).then((r) => r.json())))
  const ended = await Promise.all([first, older, newer].map((a) => app.agentd.runs.waitFor(session.id, a.run.id)))
  t.equal(ended[0]?.status, 'cancelled', 'the running one is interrupted')
  t.equal(ended[2]?.status, 'completed', 'the newest runs to its end')
  t.ok(ended[1]?.status === 'cancelled' || ended[1]?.status === 'completed', 'the older one ends before the newer starts')
  const done = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=done`, headers: { accept: 'application/json' } })).json().data
  t.same(done.map((e: StreamedEvent) => e.runId), [first.run.id, older.run.id, newer.run.id], 'done in the order accepted')
})

t.test("messages racing a session's deletion end quietly: 202 or 404, no run left, no error logged", async (t) => {
  const logLines: string[] = []
  const { app, devModel } = await buildTestApp(t, { logLines })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'slow', delayMs: 200 })
  const posts = Array.from({ length: 10 }, (_, i) =>
    app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: String(i), onBusy: 'enqueue' } }))
  const deleted = app.inject({ method: 'DELETE', url: `/v1/sessions/${session.id}` })
  const answers = await Promise.all(posts)
  t.equal((await deleted).statusCode, 204)
  t.ok(answers.every((r) => r.statusCode === 202 || r.statusCode === 404), `every message is accepted or 404: ${answers.map((r) => r.statusCode)}`)
  await new Promise((resolve) => setTimeout(resolve, 300))
  t.equal(app.agentd.runs.activeCount, 0, 'nothing runs for the deleted session')
  const errors = logLines.map((line) => JSON.parse(line) as { level: number; msg: string }).filter((line) => line.level >= 50)
  t.same(errors.map((e) => e.msg), [], 'no error was logged')
})

t.test('a ?wait=true run cancelled by shutdown is answered 503 and its Idempotency-Key is not kept', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ hang: true })
  const waiting = app.inject({
    method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, headers: { 'idempotency-key': 'shutdown-1' }, payload: { content: 'x' }
  })
  while (devModel.requests.length === 0) await new Promise((resolve) => setTimeout(resolve, 5))
  await app.agentd.drain(0)
  const res = await waiting
  t.equal(res.statusCode, 503)
  t.equal(res.json().error.code, 'UNAVAILABLE')
  t.ok(res.headers['retry-after'], 'with Retry-After')
  const claim = await app.agentd.store.claimIdempotency({
    tenant: 'default', key: 'shutdown-1', fingerprint: 'another body', createdAt: new Date().toISOString(), leaseUntil: new Date(Date.now() + 1000).toISOString()
  })
  t.same(claim, { state: 'claimed' }, 'the key is free for the retry after the restart')
})

t.test('the conversation pages with limit and nextCursor, in order, and refuses a cursor it did not give', async (t) => {
  const { app } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  for (const content of ['one', 'two', 'three']) {
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content } })
  }
  const url = `/v1/sessions/${session.id}/messages`
  const whole = (await app.inject({ method: 'GET', url: `${url}?limit=1000` })).json()
  t.equal(whole.data.length, 6, 'three user and three assistant messages')
  t.equal(whole.nextCursor, null, 'one page holds them all')

  const pages: string[][] = []
  let cursor: string | null = null
  do {
    const res: Awaited<ReturnType<typeof app.inject>> = await app.inject({ method: 'GET', url: `${url}?limit=4${cursor ? `&cursor=${cursor}` : ''}` })
    t.equal(res.statusCode, 200)
    const page: { data: Array<{ id: string }>; nextCursor: string | null } = res.json()
    pages.push(page.data.map((m: { id: string }) => m.id))
    cursor = page.nextCursor
  } while (cursor)
  t.same(pages.map((p) => p.length), [4, 2], 'pages of at most limit')
  t.same(pages.flat(), whole.data.map((m: { id: string }) => m.id), 'every message once, in order')
  t.equal((await app.inject({ method: 'GET', url })).json().data.length, 6, 'a default page of 100')

  const other = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const foreign = (await app.inject({ method: 'GET', url: `${url}?limit=1` })).json().nextCursor
  for (const bad of ['nonsense', foreign]) {
    const res = await app.inject({ method: 'GET', url: `/v1/sessions/${other.id}/messages?cursor=${bad}` })
    t.equal(res.statusCode, 400, `cursor ${bad}`)
    t.equal(res.json().error.details.fields[0].field, 'querystring.cursor')
  }
  t.equal((await app.inject({ method: 'GET', url: `${url}?limit=1001` })).statusCode, 400, 'limit is at most 1000')
})

t.test('a run of an idle session calls the model while its admission is committed', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'answer' })
  const before = devModel.requests.length
  const store = app.agentd.store
  const commit = store.commit
  store.commit = async (writes) => {
    const committed = commit.call(store, writes)
    // The run's row is accepted only once the model has its request: a run that waited for its
    // admission before calling the model would never get there, and this test would time out.
    if (writes.some((w) => w.type === 'newRun')) await until(async () => devModel.requests.length > before, 3000, 'the model call')
    return committed
  }
  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hi' } })
  t.equal(res.statusCode, 200)
  t.equal(res.json().run.status, 'completed')
  t.equal(res.json().message?.content, 'answer')
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  t.equal(types(events)[0], 'state_changed', 'the run\'s start is its first event, before its text')
  t.equal(types(events).at(-1), 'done')
})

t.test('a run whose admission fails after its model call went out leaves no trace, and the session takes the next message', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'never stored', delayMs: 100 }, { text: 'second answer' })
  const before = devModel.requests.length
  const store = app.agentd.store
  const commit = store.commit
  let failed = false
  store.commit = async (writes) => {
    if (!failed && writes.some((w) => w.type === 'newRun')) {
      failed = true
      await until(async () => devModel.requests.length > before, 3000, 'the model call')
      throw new Error('disk I/O error')
    }
    return commit.call(store, writes)
  }
  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'first' } })
  t.equal(res.statusCode, 500, 'the client gets the failure')
  t.equal(res.json().error.code, 'INTERNAL')
  await until(async () => app.agentd.runs.activeCount === 0, 3000, 'the run to stop')

  const second = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'second' } })
  t.equal(second.statusCode, 200, 'the session is free for the next message')
  t.equal(second.json().message.content, 'second answer')
  const messages = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data as Array<{ content: string | null }>
  t.same(messages.map((m) => m.content), ['second', 'second answer'], 'nothing of the refused run was stored')
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  const runIds = new Set(events.map((e) => e.runId).filter(Boolean))
  t.same([...runIds], [second.json().run.id], 'every event is the accepted run\'s')
  t.equal(events.filter((e) => e.type === 'done').length, 1)
})

t.test('a streamed message queued behind another run gets its head at once, and its events once it runs', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { approval: { mode: 'always' } } })).json()
  devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }] }, { text: 'listed' }, { text: 'second answer' })
  const paused = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'list' } })).json()
  t.equal(paused.run.status, 'awaiting_approval', 'the first run holds the session')

  // A run's stream holds its head back for its first events, to send them in one write; a run
  // that waits behind another has none, and its client must not wait for the headers meanwhile.
  const began = Date.now()
  const res = await request(`${base}/v1/sessions/${session.id}/messages`, {
    method: 'POST', headers: { accept: 'text/event-stream', 'content-type': 'application/json' },
    body: JSON.stringify({ content: 'then this', onBusy: 'enqueue' })
  })
  t.equal(res.statusCode, 200)
  const reader = res.body[Symbol.asyncIterator]()
  const first = await reader.next()
  t.equal(String(first.value), 'retry: 2000\n\n', 'the head and the retry frame come alone')
  t.ok(Date.now() - began < 1000, `within ${Date.now() - began} ms, while the run is queued`)

  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/approvals/${paused.pendingCall.id}`, payload: { decision: 'allow' } })
  let text = ''
  for (let chunk = await reader.next(); !chunk.done; chunk = await reader.next()) text += String(chunk.value)
  const events = parseFrames(text).frames.map((f) => JSON.parse(f.data ?? '{}') as StreamedEvent)
  t.equal(events[0]?.type, 'state_changed', 'its events follow once it runs')
  t.same(events[0]?.data, { from: 'queued', to: 'running' })
  t.equal(events.filter((e) => e.type === 'text_chunk').map((e) => e.data.delta).join(''), 'second answer')
  t.equal(events.at(-1)?.type, 'done', 'and the stream ends with its done')
  t.ok(events.every((e) => e.runId === events[0]?.runId && e.runId !== paused.run.id), 'all of them the queued run\'s')
})

t.test('while draining, an interrupt still stops a run (the drain then ends sooner) and /metrics still answers', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ hang: true })
  const accepted = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'x' } })
  while (devModel.requests.length === 0) await new Promise((resolve) => setTimeout(resolve, 5))
  const started = Date.now()
  const drained = app.agentd.drain(30_000)
  const refused = await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })
  t.equal(refused.statusCode, 503, 'new work is refused')
  const metrics = await app.inject({ method: 'GET', url: '/metrics' })
  t.equal(metrics.statusCode, 200, 'the last scrape gets its figures')
  t.match(metrics.body, /agentd_runs_active/)
  const interrupted = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/interrupt` })
  t.equal(interrupted.statusCode, 202)
  t.equal(interrupted.json().id, accepted.json().run.id)
  t.equal(interrupted.json().status, 'cancelled')
  await drained
  t.ok(Date.now() - started < 10_000, 'the drain did not wait out its grace period')
})
