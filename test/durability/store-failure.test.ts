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
  t.match(ready.json().error.details.store, /commit\(.*message\): disk I\/O error/)
  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200, 'the process is alive')

  failing = false
  devModel.script({ text: 'stored now' })
  const next = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'y' } })).json()
  t.equal(next.run.status, 'completed', 'the session works once the store does')
  t.equal((await app.inject({ method: 'GET', url: '/readyz' })).statusCode, 200, 'and readiness recovers')
})
