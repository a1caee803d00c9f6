import { join } from 'node:path'
import pg from 'pg'
import t from 'tap'
import { startDevModel } from '../../src/model/dev-model.ts'
import { tempDir } from '../helpers/app.ts'
import { startCluster } from '../helpers/cluster.ts'
import { schemaUrl, withSchema } from '../helpers/postgres.ts'
import { startServer, until } from '../helpers/server-process.ts'

// On SQLite a drain cancels the queued runs (no other process would run them), and a ?wait=true
// request waiting for one is answered 503. On PostgreSQL they stay queued for the other processes
// (or the next start): such a request waited for good, held the drain past its grace until the
// process was killed (exit 1), and its client saw the connection drop.
t.test('SIGTERM on PostgreSQL: a ?wait=true request for a run left queued is answered 202, and the process exits 0', async (t) => {
  const devModel = await startDevModel({ host: '127.0.0.1', port: 0 })
  t.teardown(() => devModel.close())
  const dir = tempDir(t)
  const databaseUrl = schemaUrl(await withSchema(t))
  const env = {
    DATABASE_URL: databaseUrl, AGENTD_WORKSPACES: join(dir, 'ws'), OPENAI_BASE_URL: devModel.url, OPENAI_API_KEY: 'x',
    AGENTD_SHUTDOWN_GRACE_MS: '500', AGENTD_RUN_LEASE_MS: '1500'
  }
  const server = await startServer(env, 30_000)
  t.teardown(() => server.child.kill('SIGKILL'))
  const post = (base: string, path: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) })

  const session = (await (await post(server.url, '/v1/sessions', { tools: [] })).json()) as { id: string }
  devModel.script({ hang: true })
  await post(server.url, `/v1/sessions/${session.id}/messages`, { content: 'hang' })
  await until(async () => devModel.requests.length >= 1, 5000, 'the first model call')
  const key = { 'idempotency-key': 'queued-at-shutdown' }
  const body = { content: 'after it', onBusy: 'enqueue' }
  const waiting = post(server.url, `/v1/sessions/${session.id}/messages?wait=true`, body, key)
    .then(async (res) => ({ status: res.status, json: await res.json() as any }), (err: Error) => err)
  // Its run is admitted (queued behind the hanging one) before the signal: the client cannot see
  // a queued run until its POST is answered, so the test reads the table. A fixed 300 ms sleep here
  // let a loaded machine send SIGTERM before the request had been read.
  const db = new pg.Client({ connectionString: databaseUrl })
  await db.connect()
  t.teardown(() => db.end())
  await until(async () => (await db.query(`SELECT 1 FROM runs WHERE session_id = $1 AND status = 'queued'`, [session.id])).rowCount,
    10_000, 'the second run to be admitted')

  server.child.kill('SIGTERM')
  const answer = await waiting
  t.match(answer, { status: 202, json: { message: { content: 'after it' }, run: { status: 'queued' } } },
    'accepted, its run left queued for another process (the connection was dropped)')
  t.equal((await server.exited).code, 0, 'the drain ends within its grace (it was killed, exit 1)')

  // The run is answered by the next process, and the same request again is the same answer, not a second run.
  devModel.script({ text: 'answered later' })
  const next = await startServer(env, 30_000)
  t.teardown(() => next.child.kill('SIGKILL'))
  const runId = (answer as { json: { run: { id: string } } }).json.run.id
  const run = await until(async () => {
    const stored = (await (await fetch(`${next.url}/v1/sessions/${session.id}/runs/${runId}`)).json()) as { status: string }
    return stored.status === 'completed' ? stored : undefined
  }, 10_000, 'the queued run to complete')
  t.equal(run.status, 'completed')
  const again = await post(next.url, `/v1/sessions/${session.id}/messages?wait=true`, body, key)
  t.equal(again.status, 202)
  t.equal(((await again.json()) as { run: { id: string } }).run.id, runId, 'the retry is answered with the same run')
})

// A run admitted through A may execute on B (B claims the session's next run when its own ends).
// When B shuts down and cancels it, the ?wait=true request on A was answered 200 with the run
// cancelled, and kept so under its Idempotency-Key: every retry got the cancellation again. On
// SQLite the process that shuts down is the one that answers: 503, not kept, and the retry runs.
t.test('a ?wait=true request on A whose run B cancels as B shuts down is answered 503, and its retry runs', async (t) => {
  const cluster = await startCluster(t, 2, { AGENTD_SHUTDOWN_GRACE_MS: '300' })
  const [a, b] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel, eventOf } = cluster
  const session = (await api(a, 'POST', '/v1/sessions', { tools: [] })).json
  devModel.script({ text: 'one', delayMs: 500 }, { hang: true })
  const first = (await api(b, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'first' })).json
  const key = { 'idempotency-key': 'peer-shutdown' }
  const body = { content: 'second', onBusy: 'enqueue' }
  const waiting = api(a, 'POST', `/v1/sessions/${session.id}/messages?wait=true`, body, key)
  const started = await eventOf(a, session.id, (e) => e.type === 'state_changed' && e.runId !== first.run.id && e.data.to === 'running', 10_000, 'the second run on B')

  b.child.kill('SIGTERM')
  const answer = await waiting
  t.equal(answer.status, 503, 'the service went away: not the client\'s answer (it was 200, the run cancelled)')
  t.match(answer.json.error, { code: 'UNAVAILABLE', details: { runId: started.runId } })
  t.match((await api(a, 'GET', `/v1/sessions/${session.id}/runs/${started.runId}`)).json, {
    status: 'cancelled', error: { code: 'SERVICE_SHUTDOWN', errorType: 'aborted' }
  }, 'the run says why it was cancelled')
  devModel.script({ text: 'second, again' })
  const retried = await api(a, 'POST', `/v1/sessions/${session.id}/messages?wait=true`, body, key)
  t.equal(retried.status, 200, 'the retry with the same key is processed')
  t.equal(retried.json.run.status, 'completed')
})
