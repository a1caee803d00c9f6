import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { until } from '../helpers/server-process.ts'
import { readSse, type StreamedEvent } from '../helpers/sse.ts'
import { fullDisk } from '../helpers/store-faults.ts'

t.test('a failing store write ends the run as failed, reports it, and the service goes on', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const store = app.agentd.store
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const original = store.commit
  let failing = true
  store.commit = async (writes) => {
    if (failing && writes.some((w) => w.type === 'message' && w.message.role === 'assistant')) throw new Error('disk I/O error')
    return original.call(store, writes)
  }
  devModel.script({ text: 'never stored' })
  const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'x' } })).json()
  t.equal(res.run.status, 'failed')
  t.match(res.run.error, { errorType: 'exception', fatal: true })
  t.notMatch(JSON.stringify(res.run.error), /disk I\/O/, "the store's own error text stays in the logs")
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  t.match(events.find((e) => e.type === 'error')?.data, { severity: 'error', phase: 'system', detail: { errorType: 'exception' } })
  t.equal(events.at(-1)?.type, 'done')
  t.equal(events.at(-1)?.data.reason, 'failed')

  const ready = await app.inject({ method: 'GET', url: '/readyz' })
  t.equal(ready.statusCode, 503, '/readyz reports the failure')
  t.match(ready.json().error.details.store, /commit\(.*message.*\): disk I\/O error/)
  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200, 'the process is alive')

  failing = false
  devModel.script({ text: 'stored now' })
  const next = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'y' } })).json()
  t.equal(next.run.status, 'completed', 'the session works once the store does')
  t.equal((await app.inject({ method: 'GET', url: '/readyz' })).statusCode, 200, 'and readiness recovers')
})

/**
 * The run's start and a tool's answer are committed while the run goes on (the model call goes
 * out meanwhile). When such a unit fails, the run fails at its next commit: nothing the model
 * said after it is stored, and the history stays whole.
 */
t.test("a run's end that was committed though its answer was lost (the connection dropped) is not ended a second time", async (t) => {
  // Before, the run took the lost answer for a failed commit and ended again: two done events,
  // the second 'failed', and the stored status 'failed' under a done that said 'completed'.
  const { app, devModel } = await buildTestApp(t)
  const store = app.agentd.store
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const original = store.commit
  let lost = 0
  store.commit = async (writes) => {
    const ends = writes.some((w) => w.type === 'event' && w.event.type === 'done')
    const committed = await original.call(store, writes)
    if (ends && lost++ === 0) throw Object.assign(new Error('Connection terminated unexpectedly'), { code: 'ECONNRESET' })
    return committed
  }
  devModel.script({ text: 'stored once' })
  const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'x' } })).json()
  t.equal(res.run.status, 'completed')
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  t.same(events.filter((e) => e.type === 'done').map((e) => e.data.reason), ['completed'], 'one done')
  t.notOk(events.some((e) => e.type === 'error'), 'no error event')
  t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/runs/${res.run.id}` })).json().status, 'completed')
  t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().status, 'idle')
})

t.test('a unit committed while the run goes on fails the run before anything later is stored', async (t) => {
  const failOnce = (app: Awaited<ReturnType<typeof buildTestApp>>['app'], role: 'user' | 'tool') => {
    const store = app.agentd.store
    const original = store.commit
    let failed = false
    store.commit = async (writes) => {
      if (!failed && writes.some((w) => w.type === 'message' && w.message.role === role)) {
        failed = true
        throw new Error('disk I/O error')
      }
      return original.call(store, writes)
    }
  }
  const roles = async (app: Awaited<ReturnType<typeof buildTestApp>>['app'], sessionId: string) =>
    ((await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/messages` })).json().data as Array<{ role: string }>).map((m) => m.role)
  const lastEvents = async (app: Awaited<ReturnType<typeof buildTestApp>>['app'], sessionId: string) =>
    ((await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[])

  t.test("the run's start (its user message)", async (t) => {
    const { app, devModel } = await buildTestApp(t)
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
    failOnce(app, 'user')
    devModel.script({ text: 'an answer to a message that was never stored' })
    const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'x' } })).json()
    t.equal(res.run.status, 'failed')
    t.match(res.run.error, { errorType: 'exception', fatal: true })
    t.same(await roles(app, session.id), [], 'no answer without its question')
    const events = await lastEvents(app, session.id)
    t.notOk(events.some((e) => e.type === 'token_usage'), 'nothing of the model call is stored')
    t.match(events.at(-1), { type: 'done', data: { reason: 'failed' } })

    devModel.script({ text: 'stored now' })
    const next = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'y' } })).json()
    t.equal(next.run.status, 'completed', 'the session works once the store does')
    t.same(await roles(app, session.id), ['user', 'assistant'])
  })

  t.test("a tool's answer", async (t) => {
    const { app, devModel } = await buildTestApp(t)
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['fs_write'] } })).json()
    failOnce(app, 'tool')
    devModel.script({ toolCalls: [{ name: 'fs_write', arguments: { path: 'a.txt', content: 'x' } }] as never }, { text: 'an answer built on a result that was never stored' })
    const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'x' } })).json()
    t.equal(res.run.status, 'failed')
    t.same(await roles(app, session.id), ['user', 'assistant', 'tool'], 'the call is answered (sealed), the later answer is not stored')
    const calls = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json().data
    t.match(calls, [{ name: 'fs_write', state: 'sealed' }])
    const events = await lastEvents(app, session.id)
    t.equal(events.filter((e) => e.type === 'token_usage').length, 1, "the second model call's step is not stored")
    t.match(events.at(-1), { type: 'done', data: { reason: 'failed' } })
  })

  // A read-only tool's start is committed with its answer, as one unit: that unit fails whole.
  t.test("a read-only tool's start and answer", async (t) => {
    const { app, devModel } = await buildTestApp(t)
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['fs_list'] } })).json()
    failOnce(app, 'tool')
    devModel.script({ toolCalls: [{ name: 'fs_list', arguments: {} }] as never }, { text: 'an answer built on a result that was never stored' })
    const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'x' } })).json()
    t.equal(res.run.status, 'failed')
    t.same(await roles(app, session.id), ['user'], 'neither the call nor its answer is stored, nor anything after them')
    t.same((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json().data, [])
    const events = await lastEvents(app, session.id)
    t.notOk(events.some((e) => e.type === 'token_usage' || e.type.startsWith('tool')), 'no event of the step either')
    t.match(events.at(-1), { type: 'done', data: { reason: 'failed' } })

    devModel.script({ toolCalls: [{ name: 'fs_list', arguments: {} }] as never }, { text: 'listed' })
    const next = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'y' } })).json()
    t.equal(next.run.status, 'completed', 'the session works once the store does')
    t.same(await roles(app, session.id), ['user', 'user', 'assistant', 'tool', 'assistant'])
  })
})

/**
 * A store that cannot write for a while (a full disk): requests answer 503 meanwhile, and a run
 * whose end cannot be recorded is not let go as if it had ended. Its session stays busy and its
 * stream open until the store writes again; then the recovery ends it (run_recovered, done) and
 * everything goes on. Nothing is left running in the store, and no stream waits forever.
 */
t.test("the log lines of a queued run whose cancellation the store could not record carry the run's request ID", async (t) => {
  const logLines: string[] = []
  const { app, devModel } = await buildTestApp(t, { logLines })
  const disk = fullDisk(app.agentd.store)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'slow', delayMs: 300 })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'a' }, headers: { 'x-request-id': 'first-req' } })
  const queued = await app.inject({
    method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'b', onBusy: 'enqueue' }, headers: { 'x-request-id': 'queued-req' }
  })
  t.equal(queued.statusCode, 202)
  disk.full = true
  await app.agentd.drain(0)
  disk.full = false

  const lines = logLines.map((line) => JSON.parse(line)).filter((line) => line.runId === queued.json().run.id)
  t.ok(lines.some((line) => line.msg === 'could not record a cancelled queued run'), 'the failure is logged')
  t.same(lines.filter((line) => line.reqId !== 'queued-req').map((line) => line.msg), [], 'every line of the run has its request ID')
})

t.test('a full disk: 503s meanwhile, and each run is ended once the store writes again', async (t) => {
  const sessionEvents = async (app: Awaited<ReturnType<typeof buildTestApp>>['app'], sessionId: string) =>
    (await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]

  t.test('a run streaming when the disk fills', async (t) => {
    const logLines: string[] = []
    const { app, devModel } = await buildTestApp(t, { logLines })
    const url = await listen(app)
    const disk = fullDisk(app.agentd.store)
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
    devModel.script({ text: 'an answer that comes too late', delayMs: 400 })
    const streaming = readSse(`${url}/v1/sessions/${session.id}/messages`, { method: 'POST', body: { content: 'x' }, timeoutMs: 20_000 })
    await until(async () => (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().status === 'running', 5000, 'the run started')
    disk.full = true

    const created = await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })
    t.equal(created.statusCode, 503, 'a new session: 503, not 500')
    t.match(created.json().error, { code: 'UNAVAILABLE', retryable: true, message: 'The store cannot write now' })
    t.equal(created.headers['retry-after'], '1')
    await until(async () => logLines.some((line) => line.includes('could not record the end of the run')), 5000, 'the run failed to record its end')
    const ready = await app.inject({ method: 'GET', url: '/readyz' })
    t.equal(ready.statusCode, 503)
    t.match(ready.json().error.details.store, /database or disk is full/)
    const runId = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json()
    t.equal(runId.status, 'running', 'the store still has the session running')
    const busy = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'y' } })
    t.equal(busy.statusCode, 409, 'and the session stays busy: its run has not ended as far as anyone can read')
    t.equal(busy.json().error.code, 'SESSION_BUSY')
    const queued = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'y', onBusy: 'enqueue' } })
    t.equal(queued.statusCode, 503, 'a message that would be queued cannot be stored either')

    disk.full = false
    const stream = await streaming
    t.ok(stream.endedByServer, 'the stream ended once the run did')
    const ended = stream.events.slice(-4).map((e) => e.type)
    t.same(ended, ['run_recovered', 'error', 'state_changed', 'done'])
    t.match(stream.events.at(-1)?.data, { reason: 'failed' })
    t.match(stream.events.at(-4)?.data, { previousStatus: 'running', sealedCalls: [] })
    const run = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/runs/${stream.events.at(-1)?.runId}` })).json()
    t.match(run, { status: 'failed', error: { errorType: 'exception', message: /ended by recovery/ } })
    t.equal((await app.inject({ method: 'GET', url: '/readyz' })).statusCode, 200, 'readiness is back with the first write')

    devModel.script({ text: 'stored now' })
    const next = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'z' } })).json()
    t.equal(next.run.status, 'completed', 'the session goes on')
    const events = await sessionEvents(app, session.id)
    t.same(events.map((e) => e.seq), events.map((_, i) => i + 1), 'seq gap-free')
    t.equal(events.filter((e) => e.type === 'done').length, 2, 'one done per run')
  })

  t.test('a run whose start could not be stored runs again once it can', async (t) => {
    const { app, devModel } = await buildTestApp(t)
    const url = await listen(app)
    // The run is admitted (its row stored), then nothing of it can be: not its start, not its end.
    const disk = fullDisk(app.agentd.store, (writes) => writes.every((w) => w.type === 'newRun'))
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
    devModel.script({ text: 'lost', delayMs: 300 }, { text: 'the answer' })
    disk.full = true
    const streaming = readSse(`${url}/v1/sessions/${session.id}/messages`, { method: 'POST', body: { content: 'x' }, timeoutMs: 20_000 })
    await until(async () => devModel.requests.length >= 1, 5000, 'the model was asked')
    await new Promise((resolve) => setTimeout(resolve, 800))
    t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().status, 'idle', 'nothing of the run is stored')
    disk.full = false

    const stream = await streaming
    t.ok(stream.endedByServer)
    t.same(stream.events.filter((e) => e.type === 'run_recovered').map((e) => e.data.previousStatus), ['queued'], 'taken up again as a queued run')
    t.match(stream.events.at(-1), { type: 'done', data: { reason: 'completed' } })
    const messages = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data as Array<{ role: string; content: string }>
    t.same(messages.map((m) => [m.role, m.content]), [['user', 'x'], ['assistant', 'the answer']], 'the question once, and its answer')
  })
})
