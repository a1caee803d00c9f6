import { join } from 'node:path'
import t from 'tap'
import { startDevModel } from '../../src/model/dev-model.ts'
import { SqliteStore } from '../../src/store/sqlite.ts'
import { DEFAULT_TENANT } from '../../src/http/auth.ts'
import { testSession } from '../store/contract.ts'
import { tempDir, type TapTest } from '../helpers/app.ts'
import { readSse } from '../helpers/sse.ts'
import { startServer, until } from '../helpers/server-process.ts'


/** A dev model and the environment of an agentd on a file of its own, with this grace period. */
async function drainSetup(t: TapTest, graceMs: number) {
  const devModel = await startDevModel({ host: '127.0.0.1', port: 0 })
  t.teardown(() => devModel.close())
  const dir = tempDir(t)
  const env = {
    AGENTD_DB: join(dir, 'agentd.db'), AGENTD_WORKSPACES: join(dir, 'ws'), OPENAI_BASE_URL: devModel.url, OPENAI_API_KEY: 'x',
    AGENTD_SHUTDOWN_GRACE_MS: String(graceMs)
  }
  return { devModel, env }
}

/** POSTs JSON to a server. */
const poster = (url: string) => (path: string, body: unknown) =>
  fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })

t.test('SIGTERM drains: readiness 503, new POSTs 503, active runs get the grace period, streams end, exit 0', async (t) => {
  const { devModel, env } = await drainSetup(t, 1500)
  const server = await startServer(env)
  t.teardown(() => server.child.kill('SIGKILL'))
  const post = poster(server.url)

  const session = (await (await post('/v1/sessions', { tools: [] })).json()) as { id: string }
  const finishing = (await (await post('/v1/sessions', { tools: [] })).json()) as { id: string }
  devModel.script({ hang: true }, { text: 'finished in time', delayMs: 500 })
  const hanging = (await (await post(`/v1/sessions/${session.id}/messages`, { content: 'hang' })).json()) as { run: { id: string } }
  await until(async () => devModel.requests.length >= 1, 5000, 'the first model call')
  const stream = readSse(`${server.url}/v1/sessions/${session.id}/events`, { timeoutMs: 10_000 })
  const finishingRun = (await (await post(`/v1/sessions/${finishing.id}/messages`, { content: 'quick' })).json()) as { run: { id: string } }
  await until(async () => devModel.requests.length >= 2, 5000, 'the second model call')

  server.child.kill('SIGTERM')
  const ready = await until(async () => {
    const res = await fetch(`${server.url}/readyz`).catch(() => null)
    return res && res.status === 503 ? res : undefined
  }, 3000, 'readyz 503')
  t.equal(((await ready.json()) as { error: { code: string } }).error.code, 'UNAVAILABLE')
  const refused = await post('/v1/sessions', {})
  t.equal(refused.status, 503)
  t.equal(((await refused.json()) as { error: { code: string } }).error.code, 'UNAVAILABLE')

  const { code } = await server.exited
  t.equal(code, 0, 'exits cleanly')
  const streamed = await stream
  t.ok(streamed.endedByServer, 'the open stream was ended by the server')
  t.match(streamed.frames.at(-1)?.comment, /shutting down/, 'with a final frame')
  t.equal(streamed.events.at(-1)?.type, 'done', 'after the interrupted run\'s done event')

  // The store closed cleanly: a new process sees the final states, and has nothing to recover.
  const restarted = await startServer(env)
  t.teardown(() => restarted.child.kill('SIGKILL'))
  const get = async (path: string) => (await (await fetch(`${restarted.url}${path}`)).json()) as Record<string, any>
  t.equal((await get(`/v1/sessions/${finishing.id}/runs/${finishingRun.run.id}`)).status, 'completed', 'a run that ended within the grace period completed')
  t.equal((await get(`/v1/sessions/${session.id}/runs/${hanging.run.id}`)).status, 'cancelled', 'a run still going after the grace period was interrupted')
  t.notOk(restarted.lines.some((line) => line.includes('recovered runs')), 'no run was left unfinished')
})

t.test('a second signal exits at once', async (t) => {
  const { devModel, env } = await drainSetup(t, 30000)
  const server = await startServer(env)
  t.teardown(() => server.child.kill('SIGKILL'))
  const session = (await (await fetch(`${server.url}/v1/sessions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"tools":[]}' })).json()) as { id: string }
  devModel.script({ hang: true })
  await fetch(`${server.url}/v1/sessions/${session.id}/messages`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"content":"hang"}' })
  await until(async () => devModel.requests.length >= 1, 5000, 'the model call')
  server.child.kill('SIGTERM')
  await new Promise((r) => setTimeout(r, 200))
  const started = Date.now()
  server.child.kill('SIGTERM')
  await server.exited
  t.ok(Date.now() - started < 2000, 'the second signal did not wait for the 30 s grace period')
})

t.test('during the drain, a run waiting for an approval or a client tool can still be answered, and finishes within the grace period', async (t) => {
  const { devModel, env } = await drainSetup(t, 20000)
  const server = await startServer(env)
  t.teardown(() => server.child.kill('SIGKILL'))
  const post = poster(server.url)
  const client = { type: 'client', name: 'ask_user', description: 'Asks the user', parameters: { type: 'object', properties: {} } }
  const approving = (await (await post('/v1/sessions', { tools: ['fs_write'], approval: { mode: 'always' } })).json()) as { id: string }
  const asking = (await (await post('/v1/sessions', { tools: [client] })).json()) as { id: string }
  type Paused = { run: { id: string; status: string }; pendingCall: { id: string } }
  // Model requests in the order they come: each run's tool call, then the answers after the drain began.
  devModel.script({ toolCalls: [{ name: 'fs_write', arguments: { path: 'a.txt', content: 'a' } }] }, { toolCalls: [{ name: 'ask_user', arguments: {} }] },
    { text: 'done' }, { text: 'done' })
  const approval = (await (await post(`/v1/sessions/${approving.id}/messages?wait=true`, { content: 'write' })).json()) as Paused
  t.equal(approval.run.status, 'awaiting_approval')
  const toolResult = (await (await post(`/v1/sessions/${asking.id}/messages?wait=true`, { content: 'ask' })).json()) as Paused
  t.equal(toolResult.run.status, 'awaiting_tool_result')

  server.child.kill('SIGTERM')
  await until(async () => (await fetch(`${server.url}/readyz`).catch(() => null))?.status === 503, 3000, 'readyz 503')
  t.equal((await post('/v1/sessions', {})).status, 503, 'new work is refused')
  const started = Date.now()
  const allowed = await post(`/v1/sessions/${approving.id}/approvals/${approval.pendingCall.id}`, { decision: 'allow' })
  t.equal(allowed.status, 200, 'the approval is taken')
  const answered = await post(`/v1/sessions/${asking.id}/tool-results/${toolResult.pendingCall.id}`, { output: 'yes' })
  t.equal(answered.status, 200, 'the client tool result is taken')
  const { code } = await server.exited
  t.equal(code, 0)
  t.ok(Date.now() - started < 10_000, 'the process stopped once the runs finished, not at the end of the 20 s grace period')

  const restarted = await startServer(env)
  t.teardown(() => restarted.child.kill('SIGKILL'))
  const get = async (path: string) => (await (await fetch(`${restarted.url}${path}`)).json()) as Record<string, any>
  t.equal((await get(`/v1/sessions/${approving.id}/runs/${approval.run.id}`)).status, 'completed', 'the approved run completed')
  t.equal((await get(`/v1/sessions/${asking.id}/runs/${toolResult.run.id}`)).status, 'completed', 'the answered run completed')
})

t.test('SIGTERM while a request is answered (a long session being deleted): the answer is sent, and the process still stops cleanly', async (t) => {
  const { devModel, env } = await drainSetup(t, 1000)
  // A session of 100 000 events, whose deletion takes a good part of a second.
  const id = 'ses_01M8F16NZ2C61VSBXA1T8WVTHE'
  const store = new SqliteStore(env.AGENTD_DB)
  await store.migrate()
  await store.createSession(testSession(id, { tenant: DEFAULT_TENANT }))
  for (let i = 0; i < 100_000; i += 5000) {
    await store.commit(Array.from({ length: 5000 }, () => ({
      type: 'event' as const,
      event: { sessionId: id, runId: null, channel: 'monitor' as const, type: 'tick', at: new Date().toISOString(), requestId: null, data: {} }
    })))
  }
  await store.close()
  const server = await startServer(env)
  t.teardown(() => server.child.kill('SIGKILL'))
  const deleted = fetch(`${server.url}/v1/sessions/${id}`, { method: 'DELETE' })
  await until(async () => server.lines.some((line) => line.includes('"method":"DELETE"')), 5000, 'the DELETE to arrive')
  server.child.kill('SIGTERM')
  t.equal((await deleted).status, 204, 'the deletion under way is answered')
  const { code } = await server.exited
  t.equal(code, 0, 'the process stopped by itself, not when its shutdown timed out')
  t.ok(server.lines.some((line) => line.includes('"msg":"stopped"')), 'it logged that it stopped')

  const restarted = await startServer(env)
  t.teardown(() => restarted.child.kill('SIGKILL'))
  t.equal((await fetch(`${restarted.url}/v1/sessions/${id}`)).status, 404, 'the session is gone')
})
