import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { startDevModel } from '../../src/model/dev-model.ts'
import { tempDir, type TapTest } from '../helpers/app.ts'
import { undocumentedEvents } from '../helpers/event-document.ts'
import { until, startServer, type ServerProcess } from '../helpers/server-process.ts'
import { readSse, type StreamedEvent } from '../helpers/sse.ts'

/** kill -9 the server at a point of a run, restart it on the same store, and check what survived. */
t.test('kill -9 at each point of a run, then restart on the same store', async (t) => {
  const devModel = await startDevModel({ host: '127.0.0.1', port: 0 })
  t.teardown(() => devModel.close())
  const dir = tempDir(t)
  const env = {
    AGENTD_DB: join(dir, 'agentd.db'), AGENTD_WORKSPACES: join(dir, 'ws'), OPENAI_BASE_URL: devModel.url,
    OPENAI_API_KEY: 'test', AGENTD_BASH_ENABLED: 'true'
  }
  let server: ServerProcess = await startServer(env)
  t.teardown(() => server.child.kill('SIGKILL'))
  const api = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(`${server.url}${path}`, {
      method, headers: body === undefined ? {} : { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body)
    })
    const json: any = await res.json().catch(() => null)
    return { status: res.status, json }
  }
  const events = async (sessionId: string) => {
    const res = await fetch(`${server.url}/v1/sessions/${sessionId}/events?limit=1000`, { headers: { accept: 'application/json' } })
    return ((await res.json()) as { data: StreamedEvent[] }).data
  }
  /** The session's events once the first event of `type` (counted `count` times) is stored. */
  const eventsOnce = (sessionId: string, type: string, count = 1) =>
    until(async () => {
      const all = await events(sessionId)
      return all.filter((e) => e.type === type).length >= count ? all : undefined
    }, 5000, `${count} ${type}`)
  const crashAndRestart = async () => {
    server.child.kill('SIGKILL')
    await server.exited
    server = await startServer(env)
  }

  /** What every crash point must leave: the events seen before, then run_recovered … done, and a working session. */
  const assertRecovered = async (t: TapTest, sessionId: string, runId: string, seen: StreamedEvent[], previousStatus: string) => {
    const after = await events(sessionId)
    t.same(after.slice(0, seen.length).map((e) => [e.seq, e.type]), seen.map((e) => [e.seq, e.type]), 'every event committed before the kill is there')
    const recovered = after.find((e) => e.type === 'run_recovered')
    t.match(recovered?.data, { runId, previousStatus })
    t.same(after.slice(-3).map((e) => e.type), ['error', 'state_changed', 'done'])
    t.same(after.at(-1)?.data.reason, 'failed')
    t.same(after.map((e) => e.seq), after.map((_, i) => i + 1), 'seq stays gap-free')
    t.same(undocumentedEvents(after), [], 'every event, run_recovered included, matches the OpenAPI document')
    const run = await api('GET', `/v1/sessions/${sessionId}/runs/${runId}`)
    t.equal(run.json.status, 'failed')
    t.match(run.json.error, { errorType: 'exception' })
    t.equal((await api('GET', `/v1/sessions/${sessionId}`)).json.status, 'idle')

    // A client that reconnects with the last id it saw gets the rest, once each, in order.
    const lastSeen = seen.at(-1)?.seq ?? 0
    const resumed = await readSse(`${server.url}/v1/sessions/${sessionId}/events?until=done`, { headers: { 'last-event-id': String(lastSeen) } })
    t.same(resumed.events.map((e) => e.seq), after.filter((e) => e.seq > lastSeen).map((e) => e.seq), 'the reconnecting client gets the rest')

    // The conversation has an answer for every call, so the next message works.
    const messages = (await api('GET', `/v1/sessions/${sessionId}/messages`)).json.data as Array<{ role: string; toolCalls?: Array<{ id: string }>; toolCallId?: string }>
    const callIds = messages.flatMap((m) => m.toolCalls ?? []).map((c) => c.id)
    const answered = new Set(messages.filter((m) => m.role === 'tool').map((m) => m.toolCallId))
    for (const id of callIds) t.ok(answered.has(id), `call ${id} has a result`)
    devModel.script({ text: 'back again' })
    const next = await api('POST', `/v1/sessions/${sessionId}/messages?wait=true`, { content: 'are you there?' })
    t.equal(next.json.run.status, 'completed', 'the next message to the session works')
    return { after, recovered }
  }

  t.test('while the model streams', async (t) => {
    const session = (await api('POST', '/v1/sessions', { tools: [] })).json
    devModel.script({ hang: true, afterChunks: 3, text: 'a b c d e f g h' })
    const { run } = (await api('POST', `/v1/sessions/${session.id}/messages`, { content: 'stream' })).json
    const seen = await eventsOnce(session.id, 'text_chunk', 3)
    await crashAndRestart()
    const { recovered } = await assertRecovered(t, session.id, run.id, seen, 'running')
    t.same(recovered?.data.sealedCalls, [])
  })

  t.test('while a tool runs', async (t) => {
    const session = (await api('POST', '/v1/sessions', { tools: ['bash_run'] })).json
    devModel.script({ toolCalls: [{ name: 'bash_run', arguments: { command: 'sleep 3' } }] })
    const { run } = (await api('POST', `/v1/sessions/${session.id}/messages`, { content: 'run it' })).json
    const seen = await eventsOnce(session.id, 'tool:start')
    const callId = seen.find((e) => e.type === 'tool:start')?.data.call.id
    await crashAndRestart()
    const { after, recovered } = await assertRecovered(t, session.id, run.id, seen, 'running')
    t.same(recovered?.data.sealedCalls, [callId])
    const sealed = after.find((e) => e.type === 'tool:end' && e.data.call.id === callId)
    t.equal(sealed?.data.call.state, 'sealed', 'the call is sealed')
  })

  t.test('while a read-only tool runs: neither the call nor the step that asked for it is left', async (t) => {
    const session = (await api('POST', '/v1/sessions', { tools: ['fs_grep'] })).json
    // A pattern that backtracks for minutes on this line keeps the search (a read-only tool) busy.
    const workspace = join(dir, 'ws', session.id)
    mkdirSync(workspace, { recursive: true })
    writeFileSync(join(workspace, 'slow.txt'), `${'a'.repeat(34)}b\n`)
    const asked = devModel.requests.length
    devModel.script({ toolCalls: [{ name: 'fs_grep', arguments: { pattern: '^(a+)+$' } }] })
    const { run } = (await api('POST', `/v1/sessions/${session.id}/messages`, { content: 'search' })).json
    const seen = await eventsOnce(session.id, 'state_changed')
    await until(async () => devModel.requests.length > asked, 5000, 'the model call that asks for the search')
    await new Promise((resolve) => setTimeout(resolve, 200))
    await crashAndRestart()
    const { after, recovered } = await assertRecovered(t, session.id, run.id, seen, 'running')
    t.same(recovered?.data.sealedCalls, [], 'no call to seal: none was stored')
    t.notOk(after.some((e) => e.type.startsWith('tool') || e.type === 'token_usage'), `no event of the step: ${after.map((e) => e.type).join(' ')}`)
  })

  t.test('while an approval waits', async (t) => {
    const session = (await api('POST', '/v1/sessions', { approval: { mode: 'always' } })).json
    devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }] })
    const { run } = (await api('POST', `/v1/sessions/${session.id}/messages`, { content: 'list' })).json
    const seen = await eventsOnce(session.id, 'permission_required')
    const callId = seen.find((e) => e.type === 'permission_required')?.data.call.id
    await crashAndRestart()
    const { recovered } = await assertRecovered(t, session.id, run.id, seen, 'awaiting_approval')
    t.same(recovered?.data.sealedCalls, [callId])
    const late = await api('POST', `/v1/sessions/${session.id}/approvals/${callId}`, { decision: 'allow' })
    t.equal(late.status, 409, 'the old approval is no longer awaited')
  })

  t.test('a queued run survives and runs after the restart, announced as nothing recovered: it never started', async (t) => {
    const session = (await api('POST', '/v1/sessions', { tools: [] })).json
    const before = devModel.requests.length
    devModel.script({ hang: true })
    const first = (await api('POST', `/v1/sessions/${session.id}/messages`, { content: 'first' })).json.run
    const queued = (await api('POST', `/v1/sessions/${session.id}/messages`, { content: 'second', onBusy: 'enqueue' })).json.run
    await until(async () => devModel.requests.length > before, 5000, 'the first run to call the model')
    devModel.reset()
    devModel.script({ text: 'second answer' })
    await crashAndRestart()
    const run = await until(async () => {
      const r = (await api('GET', `/v1/sessions/${session.id}/runs/${queued.id}`)).json
      return r.status === 'completed' ? r : undefined
    }, 5000, 'the queued run to complete')
    t.equal(run.status, 'completed')
    const messages = (await api('GET', `/v1/sessions/${session.id}/messages`)).json.data
    t.same(messages.map((m: { content: string }) => m.content), ['first', 'second', 'second answer'], 'nothing the client sent is lost')
    // SPEC 8: each run that was active gets run_recovered; one waiting in the queue was not.
    const recovered = (await events(session.id)).filter((e) => e.type === 'run_recovered')
    t.same(recovered.map((e) => [e.runId, e.data.previousStatus]), [[first.id, 'running']], 'run_recovered for the running run only')
  })
})

t.test('an Idempotency-Key whose request died with its process can be retried after the restart', async (t) => {
  const devModel = await startDevModel({ host: '127.0.0.1', port: 0 })
  t.teardown(() => devModel.close())
  const dir = tempDir(t)
  const env = { AGENTD_DB: join(dir, 'agentd.db'), AGENTD_WORKSPACES: join(dir, 'ws'), OPENAI_BASE_URL: devModel.url, OPENAI_API_KEY: 'test' }
  let server = await startServer(env)
  t.teardown(() => server.child.kill('SIGKILL'))
  const session = await (await fetch(`${server.url}/v1/sessions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"tools":[]}' })).json() as { id: string }
  const send = () => fetch(`${server.url}/v1/sessions/${session.id}/messages?wait=true`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': 'retry-me' }, body: JSON.stringify({ content: 'hello' })
  })
  devModel.script({ hang: true })
  const first = send().catch(() => null)
  await until(async () => devModel.requests.length > 0, 10_000, 'the model call')
  // The run's start is committed while its first model call goes out: kill only once it is
  // stored, so the restart ends this run (run_recovered) rather than queueing it again.
  const started = async () => {
    const res = await fetch(`${server.url}/v1/sessions/${session.id}/events?types=state_changed`, { headers: { accept: 'application/json' } })
    return ((await res.json()) as { data: unknown[] }).data.length > 0
  }
  await until(started, 10_000, 'the run stored as running')
  server.child.kill('SIGKILL')
  await server.exited
  await first
  server = await startServer(env)
  devModel.script({ text: 'answered after the crash' })
  const retry = await send()
  t.equal(retry.status, 200, 'the retry is processed, not 409 IDEMPOTENCY_IN_PROGRESS')
  const body = await retry.json() as { run: { status: string }; message: { content: string } }
  t.equal(body.run.status, 'completed')
  t.equal(body.message.content, 'answered after the crash')
  const again = await send()
  t.equal(again.headers.get('idempotent-replayed'), 'true', 'and its answer is the one kept under the key')
})

t.test('a second agentd on the same SQLite file refuses to start with one line, and the first keeps serving', async (t) => {
  const dir = tempDir(t)
  const env = { AGENTD_DB: join(dir, 'agentd.db'), AGENTD_WORKSPACES: join(dir, 'ws') }
  const first = await startServer(env)
  t.teardown(() => first.child.kill('SIGKILL'))
  const second = await startServer(env).then(() => null, (err: Error) => err)
  t.match(second?.message, /exited with 1 before listening: agentd: cannot start: .*in use by another process/)
  t.equal(second?.message.trim().split('\n').length, 1, 'one line, no stack trace')
  t.equal((await fetch(`${first.url}/readyz`)).status, 200, 'the first is untouched')
})
