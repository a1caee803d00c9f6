import t from 'tap'
import { startCluster } from '../helpers/cluster.ts'
import { readSse } from '../helpers/sse.ts'
import { proxyInFrontOf } from '../helpers/tcp-proxy.ts'

const redisUrl = process.env.AGENTD_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'

t.test('with AGENTD_REDIS_URL, two processes share wake-ups, rate limits and stream caps', async (t) => {
  const cluster = await startCluster(t, 2, {
    AGENTD_REDIS_URL: redisUrl, AGENTD_MAX_STREAMS_PER_KEY: '2', AGENTD_RATE_LIMIT_MAX: '40', AGENTD_MAX_ACTIVE_RUNS_PER_TENANT: '2'
  })
  const [a, b] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel } = cluster

  t.test('events written on A reach a stream on B through Redis pub/sub', async (t) => {
    const session = (await api(a, 'POST', '/v1/sessions', {})).json
    const streamed = readSse(`${b.url}/v1/sessions/${session.id}/events?until=done`, { timeoutMs: 10_000 })
    await new Promise((r) => setTimeout(r, 200))
    devModel.script({ text: 'over redis we go', delayMs: 50 })
    t.equal((await api(a, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'hi' })).status, 202)
    const seen = await streamed
    t.ok(seen.endedByServer)
    t.same(seen.events.map((e) => e.seq), seen.events.map((_, i) => i + 1))
    t.equal(seen.events.at(-1)?.type, 'done')
  })

  t.test('the per-key stream cap counts the streams of both processes', async (t) => {
    const session = (await api(a, 'POST', '/v1/sessions', {})).json
    const url = (server: typeof a) => `${server.url}/v1/sessions/${session.id}/events`
    const first = readSse(url(a), { timeoutMs: 1500 })
    const second = readSse(url(b), { timeoutMs: 1500 })
    await new Promise((r) => setTimeout(r, 400))
    const third = await readSse(url(a), { timeoutMs: 1000 })
    t.equal(third.status, 429, 'A holds one stream, B one: the key is at its cap of 2')
    t.match(third.body, /LIMIT_EXCEEDED/)
    await Promise.all([first, second])
    await new Promise((r) => setTimeout(r, 200))
    const again = await readSse(url(b), { timeoutMs: 500 })
    t.equal(again.status, 200, 'closed streams free their slots')
  })

  t.test("a tenant's active runs are counted in the database, across processes", async (t) => {
    const sessions = await Promise.all([a, b, a].map(async (server) => (await api(server, 'POST', '/v1/sessions', {})).json))
    devModel.script({ hang: true }, { hang: true })
    t.equal((await api(a, 'POST', `/v1/sessions/${sessions[0].id}/messages`, { content: 'one' })).status, 202)
    t.equal((await api(b, 'POST', `/v1/sessions/${sessions[1].id}/messages`, { content: 'two' })).status, 202)
    const third = await api(a, 'POST', `/v1/sessions/${sessions[2].id}/messages`, { content: 'three' })
    t.equal(third.status, 429, 'one run on A and one on B: the tenant is at its limit of 2')
    t.equal(third.json.error.code, 'LIMIT_EXCEEDED')
    t.equal((await api(b, 'POST', `/v1/sessions/${sessions[0].id}/interrupt`)).status, 202)
    t.equal((await api(a, 'POST', `/v1/sessions/${sessions[1].id}/interrupt`)).status, 202)
    devModel.reset()
    t.equal((await api(b, 'POST', `/v1/sessions/${sessions[2].id}/messages`, { content: 'three' })).status, 202, 'ended runs free their places')
  })

  t.test('the rate limit counts the requests of both processes', async (t) => {
    const remaining = async (server: typeof a) => {
      const res = await fetch(`${server.url}/v1/tools`)
      await res.arrayBuffer()
      return { status: res.status, left: Number(res.headers.get('x-ratelimit-remaining')) }
    }
    const onA = await remaining(a)
    const onB = await remaining(b)
    t.equal(onB.left, onA.left - 1, 'a request on B spends from the budget A reported')
    let last = onB
    for (let i = 0; i < 40 && last.status !== 429; i++) last = await remaining(i % 2 === 0 ? a : b)
    t.equal(last.status, 429, 'the shared budget runs out across the processes')
  })
})

/**
 * Redis goes away (through a TCP proxy that closes it and refuses new connections): nothing may
 * wait for it. Requests pass uncounted at once, streams open, runs go on; once Redis is back the
 * processes reconnect, what a stream on the other process missed meanwhile arrives from the
 * database, and the counts are shared again.
 */
t.test('Redis goes away and comes back: nothing waits for it, and nothing is missed', async (t) => {
  const { proxy, url: viaProxy } = await proxyInFrontOf(t, redisUrl, 6379)
  const cluster = await startCluster(t, 2, { AGENTD_REDIS_URL: viaProxy.toString(), AGENTD_RATE_LIMIT_MAX: '1000' })
  const [a, b] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel } = cluster
  const session = (await api(a, 'POST', '/v1/sessions', {})).json
  const streamed = readSse(`${b.url}/v1/sessions/${session.id}/events?until=done`, { timeoutMs: 20_000 })
  await new Promise((r) => setTimeout(r, 300))

  proxy.cut()
  for (const server of [a, b]) {
    const started = Date.now()
    const res = await api(server, 'POST', '/v1/sessions', {})
    t.equal(res.status, 201, 'a request while Redis is down passes')
    t.ok(Date.now() - started < 1000, `without waiting for Redis (${Date.now() - started} ms)`)
  }
  const opened = Date.now()
  const other = await readSse(`${a.url}/v1/sessions/${session.id}/events`, { timeoutMs: 300 })
  t.equal(other.status, 200, 'a stream opens (uncounted)')
  t.ok(Date.now() - opened < 1000)
  devModel.script({ text: 'written while Redis was away' })
  const ran = await api(a, 'POST', `/v1/sessions/${session.id}/messages?wait=true`, { content: 'hi' })
  t.equal(ran.json.run.status, 'completed', 'a run goes on')

  proxy.restore()
  const seen = await streamed
  t.ok(seen.endedByServer, "B's stream got the run's events once Redis was back")
  t.equal(seen.events.at(-1)?.type, 'done')
  t.same(seen.events.map((e) => e.seq), seen.events.map((_, i) => i + 1), 'each once, in order')

  const remaining = async (server: typeof a) => {
    const res = await fetch(`${server.url}/v1/tools`)
    await res.arrayBuffer()
    return Number(res.headers.get('x-ratelimit-remaining'))
  }
  await cluster.until(async () => {
    const onA = await remaining(a)
    return (await remaining(b)) === onA - 1
  }, 10_000, 'the rate limit shared again')
  t.pass('the rate limit is shared again')
})
