import t from 'tap'
import { startCluster } from '../helpers/cluster.ts'
import { readSse } from '../helpers/sse.ts'
import { proxyInFrontOf } from '../helpers/tcp-proxy.ts'

const redisUrl = process.env.AGENTD_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'

/**
 * While Redis is away (a TCP proxy in front of it closes it and refuses new connections), what
 * one process asks of another still gets through: the wake-ups and signals travel over the
 * database instead, so nothing waits for Redis to come back.
 */
t.test('Redis down: streams, approvals and interrupts across processes go on without it', async (t) => {
  const { proxy, url: viaProxy } = await proxyInFrontOf(t, redisUrl, 6379)
  const cluster = await startCluster(t, 2, { AGENTD_REDIS_URL: viaProxy.toString() })
  const [a, b] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel, eventOf } = cluster
  t.teardown(() => proxy.restore())

  const streamed = await api(a, 'POST', '/v1/sessions', {})
  const approved = await api(a, 'POST', '/v1/sessions', { approval: { mode: 'always' } })
  const stopped = await api(a, 'POST', '/v1/sessions', {})
  const stream = readSse(`${b.url}/v1/sessions/${streamed.json.id}/events?until=done`, { timeoutMs: 15_000 })
  await new Promise((r) => setTimeout(r, 300))
  proxy.cut()

  t.test('a stream on B gets the events of a run on A, in order, before Redis is back', async (t) => {
    devModel.script({ text: 'written while Redis was away', delayMs: 20 })
    t.equal((await api(a, 'POST', `/v1/sessions/${streamed.json.id}/messages`, { content: 'hi' })).status, 202)
    const seen = await stream
    t.ok(seen.endedByServer, "B's stream ended with the run's done")
    t.equal(seen.events.at(-1)?.type, 'done')
    t.same(seen.events.map((e) => e.seq), seen.events.map((_, i) => i + 1), 'each once, in order')
  })

  t.test('an approval posted through B reaches the run waiting on A', async (t) => {
    devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }] }, { text: 'listed' })
    const { run } = (await api(a, 'POST', `/v1/sessions/${approved.json.id}/messages`, { content: 'list' })).json
    const required = await eventOf(b, approved.json.id, (e) => e.type === 'permission_required')
    const answer = await api(b, 'POST', `/v1/sessions/${approved.json.id}/approvals/${required.data.call.id}`, { decision: 'allow' })
    t.equal(answer.status, 200, `answered ${JSON.stringify(answer.json)}`)
    await eventOf(b, approved.json.id, (e) => e.type === 'done')
    t.equal((await api(b, 'GET', `/v1/sessions/${approved.json.id}/runs/${run.id}`)).json.status, 'completed')
  })

  t.test('an interrupt through B of a run on A answers once the run has stopped', async (t) => {
    devModel.script({ hang: true, afterChunks: 1 })
    const { run } = (await api(a, 'POST', `/v1/sessions/${stopped.json.id}/messages`, { content: 'hang' })).json
    await eventOf(b, stopped.json.id, (e) => e.type === 'text_chunk', 10_000, 'the run streaming')
    // Its wait for the run's end must not hang until Redis is back.
    const res = await fetch(`${b.url}/v1/sessions/${stopped.json.id}/interrupt`, { method: 'POST', signal: AbortSignal.timeout(10_000) })
    t.equal(res.status, 202)
    t.match(await res.json(), { id: run.id, status: 'cancelled' })
  })
})
