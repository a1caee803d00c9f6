import t from 'tap'
import { startCluster } from '../helpers/cluster.ts'
import { startServer } from '../helpers/server-process.ts'

// Machines' clocks differ. Whether an Idempotency-Key's claim in progress has lapsed was judged by
// the clock of the process asked: one running a minute ahead took over a live claim and processed
// the same request a second time. The database's clock decides, as it does for run leases.
t.test('a process whose clock runs a minute ahead does not take over a live Idempotency-Key claim', async (t) => {
  const cluster = await startCluster(t, 1, { AGENTD_RUN_LEASE_MS: '1500' })
  const [a] = cluster.servers as [typeof cluster.servers[0]]
  const ahead = `const now = Date.now; Date.now = () => now() + 60_000`
  const b = await startServer({ ...cluster.env, NODE_OPTIONS: `--import=data:text/javascript;base64,${Buffer.from(ahead).toString('base64')}` }, 30_000)
  t.teardown(() => {
    b.child.kill('SIGKILL')
    return b.exited
  })
  const { api, devModel } = cluster
  const session = (await api(a, 'POST', '/v1/sessions', { tools: [] })).json
  devModel.script({ hang: true })
  const request = (server: typeof a, signal?: AbortSignal) => fetch(`${server.url}/v1/sessions/${session.id}/messages?wait=true`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'once' }, body: JSON.stringify({ content: 'once', onBusy: 'enqueue' }),
    ...(signal ? { signal } : {})
  })
  void request(a).catch(() => undefined)
  await new Promise((resolve) => setTimeout(resolve, 300))

  const again = await request(b, AbortSignal.timeout(3000)).then(async (res) => ({ status: res.status, json: await res.json() as any }), (err: Error) => err)
  t.match(again, { status: 409, json: { error: { code: 'IDEMPOTENCY_IN_PROGRESS' } } }, 'the retry through B waits for the first (it was processed again)')
})
