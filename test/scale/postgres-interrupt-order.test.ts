import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { buildTestApp } from '../helpers/app.ts'
import { startCluster } from '../helpers/cluster.ts'
import { schemaUrl, withSchema } from '../helpers/postgres.ts'
import type { StreamedEvent } from '../helpers/sse.ts'

// Runs are answered in the order they were accepted (RunCoordinator.admit): a message sent with
// onBusy "interrupt" stops the active run and the queued ones end as cancelled when their turn
// comes, as on SQLite. On PostgreSQL the queued run was recorded cancelled at once, its `done`
// coming before the `done` of the run accepted before it, which was still stopping.
t.test('an interrupting message on PostgreSQL: every run before it ends, in the order accepted, then it runs', async (t) => {
  const schema = await withSchema(t)
  const { app, devModel } = await buildTestApp(t, { env: { DATABASE_URL: schemaUrl(schema) } })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const post = async (content: string, onBusy?: string) =>
    (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content, ...(onBusy ? { onBusy } : {}) } })).json()
  const events = async (): Promise<StreamedEvent[]> =>
    (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data

  devModel.script({ hang: true, afterChunks: 1 }, { text: 'fresh' })
  const running = await post('one')
  while (!(await events()).some((e) => e.type === 'text_chunk')) await sleep(10)
  const queued = await post('two', 'enqueue')
  const interrupting = await post('three', 'interrupt')
  const ended = await Promise.all([running, queued, interrupting].map((a) => app.agentd.runs.waitFor(session.id, a.run.id)))
  t.same(ended.map((run) => run?.status), ['cancelled', 'cancelled', 'completed'])

  const done = (await events()).filter((e) => e.type === 'done')
  t.same(done.map((e) => [e.runId, e.data.reason]), [
    [running.run.id, 'interrupted'], [queued.run.id, 'interrupted'], [interrupting.run.id, 'completed']
  ], 'done in the order the runs were accepted')
})

t.test('the same across processes: the run on A, the queued and the interrupting message sent through B', async (t) => {
  const cluster = await startCluster(t, 2)
  const [a, b] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel, eventOf, events } = cluster
  const session = (await api(a, 'POST', '/v1/sessions', { tools: [] })).json
  devModel.script({ hang: true, afterChunks: 1 }, { text: 'fresh' })
  const running = (await api(a, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'one' })).json
  await eventOf(b, session.id, (e) => e.type === 'text_chunk', 10_000, 'the first run streaming')
  const queued = (await api(b, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'two', onBusy: 'enqueue' })).json
  const interrupting = (await api(b, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'three', onBusy: 'interrupt' })).json
  await eventOf(a, session.id, (e) => e.type === 'done' && e.runId === interrupting.run.id, 10_000, 'the interrupting run done')
  const done = (await events(a, session.id)).filter((e) => e.type === 'done')
  t.same(done.map((e) => [e.runId, e.data.reason]), [
    [running.run.id, 'interrupted'], [queued.run.id, 'interrupted'], [interrupting.run.id, 'completed']
  ], 'done in the order the runs were accepted')
})
