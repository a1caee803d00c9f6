import pg from 'pg'
import t from 'tap'
import type { TapTest } from '../helpers/app.ts'
import { startCluster } from '../helpers/cluster.ts'
import { postgresUrl } from '../helpers/postgres.ts'
import type { StreamedEvent } from '../helpers/sse.ts'

const LEASE_MS = 1500

/**
 * Three processes on one PostgreSQL, many sessions with runs queued behind each other, messages
 * posted through every process, and one process killed with SIGKILL in the middle of it all.
 * Whatever each run's fate, the invariants hold for every session: each run accepted ends exactly
 * once (one done, its stored status final and the same as done says), its events are gap-free,
 * and the session is idle again; the survivors take over what the dead process held.
 */
type Cluster = Awaited<ReturnType<typeof startCluster>>

/** Sessions with runs queued through every process, `disrupt` in the middle; then the invariants, read through A and B. */
async function underLoad(t: TapTest, disrupt: (cluster: Cluster) => Promise<void>): Promise<void> {
  const cluster = await startCluster(t, 3, { AGENTD_RUN_LEASE_MS: String(LEASE_MS) })
  const { servers, api, devModel, events, until } = cluster
  const [a, b] = servers as [typeof servers[0], typeof servers[0]]
  devModel.script(...Array.from({ length: 200 }, (_, i) => ({ text: `answer number ${i} in a few words`, delayMs: 150 })))
  const sessions: string[] = []
  for (let i = 0; i < 18; i++) sessions.push((await api(servers[i % 3] as typeof a, 'POST', '/v1/sessions', { tools: [] })).json.id)

  // Three messages a session, each through another process; the first two before the kill.
  const accepted = new Map<string, string[]>(sessions.map((id) => [id, []]))
  const post = async (round: number) => Promise.all(sessions.map(async (id, i) => {
    const server = servers[(i + round) % 3] as typeof a
    const res = await api(server, 'POST', `/v1/sessions/${id}/messages`, { content: `message ${round}`, onBusy: 'enqueue' }).catch(() => null)
    if (res?.status === 202) accepted.get(id)?.push(res.json.run.id)
  }))
  await post(0)
  await post(1)
  await new Promise((r) => setTimeout(r, 200))
  await disrupt(cluster)
  const [, , c] = servers as [typeof a, typeof a, typeof a]
  const watched = c.child.exitCode === null && c.child.signalCode === null ? [a, b, c] : [a, b]
  // Through A and B only, now.
  await Promise.all(sessions.map(async (id, i) => {
    const res = await api(i % 2 === 0 ? a : b, 'POST', `/v1/sessions/${id}/messages`, { content: 'message 2', onBusy: 'enqueue' })
    if (res.status === 202) accepted.get(id)?.push(res.json.run.id)
  }))

  const total = [...accepted.values()].reduce((n, runs) => n + runs.length, 0)
  t.ok(total >= sessions.length * 2, `${total} runs accepted`)
  const dones = async (id: string) => (await events(a, id)).filter((e) => e.type === 'done')
  await until(async () => {
    for (const id of sessions) if ((await dones(id)).length < (accepted.get(id)?.length ?? 0)) return false
    return true
  }, LEASE_MS + 20_000, 'every accepted run done')

  const reasons: Record<string, number> = {}
  for (const id of sessions) {
    const all: StreamedEvent[] = await events(b, id)
    t.same(all.map((e) => e.seq), all.map((_, i) => i + 1), `${id}: seq gap-free`)
    const runs = accepted.get(id) ?? []
    for (const runId of runs) {
      const ends = all.filter((e) => e.type === 'done' && e.runId === runId)
      t.equal(ends.length, 1, `${runId}: one done`)
      const reason = ends[0]?.data.reason as string
      reasons[reason] = (reasons[reason] ?? 0) + 1
      const stored = (await api(a, 'GET', `/v1/sessions/${id}/runs/${runId}`)).json
      t.equal(stored.status, reason === 'completed' ? 'completed' : 'failed', `${runId}: stored as done says`)
    }
    t.equal((await api(b, 'GET', `/v1/sessions/${id}`)).json.status, 'idle', `${id}: idle again`)
  }
  t.ok((reasons.completed ?? 0) > 0, `runs completed: ${JSON.stringify(reasons)}`)
  for (const server of watched) {
    t.equal(server.child.exitCode, null, `${server.url} is still up${server.child.exitCode === null ? '' : `: ${server.stderr().slice(-2000)} ${server.lines.slice(-5).join('\n')}`}`)
  }
}

t.test('kill -9 one of three processes under load: every accepted run ends exactly once, nothing stuck', async (t) => {
  await underLoad(t, async ({ servers }) => {
    const c = servers[2] as Cluster['servers'][0]
    c.child.kill('SIGKILL')
    await c.exited
  })
})

t.test('every database connection of every process dropped under load: the same', async (t) => {
  await underLoad(t, async ({ env }) => {
    const admin = new pg.Client({ connectionString: postgresUrl })
    await admin.connect()
    try {
      const schema = new URL(env.DATABASE_URL ?? '').searchParams.get('application_name')
      const { rows } = await admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1', [schema])
      t.ok(rows.length >= 3, `${rows.length} connections dropped`)
    } finally {
      await admin.end()
    }
  })
})
