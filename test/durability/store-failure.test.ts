import t from 'tap'
import { buildTestApp } from '../helpers/app.ts'
import type { StreamedEvent } from '../helpers/sse.ts'

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
