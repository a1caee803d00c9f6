import t from 'tap'
import { startCluster } from '../helpers/cluster.ts'
import { hooksEnv, startHookServer } from '../helpers/hook-server.ts'
import { until } from '../helpers/server-process.ts'

// runEnd is told of every run that ends (README, Hooks), a run ended by the recovery included: on
// PostgreSQL that is every run whose process died, taken over by another. It was never told.
t.test('the runEnd hook hears of a run that another process recovered after its owner died', async (t) => {
  const receiver = await startHookServer(t, () => ({ json: {} }))
  const cluster = await startCluster(t, 2, { ...hooksEnv(t, [{ name: 'ledger', on: 'runEnd', url: receiver.url }]), AGENTD_RUN_LEASE_MS: '1500' })
  const [a, b] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel, eventOf } = cluster
  const spec = { type: 'client', name: 'ask', description: 'Ask the user', parameters: { type: 'object' } }
  const session = (await api(a, 'POST', '/v1/sessions', { tools: [spec] })).json
  devModel.script({ toolCalls: [{ name: 'ask', arguments: {} }] })
  const { run } = (await api(b, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'ask me' })).json
  await eventOf(a, session.id, (e) => e.type === 'tool_result_required')

  b.child.kill('SIGKILL')
  await b.exited
  await eventOf(a, session.id, (e) => e.type === 'done' && e.runId === run.id, 10_000, "the recovered run's done")
  const delivery = await until(async () => receiver.received.find((d) => d.body.run?.id === run.id), 5000, 'the runEnd delivery')
  t.match(delivery.body, { event: 'runEnd', hook: 'ledger', sessionId: session.id, tenant: 'default', run: { id: run.id, status: 'failed' } })
})
