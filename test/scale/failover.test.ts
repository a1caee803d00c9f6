import t from 'tap'
import pg from 'pg'
import { startCluster } from '../helpers/cluster.ts'

const LEASE_MS = 1500

t.test('kill -9 the owner of a run: another process recovers it within the lease, the queue goes on', async (t) => {
  const cluster = await startCluster(t, 2, { AGENTD_RUN_LEASE_MS: String(LEASE_MS) })
  const [a, b] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel, eventOf } = cluster
  const spec = { type: 'client', name: 'ask', description: 'Ask the user', parameters: { type: 'object' } }
  const session = (await api(a, 'POST', '/v1/sessions', { tools: [spec] })).json

  devModel.script({ toolCalls: [{ name: 'ask', arguments: {} }] })
  const first = (await api(b, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'ask me' })).json.run
  const required = await eventOf(a, session.id, (e) => e.type === 'tool_result_required')
  // A request that waits for its (queued) run on B, under an Idempotency-Key: it dies with B.
  const key = { 'idempotency-key': 'retry-after-crash' }
  const body = { content: 'second', onBusy: 'enqueue' }
  const dying = fetch(`${b.url}/v1/sessions/${session.id}/messages?wait=true`, {
    method: 'POST', headers: { 'content-type': 'application/json', ...key }, body: JSON.stringify(body)
  }).catch((err: unknown) => err)
  await new Promise((r) => setTimeout(r, 300))

  b.child.kill('SIGKILL')
  const killedAt = Date.now()
  await b.exited
  t.type(await dying, Error, "the waiting request died with B")
  const early = await api(a, 'POST', `/v1/sessions/${session.id}/messages?wait=true`, body, key)
  t.equal(early.status, 409, 'while its lease holds, the claim of the dead request still answers 409')
  t.equal(early.json.error.code, 'IDEMPOTENCY_IN_PROGRESS')

  devModel.script({ text: 'queued one ran' }, { text: 'retried one ran' })
  const recovered = await eventOf(a, session.id, (e) => e.type === 'run_recovered' && e.runId === first.id, LEASE_MS + 8000, 'run_recovered')
  const tookMs = Date.now() - killedAt
  t.ok(tookMs < LEASE_MS + 5000, `recovered ${tookMs} ms after the kill (lease ${LEASE_MS} ms)`)
  t.match(recovered.data, { runId: first.id, previousStatus: 'awaiting_tool_result', sealedCalls: [required.data.call.id] })
  const done = await eventOf(a, session.id, (e) => e.type === 'done' && e.runId === first.id)
  t.equal(done.data.reason, 'failed')
  t.equal((await api(a, 'GET', `/v1/sessions/${session.id}/runs/${first.id}`)).json.status, 'failed')
  const messages = (await api(a, 'GET', `/v1/sessions/${session.id}/messages`)).json.data
  t.ok(messages.some((m: any) => m.role === 'tool' && m.toolCallId === required.data.call.id), 'the open call got a sealed result')

  // Once the dead claim's lease has passed, the retry is processed (here: on A).
  await new Promise((r) => setTimeout(r, Math.max(0, killedAt + LEASE_MS + 200 - Date.now())))
  const retried = await api(a, 'POST', `/v1/sessions/${session.id}/messages?wait=true`, body, key)
  t.equal(retried.status, 200)
  t.equal(retried.json.run.status, 'completed')
  const events = await cluster.events(a, session.id)
  const dones = events.filter((e) => e.type === 'done')
  t.same(dones.map((e) => e.data.reason), ['failed', 'completed', 'completed'], 'the queued run went on after the recovery, then the retry')
  t.same(events.map((e) => e.seq), events.map((_, i) => i + 1), 'seq gap-free')

  t.test('a process that starts again disturbs no live run', async (t) => {
    devModel.script({ text: 'a long answer', delayMs: 2500 })
    const live = (await api(a, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'long' })).json.run
    await eventOf(a, session.id, (e) => e.runId === live.id && e.type === 'state_changed' && e.data.to === 'running')
    const restarted = await cluster.start()
    t.equal((await api(restarted, 'GET', '/readyz')).status, 200)
    const liveDone = await eventOf(restarted, session.id, (e) => e.type === 'done' && e.runId === live.id)
    t.equal(liveDone.data.reason, 'completed')
    const all = await cluster.events(a, session.id)
    t.notOk(all.some((e) => e.type === 'run_recovered' && e.runId === live.id), 'the live run was not taken over')
  })
})

t.test('a queued run whose admitting process died before claiming it is run by another, after a heartbeat', async (t) => {
  const cluster = await startCluster(t, 1, { AGENTD_RUN_LEASE_MS: String(LEASE_MS) })
  const [a] = cluster.servers as [typeof cluster.servers[0]]
  const session = (await cluster.api(a, 'POST', '/v1/sessions', { tools: [] })).json
  cluster.devModel.script({ text: 'picked up' })
  // The row an admission writes, by a process that died before it could claim (or announce) it.
  const db = new pg.Client({ connectionString: cluster.env.DATABASE_URL })
  await db.connect()
  t.teardown(() => db.end())
  const admittedAt = Date.now()
  await db.query(`INSERT INTO runs (id, session_id, tenant, status, request_id, steps, usage, error, message_id, input, created_at)
    VALUES ('run_orphanqueued', $1, 'default', 'queued', 'req_gone', 0, '{}', 'null', 'msg_orphanqueued', 'hello', $2)`,
  [session.id, new Date(admittedAt).toISOString()])
  const done = await cluster.eventOf(a, session.id, (e) => e.type === 'done' && e.runId === 'run_orphanqueued', 10_000, 'the orphaned queued run done')
  t.equal(done.data.reason, 'completed')
  const tookMs = Date.now() - admittedAt
  // Offered once it is a beat old (a third of the lease), on a beat: within two beats and some.
  t.ok(tookMs >= LEASE_MS / 3, `not offered while its admitting process could still claim it (${tookMs} ms)`)
  t.ok(tookMs < LEASE_MS + 2000, `run ${tookMs} ms after it was admitted`)
  const messages = (await cluster.api(a, 'GET', `/v1/sessions/${session.id}/messages`)).json.data
  t.same(messages.map((m: { role: string; content: string }) => [m.role, m.content]), [['user', 'hello'], ['assistant', 'picked up']])
})
