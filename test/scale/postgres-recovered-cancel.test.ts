import pg from 'pg'
import t from 'tap'
import { buildTestApp } from '../helpers/app.ts'
import { schemaUrl, withSchema } from '../helpers/postgres.ts'
import { until } from '../helpers/server-process.ts'
import type { StreamedEvent } from '../helpers/sse.ts'

// A queued run that a later message interrupted is flagged where it waits (cancel_requested) and
// ends as cancelled when its turn comes. The recovery that took it over from a process that died
// right after claiming it cleared the flag and queued it again: it ran as if never interrupted.
t.test('a queued run that a later message interrupted still ends as cancelled after its claimer died and the recovery took it over', async (t) => {
  const schema = await withSchema(t)
  const { app, devModel } = await buildTestApp(t, { env: { DATABASE_URL: schemaUrl(schema), AGENTD_RUN_LEASE_MS: '600' } })
  const db = new pg.Client({ connectionString: schemaUrl(schema) })
  await db.connect()
  t.teardown(() => db.end())
  const ask = { type: 'client', name: 'ask', description: 'Ask the user', parameters: { type: 'object' } }
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [ask] } })).json()
  const post = async (content: string, onBusy?: string) =>
    (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content, ...(onBusy ? { onBusy } : {}) } })).json()
  const events = async (): Promise<StreamedEvent[]> =>
    (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data

  devModel.script({ toolCalls: [{ name: 'ask', arguments: {} }] }, { text: 'the answer' })
  const running = await post('one')
  await until(async () => (await events()).some((e) => e.type === 'tool_result_required'), 5000, 'the first run waiting on its client')
  const queued = await post('two', 'enqueue')
  // The queued run as a process leaves it that claimed it and died before it could end it: the
  // claim is in the row, its lease alive for now.
  await db.query(`UPDATE runs SET owner = 'own_gone', lease_until = now() + interval '1 hour' WHERE id = $1`, [queued.run.id])
  const interrupting = await post('three', 'interrupt')
  t.equal((await app.agentd.runs.waitFor(session.id, running.run.id))?.status, 'cancelled', 'the active run stops')
  // The dead claimer's lease lapses: the recovery takes the queued run over.
  await db.query('UPDATE runs SET lease_until = now() - interval \'1 second\' WHERE id = $1', [queued.run.id])
  const ended = await Promise.all([queued, interrupting].map((a) => app.agentd.runs.waitFor(session.id, a.run.id)))
  t.same(ended.map((run) => run?.status), ['cancelled', 'completed'], 'the interrupted run ends cancelled, the interrupting one runs')

  const all = await events()
  t.same(all.filter((e) => e.runId === queued.run.id).map((e) => [e.type, e.data.previousStatus ?? e.data.reason]), [
    ['run_recovered', 'queued'], ['done', 'interrupted']
  ], 'the queued run is recovered, then ends without starting')
  t.same(all.filter((e) => e.type === 'done').map((e) => e.runId), [running.run.id, queued.run.id, interrupting.run.id], 'done in the order the runs were accepted')
  t.equal(devModel.requests.length, 2, 'the model heard from the first run and the interrupting one only')
})
