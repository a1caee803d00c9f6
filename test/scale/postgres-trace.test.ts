import t from 'tap'
import { startCluster } from '../helpers/cluster.ts'
import { startOtlpReceiver } from '../helpers/otlp-receiver.ts'

const CLIENT_TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736'
const CLIENT_TRACEPARENT = `00-${CLIENT_TRACE_ID}-00f067aa0ba902b7-01`

// A queued run is started by whichever process is free when the session's run before it ends. Its
// request's traceparent was kept in the memory of the process that accepted it: another process
// starting the run began a trace of its own, and the first held the traceparent for good (one
// entry per such run, for the life of the process). It is stored with the run now.
t.test('a run accepted by A and started by B continues the trace of the request A accepted', async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const cluster = await startCluster(t, 2, { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_BSP_SCHEDULE_DELAY: '50' })
  const [a, b] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel, until } = cluster
  const session = (await api(a, 'POST', '/v1/sessions', { tools: [] })).json
  devModel.script({ text: 'first', delayMs: 500 }, { text: 'second' })
  const first = (await api(b, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'first' })).json
  const second = await api(a, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'second', onBusy: 'enqueue' }, { traceparent: CLIENT_TRACEPARENT })
  t.equal(second.json.run.status, 'queued', 'queued behind the run on B')

  const run = await until(async () => {
    const span = receiver.spans.find((s) => s.name === 'invoke_agent' && s.attributes['agentd.run.id'] === second.json.run.id)
    return span
  }, 15_000, "the queued run's span")
  const firstRun = receiver.spans.find((s) => s.name === 'invoke_agent' && s.attributes['agentd.run.id'] === first.run.id)
  t.equal(run.traceId, CLIENT_TRACE_ID, "the run's span is in the trace of the request that queued it")
  t.match((await api(a, 'GET', `/v1/sessions/${session.id}/runs/${second.json.run.id}`)).json, { status: 'completed' })
  t.not(firstRun?.traceId, CLIENT_TRACE_ID, 'the run before it has a trace of its own')
})
