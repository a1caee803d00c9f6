import { mkdirSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:http'
import { join } from 'node:path'
import { Type } from '@sinclair/typebox'
import t from 'tap'
import type { Tool } from '../../src/tools/types.ts'
import { runInWorker } from '../../src/tools/worker.ts'
import { buildTestApp, tempDir, type TestApp } from '../helpers/app.ts'
import type { StreamedEvent } from '../helpers/sse.ts'

const runaway = new URL('../fixtures/tools/runaway.ts', import.meta.url)

/** Runs one message whose first model answer makes the given tool calls; returns the run, its events and what the model got back. */
async function runCalls(ctx: TestApp, sessionBody: object, calls: Array<{ name: string; arguments: unknown }>) {
  const { app, devModel } = ctx
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: sessionBody })).json()
  if (!session.id) throw new Error(`session not created: ${JSON.stringify(session)}`)
  devModel.script({ toolCalls: calls as never }, { text: 'all done' })
  const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'use the tools' } })).json()
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  const last = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string; tool_call_id?: string }> }
  const toolResults = last.messages.filter((m) => m.role === 'tool').map((m) => JSON.parse(m.content))
  return { session, run: res.run, events, toolResults }
}

t.test('a tool round trip: events, messages and what the model received', async (t) => {
  const ctx = await buildTestApp(t)
  const { session, run, events, toolResults } = await runCalls(ctx, {}, [
    { name: 'fs_write', arguments: { path: 'notes/a.txt', content: 'hello file' } }
  ])
  t.equal(run.status, 'completed')
  t.equal(run.steps, 2)
  t.same(events.map((e) => e.type), [
    'state_changed', 'token_usage', 'tool:start', 'tool_executed', 'tool:end', 'step_complete',
    'text_chunk_start', 'text_chunk', 'text_chunk', 'text_chunk_end', 'token_usage', 'step_complete', 'state_changed', 'done'
  ])
  const start = events.find((e) => e.type === 'tool:start')?.data.call
  const end = events.find((e) => e.type === 'tool:end')?.data.call
  t.match(start, { name: 'fs_write', input: { path: 'notes/a.txt', content: 'hello file' }, state: 'pending', id: /^call_/ })
  t.match(end, { id: start.id, state: 'completed', durationMs: Number })
  t.equal(readFileSync(join(ctx.dir, 'workspaces', session.id, 'notes/a.txt'), 'utf8'), 'hello file', 'the file is in the session workspace')
  t.equal(toolResults.length, 1)
  const messages = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
  t.same(messages.map((m: { role: string }) => m.role), ['user', 'assistant', 'tool', 'assistant'])
  t.equal(messages[1].toolCalls[0].id, start.id)
  t.equal(messages[2].toolCallId, start.id)
})

t.test('a server tool is executing, and stored so, from the moment its tool:start is seen', async (t) => {
  const ctx = await buildTestApp(t)
  const { app, devModel } = ctx
  const Params = Type.Object({ n: Type.Number() })
  const running: Array<() => void> = []
  const gate: Tool<typeof Params> = {
    name: 'gate',
    description: 'waits until the test lets it go',
    parameters: Params,
    execute: (input) => new Promise((resolve) => running.push(() => resolve({ n: input.n })))
  }
  app.agentd.tools.registry.register(gate)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['gate'] } })).json()
  // Two calls in one step: the first starts with the step's result, the second when its turn comes.
  devModel.script({ toolCalls: [{ name: 'gate', arguments: { n: 1 } }, { name: 'gate', arguments: { n: 2 } }] as never }, { text: 'done' })
  const accepted = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'go' } })).json()
  const eventTypes = async () => ((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=100`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]).map((e) => e.type)
  const calls = async () => (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json().data as Array<{ state: string; input: unknown }>
  const waitForCall = async (count: number) => {
    for (let i = 0; i < 500 && running.length < count; i++) await new Promise((resolve) => setTimeout(resolve, 5))
    t.equal(running.length, count, `call ${count} is running`)
  }

  await waitForCall(1)
  t.same((await eventTypes()).slice(-3), ['state_changed', 'token_usage', 'tool:start'], 'the step and the first call started')
  t.match(await calls(), [{ state: 'executing', input: { n: 1 } }], 'the running call is stored as executing')
  running[0]?.()
  await waitForCall(2)
  t.same((await eventTypes()).slice(-4), ['tool:start', 'tool_executed', 'tool:end', 'tool:start'])
  t.match(await calls(), [{ state: 'completed', input: { n: 1 } }, { state: 'executing', input: { n: 2 } }])
  running[1]?.()
  const ended = await app.agentd.runs.waitFor(session.id, accepted.run.id)
  t.equal(ended?.status, 'completed')
  t.match(await calls(), [{ state: 'completed' }, { state: 'completed' }])
})

t.test('a workspace that cannot be made fails the tool call classified, and the run goes on', async (t) => {
  const dir = tempDir(t)
  // A file where the workspaces folder should be: no session folder can be made under it.
  writeFileSync(join(dir, 'not-a-folder'), 'x')
  const ctx = await buildTestApp(t, { env: { AGENTD_WORKSPACES: join(dir, 'not-a-folder') } })
  const { run, toolResults, events } = await runCalls(ctx, {}, [{ name: 'fs_list', arguments: {} }])
  t.equal(run.status, 'completed')
  t.match(toolResults, [{ ok: false, errorType: String, code: String, recommendations: Array }])
  t.ok(events.some((e) => e.type === 'tool:error'), 'the failure is an event too')
  // The service still answers (the workspace made while the model answered failed without a trace).
  t.equal((await ctx.app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200)
})

t.test('every errorType reaches the model as {ok:false, error, errorType, code, retryable, recommendations}', async (t) => {
  const ctx = await buildTestApp(t)
  const Params = Type.Object({ mode: Type.String() })
  const failing: Tool<typeof Params> = {
    name: 'flaky',
    description: 'fails on purpose',
    parameters: Params,
    async execute(input, toolCtx) {
      if (input.mode === 'throw') throw new Error('disk on fire')
      if (input.mode === 'logical') return { ok: false, error: 'the record does not exist' }
      await new Promise((resolve) => toolCtx.signal.addEventListener('abort', resolve))
      return 'too late'
    }
  }
  ctx.app.agentd.tools.registry.register(failing)
  const { toolResults, events, run } = await runCalls(ctx, { tools: ['fs_read', 'flaky'], limits: { toolTimeoutMs: 300 } }, [
    { name: 'fs_read', arguments: { path: 42 } },
    { name: 'no_such_tool', arguments: {} },
    { name: 'flaky', arguments: { mode: 'throw' } },
    { name: 'flaky', arguments: { mode: 'logical' } },
    { name: 'flaky', arguments: { mode: 'hang' } },
    { name: 'fs_read', arguments: { path: 'missing.txt' } }
  ])
  t.equal(run.status, 'completed', 'tool errors do not end the run')
  const keys = ['ok', 'error', 'errorType', 'code', 'retryable', 'recommendations']
  for (const result of toolResults) for (const key of keys) t.ok(key in result, `${result.code} has ${key}`)
  const [validation, unknown, runtime, logical, aborted, missing] = toolResults
  t.match(validation, { ok: false, errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false })
  t.match(validation.recommendations.join(' '), /path/, 'names the failing field')
  t.match(validation.recommendations.join(' '), /string/, 'and its expected type')
  t.match(unknown, { errorType: 'validation', code: 'TOOL_NOT_FOUND', retryable: false })
  t.match(unknown.recommendations.join(' '), /fs_read/, 'lists the tools there are')
  t.match(runtime, { errorType: 'runtime', retryable: true, error: /disk on fire/ })
  t.match(logical, { errorType: 'logical', retryable: true, error: /does not exist/ })
  t.match(aborted, { errorType: 'aborted', code: 'TIMEOUT', retryable: false })
  t.match(missing, { errorType: 'logical', code: 'NOT_FOUND' })
  t.match(missing.recommendations.join(' '), /fs_glob|fs_list/, 'a missing file suggests fs_glob')
  t.match(missing.recommendations.join(' ') + missing.error, /missing\.txt/, 'and names the path')

  const errors = events.filter((e) => e.type === 'tool:error')
  t.equal(errors.length, 6, 'a tool:error per failed call')
  t.equal(events.filter((e) => e.type === 'error' && e.data.phase === 'tool').length, 6, 'a monitor error (phase tool) per failed call')
  t.equal(events.filter((e) => e.type === 'tool:end').length, 6, 'tool:end after every tool:start')
  for (const e of errors) t.notOk(e.data.error.fatal, `${e.data.error.code} is not fatal`)
})

t.test('arguments the model sends that are not JSON, or nest too deep to store, come back to it as validation errors', async (t) => {
  const ctx = await buildTestApp(t)
  const deep = '{"path":' + '['.repeat(100_000) + ']'.repeat(100_000) + '}'
  const { toolResults, events, run } = await runCalls(ctx, { tools: ['fs_list'] }, [
    { name: 'fs_list', arguments: '{"path": ' },
    { name: 'fs_list', arguments: deep }
  ])
  t.equal(run.status, 'completed', 'the run goes on to its answer')
  const [broken, tooDeep] = toolResults
  t.match(broken, { ok: false, errorType: 'validation', code: 'VALIDATION_ERROR', error: /not valid JSON/ })
  t.match(tooDeep, { ok: false, errorType: 'validation', code: 'VALIDATION_ERROR', error: /deeper than 128 levels/ })
  t.match(tooDeep.recommendations.join(' '), /at most 128 levels/, 'says what to send instead')
  const ends = events.filter((e) => e.type === 'tool:end').map((e) => e.data.call)
  t.same(ends.map((call) => call.state), ['failed', 'failed'], 'both calls are stored, with their start and end')
  t.equal(ends[1].input, deep, 'the refused arguments are kept as the text the model sent')
})

t.test('a path naming a folder, or holding a lone surrogate, comes back to the model classified, nothing is made, and the run goes on', async (t) => {
  const ctx = await buildTestApp(t)
  const { session, toolResults, events, run } = await runCalls(ctx, { tools: ['fs_write', 'fs_read'] }, [
    { name: 'fs_write', arguments: '{"path": "new/", "content": "x"}' },
    // The JSON the model sends: an escape of half a surrogate pair, alone.
    { name: 'fs_write', arguments: '{"path": "a\\ud800b.txt", "content": "x"}' },
    { name: 'fs_read', arguments: '{"path": "a\\ud800b.txt"}' }
  ])
  t.equal(run.status, 'completed', 'the run goes on to its answer')
  const [folder, lone, read] = toolResults
  t.match(folder, { ok: false, errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false, detail: { reason: 'names_a_folder' }, recommendations: [/e\.g\. "new\/notes\.txt"/] })
  for (const result of [lone, read]) {
    t.match(result, {
      ok: false, errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false,
      detail: { reason: 'lone_surrogate', index: 1, fields: [{ field: 'path' }] }, recommendations: [/Send "path" as well-formed Unicode/]
    })
  }
  t.same(events.filter((e) => e.type === 'tool:end').map((e) => e.data.call.state), ['failed', 'failed', 'failed'])
  t.same(readdirSync(join(ctx.dir, 'workspaces', session.id)), [], 'no file "new", nor "a\ufffdb.txt"')
})

t.test('an unexpected failure around a tool is an exception the run survives', async (t) => {
  const ctx = await buildTestApp(t)
  ctx.app.agentd.tools.executor = async () => async () => {
    throw new Error('workspace volume vanished')
  }
  const { toolResults, run } = await runCalls(ctx, {}, [{ name: 'fs_list', arguments: { path: '.' } }])
  t.equal(run.status, 'completed')
  t.match(toolResults[0], { ok: false, errorType: 'exception', retryable: true })
})

t.test('isolation: runaway tools end classified in time while the service keeps answering', async (t) => {
  const ctx = await buildTestApp(t, { env: { AGENTD_BASH_ENABLED: 'true' }, app: { tools: { maxOutputBytes: 10_000 } } })
  const { app, devModel } = ctx
  const Params = Type.Object({})
  const tools: Tool<typeof Params>[] = [
    { name: 'throws', description: 'throws', parameters: Params, execute: async () => { throw new TypeError('bad state') } },
    { name: 'hangs', description: 'ignores its signal', parameters: Params, execute: () => new Promise(() => {}) },
    { name: 'spins', description: 'loops forever in JS', parameters: Params, execute: (_i, c) => runInWorker(runaway, 'spin', null, { signal: c.signal }) },
    { name: 'hoards', description: 'allocates without bound', parameters: Params, execute: (_i, c) => runInWorker(runaway, 'allocate', null, { signal: c.signal, resourceLimits: { maxOldGenerationSizeMb: 64 } }) }
  ]
  for (const tool of tools) app.agentd.tools.registry.register(tool)
  const other = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const timeoutMs = 1000
  const cases: Array<[string, unknown, RegExp]> = [
    ['throws', {}, /runtime/],
    ['hangs', {}, /aborted/],
    ['spins', {}, /aborted/],
    // Out of heap (runtime, memory_limit) or, on a loaded machine, out of time first (aborted).
    ['hoards', {}, /runtime|aborted/],
    ['bash_run', { command: 'head -c 1073741824 /dev/zero | tr "\\0" x' }, /./]
  ]
  for (const [name, args, errorType] of cases) {
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [name], limits: { toolTimeoutMs: timeoutMs } } })).json()
    devModel.script({ toolCalls: [{ name, arguments: args as Record<string, unknown> }] }, { text: 'ok' })
    const started = Date.now()
    const running = app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'go' } })
    // The dev model's script is shared: let this run take its tool call before the other session asks.
    for (let i = 0; i < 500; i++) {
      const started = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=tool:start`, headers: { accept: 'application/json' } })).json().data
      if (started.length > 0) break
      await new Promise((r) => setTimeout(r, 5))
    }
    // While the tool runs: liveness stays fast and another session completes a whole run.
    let slowest = 0
    let otherRuns = 0
    let finished = false
    void running.then(() => (finished = true))
    while (!finished) {
      const t0 = performance.now()
      await app.inject({ method: 'GET', url: '/healthz' })
      slowest = Math.max(slowest, performance.now() - t0)
      if (otherRuns === 0) {
        devModel.script({ text: 'still flowing' })
        const r = (await app.inject({ method: 'POST', url: `/v1/sessions/${other.id}/messages?wait=true`, payload: { content: 'ping' } })).json()
        if (r.run.status === 'completed') otherRuns++
      }
      await new Promise((r) => setTimeout(r, 20))
    }
    const elapsed = Date.now() - started
    const run = (await running).json().run
    const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=tool:error`, headers: { accept: 'application/json' } })).json().data
    t.equal(run.status, 'completed', `${name}: the run goes on`)
    t.match(events[0]?.data.error.errorType, errorType, `${name}: classified ${events[0]?.data.error.code}`)
    t.ok(elapsed < timeoutMs + 1000 + 500, `${name}: ended in ${elapsed} ms (timeout ${timeoutMs} ms)`)
    // A tool run on the event loop would hold /healthz for its whole timeout; under the full
    // suite on two shared cores a free loop still answered in up to ~150 ms once (a 100 ms bound failed a full run).
    t.ok(slowest < timeoutMs / 2, `${name}: /healthz answered within ${slowest.toFixed(1)} ms`)
    t.equal(otherRuns, 1, `${name}: another session completed a run meanwhile`)
  }
})

t.test('paths cannot leave the workspace', async (t) => {
  const ctx = await buildTestApp(t)
  const session = (await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  const workspace = join(ctx.dir, 'workspaces', session.id)
  mkdirSync(workspace, { recursive: true })
  symlinkSync('/etc', join(workspace, 'etc-link'))
  ctx.devModel.script({ toolCalls: [
    { name: 'fs_read', arguments: { path: '../../../etc/passwd' } },
    { name: 'fs_read', arguments: { path: '/etc/passwd' } },
    { name: 'fs_read', arguments: { path: 'etc-link/passwd' } },
    { name: 'fs_write', arguments: { path: 'etc-link/evil', content: 'x' } }
  ] }, { text: 'done' })
  await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'escape' } })
  const last = ctx.devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  const results = last.messages.filter((m) => m.role === 'tool').map((m) => JSON.parse(m.content))
  t.equal(results.length, 4)
  for (const result of results) t.match(result, { ok: false, code: 'PATH_TRAVERSAL' })
})

t.test('http_fetch refuses loopback and private addresses', async (t) => {
  const ctx = await buildTestApp(t)
  const { toolResults } = await runCalls(ctx, { tools: ['http_fetch'] }, [
    { name: 'http_fetch', arguments: { url: 'http://127.0.0.1:9/' } },
    { name: 'http_fetch', arguments: { url: 'http://10.1.2.3/' } },
    { name: 'http_fetch', arguments: { url: 'http://localhost:9/' } },
    { name: 'http_fetch', arguments: { url: 'http://169.254.169.254/latest/meta-data/' } }
  ])
  t.equal(toolResults.length, 4)
  for (const result of toolResults) {
    t.match(result, { ok: false })
    t.match(JSON.stringify(result), /private|loopback|link-local|metadata|not allowed|refused/i)
  }
})

t.test('approvals', async (t) => {
  const ctx = await buildTestApp(t)
  const { app, devModel } = ctx
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { approval: { mode: 'tools', tools: ['fs_write'] } } })).json()
  const waitFor = async (type: string, after = 0) => {
    for (let i = 0; i < 200; i++) {
      const page = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?after=${after}&types=${type}`, headers: { accept: 'application/json' } })).json()
      if (page.data.length > 0) return page.data[0] as StreamedEvent
      await new Promise((r) => setTimeout(r, 10))
    }
    throw new Error(`no ${type} event`)
  }
  const post = (path: string, payload: object) => app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/${path}`, payload })

  t.test('allow runs the call', async (t) => {
    devModel.script({ toolCalls: [{ name: 'fs_write', arguments: { path: 'ok.txt', content: 'yes' } }] }, { text: 'written' })
    const run = (await post('messages', { content: 'write' })).json().run
    const required = await waitFor('permission_required')
    t.equal(required.channel, 'control')
    t.equal(required.data.call.state, 'approval_required')
    t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().status, 'awaiting_approval')
    t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/runs/${run.id}` })).json().status, 'awaiting_approval')
    const bad = await post('approvals/call_nope', { decision: 'allow' })
    t.equal(bad.statusCode, 409)
    t.equal(bad.json().error.code, 'NOT_AWAITING')
    const ok = await post(`approvals/${required.data.call.id}`, { decision: 'allow', note: 'fine' })
    t.equal(ok.statusCode, 200)
    const again = await post(`approvals/${required.data.call.id}`, { decision: 'deny' })
    t.equal(again.statusCode, 409, 'a second decision is 409')
    t.equal(again.json().error.code, 'NOT_AWAITING')
    const finished = await app.agentd.runs.waitFor(session.id, run.id)
    t.equal(finished?.status, 'completed')
    const decided = await waitFor('permission_decided')
    t.same(decided.data, { callId: required.data.call.id, decision: 'allow', note: 'fine' })
    t.equal(readFileSync(join(ctx.dir, 'workspaces', session.id, 'ok.txt'), 'utf8'), 'yes')
  })

  t.test('deny reaches the model as DENIED_BY_USER', async (t) => {
    const before = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().lastSeq
    devModel.script({ toolCalls: [{ name: 'fs_write', arguments: { path: 'no.txt', content: 'no' } }] }, { text: 'understood' })
    const run = (await post('messages', { content: 'write again' })).json().run
    const required = await waitFor('permission_required', before)
    await post(`approvals/${required.data.call.id}`, { decision: 'deny', note: 'not that file' })
    await app.agentd.runs.waitFor(session.id, run.id)
    const last = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
    const result = JSON.parse(last.messages.filter((m) => m.role === 'tool').at(-1)?.content ?? '{}')
    t.match(result, { ok: false, code: 'DENIED_BY_USER', retryable: false })
    const end = await waitFor('tool:end', required.seq)
    t.equal(end.data.call.state, 'denied')
  })

  t.test('an interrupt while waiting ends the run cleanly', async (t) => {
    const before = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().lastSeq
    devModel.script({ toolCalls: [{ name: 'fs_write', arguments: { path: 'x.txt', content: 'x' } }] })
    await post('messages', { content: 'once more' })
    const required = await waitFor('permission_required', before)
    const res = await post('interrupt', {})
    t.equal(res.json().status, 'cancelled')
    const done = await waitFor('done', required.seq)
    t.equal(done.data.reason, 'interrupted')
    const messages = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
    t.match(JSON.parse(messages.at(-1).content), { ok: false, errorType: 'aborted' }, 'the call got a sealed answer')
    t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().status, 'idle')
    devModel.script({ text: 'back' })
    const next = (await post('messages?wait=true', { content: 'hello' })).json()
    t.equal(next.run.status, 'completed', 'the session works after the interrupt')
  })
})

t.test('client tools pause the run until the client posts the result', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const spec = { type: 'client', name: 'get_weather', description: 'Weather for a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [spec] } })).json()
  t.same(session.tools, [spec])
  devModel.script({ toolCalls: [{ name: 'get_weather', arguments: { city: 'Oslo' } }] }, { text: 'It is cold.' })
  const run = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'weather?' } })).json().run
  let required: StreamedEvent | undefined
  for (let i = 0; i < 200 && !required; i++) {
    required = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=tool_result_required`, headers: { accept: 'application/json' } })).json().data[0]
    if (!required) await new Promise((r) => setTimeout(r, 10))
  }
  t.ok(required, 'tool_result_required was emitted')
  t.match(required?.data.call, { name: 'get_weather', input: { city: 'Oslo' } })
  t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().status, 'awaiting_tool_result')
  const callId = required?.data.call.id
  const bad = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/tool-results/call_wrong`, payload: { output: 1 } })
  t.equal(bad.statusCode, 409)
  const badBody = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/tool-results/${callId}`, payload: { nothing: true } })
  t.equal(badBody.statusCode, 400)
  const ok = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/tool-results/${callId}`, payload: { output: { tempC: -3 } } })
  t.equal(ok.statusCode, 200)
  t.equal((await app.agentd.runs.waitFor(session.id, run.id))?.status, 'completed')
  const last = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  t.same(JSON.parse(last.messages.at(-1)?.content ?? 'null'), { tempC: -3 }, 'the model got the client output')
  const late = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/tool-results/${callId}`, payload: { output: 2 } })
  t.equal(late.statusCode, 409, 'a second result is 409')

  devModel.script({ toolCalls: [{ name: 'get_weather', arguments: { city: 5 } }] }, { text: 'oops' })
  const invalid = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'again' } })).json()
  t.equal(invalid.run.status, 'completed', 'bad arguments to a client tool do not pause the run')
  const sent = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  t.match(JSON.parse(sent.messages.at(-1)?.content ?? 'null'), { ok: false, errorType: 'validation', code: 'VALIDATION_ERROR' })
})

t.test("a client tool's pattern is the client's to check: a catastrophic one does not stall the service, and the model still sees it", async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const parameters = { type: 'object', properties: { word: { type: 'string', pattern: '^(a+)+$', minLength: 1 } }, required: ['word'] }
  const spec = { type: 'client', name: 'spell', description: 'Checks a word', parameters }
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [spec] } })).json()
  t.same(session.tools, [spec], 'the session keeps the schema as given')
  // Run on the main thread, ^(a+)+$ backtracks on this for about a minute (twice as long per extra "a").
  const word = 'a'.repeat(30) + '!'
  devModel.script({ toolCalls: [{ name: 'spell', arguments: { word } }] }, { text: 'checked' })
  const started = Date.now()
  const run = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'spell it' } })).json().run
  let required: StreamedEvent | undefined
  while (!required && Date.now() - started < 5000) {
    required = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=tool_result_required`, headers: { accept: 'application/json' } })).json().data[0]
    if (!required) await new Promise((r) => setTimeout(r, 10))
  }
  const elapsed = Date.now() - started
  t.ok(elapsed < 5000, `the call reached the client in ${elapsed} ms`)
  t.match(required?.data.call, { name: 'spell', input: { word } }, 'the arguments are passed on unchecked against the pattern')
  const offered = (devModel.requests[0]?.body as { tools: Array<{ function: { name: string; parameters: unknown } }> }).tools
  t.same(offered.find((tool) => tool.function.name === 'spell')?.function.parameters, parameters, 'the model was offered the pattern')
  const callId = required?.data.call.id
  t.equal((await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/tool-results/${callId}`, payload: { output: { ok: true } } })).statusCode, 200)
  t.equal((await app.agentd.runs.waitFor(session.id, run.id))?.status, 'completed')
})

t.test('webhook tools: allowed hosts only, the answer is the result', async (t) => {
  const received: unknown[] = []
  const server = createServer((req, res) => {
    let body = ''
    req.on('data', (c) => (body += c))
    req.on('end', () => {
      received.push(JSON.parse(body))
      res.setHeader('content-type', 'application/json')
      if (req.url?.startsWith('/fail')) res.statusCode = 500
      res.end(JSON.stringify({ price: 42 }))
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  t.teardown(() => server.close())
  const port = (server.address() as { port: number }).port
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_WEBHOOK_HOSTS: `127.0.0.1:${port}` } })
  const spec = { type: 'webhook', name: 'price', description: 'price lookup', parameters: { type: 'object', properties: { sku: { type: 'string' } } }, url: `http://127.0.0.1:${port}/price` }
  const refused = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [{ ...spec, url: 'http://evil.example/x' }] } })
  t.equal(refused.statusCode, 400)
  t.equal(refused.json().error.details.fields[0].field, 'body.tools[0].url')
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [spec] } })).json()
  devModel.script({ toolCalls: [{ name: 'price', arguments: { sku: 'A1' } }] }, { text: 'costs 42' })
  const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'price?' } })).json()
  t.equal(res.run.status, 'completed')
  t.match(received[0], { sessionId: session.id, name: 'price', input: { sku: 'A1' }, callId: /^call_/ })
  const last = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  t.same(JSON.parse(last.messages.at(-1)?.content ?? 'null'), { price: 42 })

  // A URL's query may hold a secret: a failing call shows neither the model nor the events it.
  const secretSpec = { ...spec, url: `http://127.0.0.1:${port}/fail?token=s3cr3t-value` }
  const failing = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [secretSpec] } })).json()
  devModel.script({ toolCalls: [{ name: 'price', arguments: { sku: 'B2' } }] }, { text: 'failed' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${failing.id}/messages?wait=true`, payload: { content: 'price?' } })
  const sent = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  const result = JSON.parse(sent.messages.at(-1)?.content ?? 'null')
  t.match(result, { ok: false, errorType: 'runtime' })
  t.notMatch(JSON.stringify(result), /s3cr3t/, 'the model does not see the secret')
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${failing.id}/events?limit=1000`, headers: { accept: 'application/json' } })).body
  t.notMatch(events, /s3cr3t/, 'no event carries it')
})

t.test('GET /v1/tools lists each tool with its JSON Schema', async (t) => {
  const { app } = await buildTestApp(t)
  const res = await app.inject({ method: 'GET', url: '/v1/tools' })
  t.equal(res.statusCode, 200)
  const names = res.json().data.map((tool: { name: string }) => tool.name)
  t.same(names.slice().sort(), ['fs_edit', 'fs_glob', 'fs_grep', 'fs_list', 'fs_read', 'fs_write', 'http_fetch'])
  const fsRead = res.json().data.find((tool: { name: string }) => tool.name === 'fs_read')
  t.match(fsRead.parameters, { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] })
  t.notOk(names.includes('bash_run'), 'bash_run is off unless enabled')
})

t.test('approval.tools takes name* patterns as hooks do: fs_wr* holds fs_write, fs_list runs at once', async (t) => {
  const ctx = await buildTestApp(t)
  const { app, devModel } = ctx
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { approval: { mode: 'tools', tools: ['fs_wr*'] } } })).json()
  t.ok(session.id, 'the session is created')
  devModel.script({ toolCalls: [{ name: 'fs_list', arguments: {} }] }, { toolCalls: [{ name: 'fs_write', arguments: { path: 'held.txt', content: 'x' } }] }, { text: 'done' })
  const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'list, then write' } })).json()
  t.equal(res.run.status, 'awaiting_approval', 'fs_write waits for a person; it was not written unasked')
  t.match(res.pendingCall, { name: 'fs_write' })
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000&types=permission_required`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  t.same(events.map((e) => e.data.call.name), ['fs_write'], 'fs_list did not match the pattern')
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/interrupt` })
})
