import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { startDevModel } from '../../src/model/dev-model.ts'
import { tempDir } from '../helpers/app.ts'
import { postgresUrl, withSchema } from '../helpers/postgres.ts'
import { startServer, until } from '../helpers/server-process.ts'
import { readSse, type StreamedEvent } from '../helpers/sse.ts'
import { proxyInFrontOf } from '../helpers/tcp-proxy.ts'

/**
 * One process on PostgreSQL whose database goes away under it, through a TCP proxy: closed
 * (the server went down) and silent (a network that drops everything). It must answer 503 in
 * the envelope within its statement timeout, never 500 and never hang; end the run it was
 * streaming once the database is back; and be ready again as soon as the database answers.
 */
t.test('PostgreSQL out of reach: 503s, no hang, and the runs ended once it is back', async (t) => {
  const schema = await withSchema(t)
  const { proxy, url: viaProxy } = await proxyInFrontOf(t, postgresUrl, 5432)
  viaProxy.search = `?options=${encodeURIComponent(`-c search_path=${schema}`)}`
  const devModel = await startDevModel({ host: '127.0.0.1', port: 0 })
  t.teardown(() => devModel.close())
  const dir = tempDir(t)
  const server = await startServer({
    DATABASE_URL: viaProxy.toString(), AGENTD_WORKSPACES: join(dir, 'ws'), OPENAI_BASE_URL: devModel.url, OPENAI_API_KEY: 'test',
    AGENTD_RUN_LEASE_MS: '1500', AGENTD_STORE_TIMEOUT_MS: '1000', AGENTD_RATE_LIMIT_MAX: '0'
  }, 30_000)
  t.teardown(async () => {
    server.child.kill('SIGKILL')
    await server.exited
  })
  const api = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${server.url}${path}`, {
      method,
      headers: { accept: 'application/json', ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      body: body === undefined ? undefined : JSON.stringify(body)
    })
    return { status: res.status, headers: res.headers, json: (await res.json().catch(() => null)) as any }
  }
  const session = (await api('POST', '/v1/sessions', { tools: [] })).json

  t.test('the database goes down under a streaming run', async (t) => {
    devModel.script({ text: 'an answer that comes while the database is down', delayMs: 600 })
    const streaming = readSse(`${server.url}/v1/sessions/${session.id}/messages`, { method: 'POST', body: { content: 'x' }, timeoutMs: 30_000 })
    await until(async () => (await api('GET', `/v1/sessions/${session.id}`)).json.status === 'running', 5000, 'the run started')
    proxy.cut()

    const created = await api('POST', '/v1/sessions', {})
    t.equal(created.status, 503, 'a new session: 503, not 500')
    t.match(created.json.error, { code: 'UNAVAILABLE', retryable: true, message: 'The store is unreachable' })
    t.equal(created.headers.get('retry-after'), '1')
    t.equal((await api('GET', `/v1/sessions/${session.id}`)).status, 503)
    t.equal((await api('GET', '/readyz')).status, 503, 'not ready')
    t.equal((await api('GET', '/healthz')).status, 200, 'but alive')
    await sleep(1500)
    proxy.restore()

    const stream = await streaming
    t.ok(stream.endedByServer, 'the stream ended once the run was')
    t.match(stream.events.at(-1), { type: 'done', data: { reason: 'failed' } })
    t.ok(stream.events.some((e) => e.type === 'run_recovered'), 'ended by the recovery')
    await until(async () => (await api('GET', '/readyz')).status === 200, 5000, 'ready again')
    devModel.script({ text: 'stored now' })
    const next = await api('POST', `/v1/sessions/${session.id}/messages?wait=true`, { content: 'y' })
    t.equal(next.status, 200)
    t.equal(next.json.run.status, 'completed', 'the session goes on')
    const events = (await api('GET', `/v1/sessions/${session.id}/events?limit=1000`)).json.data as StreamedEvent[]
    t.same(events.map((e) => e.seq), events.map((_, i) => i + 1), 'seq gap-free')
    t.equal(events.filter((e) => e.type === 'done').length, 2, 'one done per run')
  })

  t.test('the network drops everything, and no connection closes: requests answer 503 instead of waiting', async (t) => {
    proxy.partition()
    for (const path of [`/v1/sessions/${session.id}`, '/readyz']) {
      const started = Date.now()
      const res = await api('GET', path)
      const tookMs = Date.now() - started
      t.equal(res.status, 503, `${path}: 503`)
      t.equal(res.json.error.code, 'UNAVAILABLE')
      // A pooled connection's statement gives up after AGENTD_STORE_TIMEOUT_MS (1 s here), a new connection after 5 s.
      t.ok(tookMs < 8000, `${path} answered in ${tookMs} ms`)
    }
    proxy.restore()
    await until(async () => (await api('GET', '/readyz')).status === 200, 10_000, 'ready again')
    t.equal((await api('GET', `/v1/sessions/${session.id}`)).status, 200)
  })

  t.test('the process lived through it', async (t) => {
    t.equal(server.child.exitCode, null)
    t.notOk(server.lines.some((line) => line.includes('"unhandled error"')), 'no 500 was logged')
  })
})
