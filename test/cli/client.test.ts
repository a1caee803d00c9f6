import t from 'tap'
import { AgentdClient, type AgentEvent } from '../../src/cli/client.ts'
import { buildTestApp, listen } from '../helpers/app.ts'
import { until } from '../helpers/server-process.ts'
import { startTcpProxy } from '../helpers/tcp-proxy.ts'

t.test('a followed stream that goes silent is reopened, and nothing sent meanwhile is lost or repeated', async (t) => {
  // Before, a connection that stopped carrying anything without being closed (a NAT that forgot
  // it, a server host that lost power) was read for ever: `agentd events --follow` and `agentd
  // chat` hung without a word, though the server pings every stream.
  const { app } = await buildTestApp(t, { app: { ssePingMs: 100 } })
  const base = new URL(await listen(app))
  const proxy = await startTcpProxy({ host: base.hostname, port: Number(base.port) })
  t.teardown(() => proxy.close())
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const send = (content: string) => app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content } })
  await send('before the drop')

  const client = new AgentdClient(`http://127.0.0.1:${proxy.port}`)
  const stop = new AbortController()
  t.teardown(() => stop.abort())
  const received: AgentEvent[] = []
  const drops: string[] = []
  void (async () => {
    for await (const event of client.follow(session.id, { signal: stop.signal, idleMs: 1000, retryMs: 50, onReconnect: (err) => drops.push(String((err as Error).message)) })) {
      received.push(event)
    }
  })()
  await until(async () => received.some((event) => event.type === 'done'), 5000, 'the first run')

  proxy.drop()
  await send('while the stream was silent')
  const done = await until(async () => received.filter((event) => event.type === 'done').length === 2, 10_000, 'the second run')
    .catch((err: Error) => err)
  t.equal(done, true, 'the second run arrives over a new connection')
  t.match(drops[0], 'nothing received for 1 s, not even a ping', 'the drop is told')
  const { lastSeq } = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json()
  t.same(received.map((event) => event.seq), Array.from({ length: lastSeq }, (_, i) => i + 1), 'every event once, in order')
})

t.test('a reader slow to take the next event (a question waiting on the user) is not a silent stream', async (t) => {
  const { app } = await buildTestApp(t, { app: { ssePingMs: 100 } })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const send = (content: string) => app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content } })
  await send('first')
  const client = new AgentdClient(base)
  const stop = new AbortController()
  t.teardown(() => stop.abort())
  const drops: unknown[] = []
  let runs = 0
  for await (const event of client.follow(session.id, { signal: stop.signal, idleMs: 1000, onReconnect: (err) => drops.push(err) })) {
    if (event.type !== 'done') continue
    if (++runs === 2) break
    // Three times idleMs over the last event of the first run, then the second run.
    await new Promise((resolve) => setTimeout(resolve, 3000))
    await send('second')
  }
  t.same(drops, [], 'the stream was not reopened')
})
