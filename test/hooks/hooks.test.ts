import { existsSync, mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { SqliteStore } from '../../src/store/sqlite.ts'
import { buildTestApp, tempDir, type TapTest, type TestApp } from '../helpers/app.ts'
import { testSession } from '../store/contract.ts'
import { undocumentedEvents } from '../helpers/event-document.ts'
import { deadUrl, expectedSignature, hooksEnv, startHookServer, type HookAnswer } from '../helpers/hook-server.ts'
import { until } from '../helpers/server-process.ts'
import type { StreamedEvent } from '../helpers/sse.ts'
import { fullDisk } from '../helpers/store-faults.ts'
import { selfSignedCertificate, serveHttps } from '../helpers/tls.ts'

const SECRET = 'hook-secret-0123456789abcdef'

/** Sends one message whose first model answer makes the given tool calls; returns the run, its events and what the model got back. */
async function runCalls(ctx: TestApp, sessionBody: object, calls: Array<{ name: string; arguments: unknown }>) {
  const { app, devModel } = ctx
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: sessionBody })).json()
  devModel.script({ toolCalls: calls as never }, { text: 'all done' })
  const res = await app.inject({
    method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'use the tools' }, headers: { 'x-request-id': 'req-hooks-1' }
  })
  return { session, run: res.json().run, ...(await observe(ctx, session.id)) }
}

/** The session's events; every one of them must match the OpenAPI document's Event union, as a generated client would check. */
async function observeEvents(ctx: TestApp, sessionId: string): Promise<StreamedEvent[]> {
  const events: StreamedEvent[] = (await ctx.app.inject({
    method: 'GET', url: `/v1/sessions/${sessionId}/events?limit=1000`, headers: { accept: 'application/json' }
  })).json().data
  const undocumented = undocumentedEvents(events)
  if (undocumented.length > 0) throw new Error(`events the OpenAPI document does not describe:\n${undocumented.join('\n')}`)
  return events
}

/**
 * The session's events and the tool results the model received last for it: the dev model's
 * last request from one of the session's runs (by X-Request-Id), since another session's run
 * may have asked the model after it.
 */
async function observe(ctx: TestApp, sessionId: string) {
  const events = await observeEvents(ctx, sessionId)
  const requestIds = new Set(events.map((e) => e.requestId))
  const last = ctx.devModel.requests.findLast((r) => requestIds.has(String(r.headers['x-request-id'])))?.body as
    { messages: Array<{ role: string; content: string }> } | undefined
  const toolResults = (last?.messages ?? []).filter((m) => m.role === 'tool').map((m) => JSON.parse(m.content))
  return { events, toolResults }
}

const ofType = (events: StreamedEvent[], type: string) => events.filter((e) => e.type === type)

/** The README's policy: fs_write only under docs/. */
const docsOnly = (body: any): HookAnswer => {
  const path = String(body.call.input.path ?? '')
  return body.call.name === 'fs_write' && !path.startsWith('docs/')
    ? { json: { decision: 'deny', reason: 'fs_write is allowed only under docs/' } }
    : { json: { decision: 'allow' } }
}

t.test('a preToolUse policy denies fs_write outside docs/: the model hears the reason, the file is not written', async (t) => {
  const policy = await startHookServer(t, docsOnly)
  const ctx = await buildTestApp(t, { env: hooksEnv(t, [{ name: 'docs-only', on: 'preToolUse', url: policy.url, tools: ['fs_write'], secret: SECRET }]) })
  const { session, run, events, toolResults } = await runCalls(ctx, {}, [
    { name: 'fs_write', arguments: { path: 'docs/guide.md', content: '# guide' } },
    { name: 'fs_write', arguments: { path: 'src/main.ts', content: 'evil()' } },
    { name: 'fs_list', arguments: { path: '.' } }
  ])
  t.equal(run.status, 'completed', 'a denial does not end the run')
  const workspace = join(ctx.dir, 'workspaces', session.id)
  t.ok(existsSync(join(workspace, 'docs/guide.md')), 'the allowed write happened')
  t.notOk(existsSync(join(workspace, 'src/main.ts')), 'the denied write did not')
  t.match(toolResults[1], {
    ok: false, code: 'DENIED_BY_USER', errorType: 'aborted', retryable: false,
    error: /policy hook \(docs-only\) denied this call to fs_write: fs_write is allowed only under docs\//,
    detail: { deniedBy: 'hook', hook: 'docs-only', reason: 'fs_write is allowed only under docs/' }
  })
  t.same(ofType(events, 'hook_decided').map((e) => [e.data.hook, e.data.decision, e.data.reason]), [
    ['docs-only', 'allow', null],
    ['docs-only', 'deny', 'fs_write is allowed only under docs/']
  ], 'one hook_decided per covered call; fs_list is not covered')
  const ends = ofType(events, 'tool:end').map((e) => e.data.call.state)
  t.same(ends, ['completed', 'denied', 'completed'])

  t.equal(policy.received.length, 2)
  const [first] = policy.received
  t.equal(first?.headers['x-agentd-signature'], expectedSignature(SECRET, first?.raw ?? ''), 'signed with HMAC-SHA256 of the exact body')
  t.equal(first?.headers['x-request-id'], 'req-hooks-1', 'carries the request ID of the run')
  t.equal(first?.headers['x-agentd-event'], 'preToolUse')
  t.match(first?.body, { event: 'preToolUse', hook: 'docs-only', sessionId: session.id, runId: run.id, call: { name: 'fs_write', input: { path: 'docs/guide.md' }, state: 'pending' } })
})

t.test('ask turns a call into an approval, even when the session needs none', async (t) => {
  const hook = await startHookServer(t, () => ({ json: { decision: 'ask', reason: 'writes need a human' } }))
  const ctx = await buildTestApp(t, { env: hooksEnv(t, [{ on: 'preToolUse', url: hook.url, tools: ['fs_write'] }]) })
  const session = (await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  ctx.devModel.script({ toolCalls: [{ name: 'fs_write', arguments: { path: 'a.txt', content: 'x' } }] }, { text: 'done' })
  const accepted = (await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'write' } })).json()
  let events: StreamedEvent[] = []
  for (let i = 0; i < 200 && !events.some((e) => e.type === 'permission_required'); i++) {
    await new Promise((resolve) => setTimeout(resolve, 10))
    events = await observeEvents(ctx, session.id)
  }
  const required = ofType(events, 'permission_required')[0]
  t.ok(required, 'the call waits for an approval')
  t.match(ofType(events, 'hook_decided')[0]?.data, { hook: 'preToolUse#0', decision: 'ask', reason: 'writes need a human' })
  const decided = await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/approvals/${required?.data.call.id}`, payload: { decision: 'allow' } })
  t.equal(decided.statusCode, 200)
  const run = await ctx.app.agentd.runs.waitFor(session.id, accepted.run.id)
  t.equal(run?.status, 'completed')
  t.ok(existsSync(join(ctx.dir, 'workspaces', session.id, 'a.txt')), 'the approved call ran')
})

t.test('a hook may rewrite the input, which is checked again against the schema', async (t) => {
  const hook = await startHookServer(t, (body) => {
    const path = String(body.call.input.path)
    if (path === 'bad') return { json: { decision: 'allow', input: { path: 42, content: 'x' } } }
    return { json: { decision: 'allow', reason: 'moved into docs/', input: { ...body.call.input, path: `docs/${path}` } } }
  })
  const ctx = await buildTestApp(t, { env: hooksEnv(t, [{ name: 'jail', on: 'preToolUse', url: hook.url, tools: ['fs_write'] }]) })
  const { session, events, toolResults } = await runCalls(ctx, {}, [
    { name: 'fs_write', arguments: { path: 'notes.md', content: 'kept' } },
    { name: 'fs_write', arguments: { path: 'bad', content: 'x' } }
  ])
  t.ok(existsSync(join(ctx.dir, 'workspaces', session.id, 'docs/notes.md')), 'the tool got the rewritten path')
  t.notOk(existsSync(join(ctx.dir, 'workspaces', session.id, 'notes.md')))
  t.match(ofType(events, 'hook_decided')[0]?.data, { decision: 'allow', input: { path: 'docs/notes.md' } })
  t.match(ofType(events, 'tool:end')[0]?.data.call, { input: { path: 'docs/notes.md' }, state: 'completed' })
  t.match(toolResults[1], { ok: false, code: 'VALIDATION_ERROR', errorType: 'validation', error: /the hook jail gave fs_write fail its schema/ })
  const warn = ofType(events, 'error').find((e) => e.data.phase === 'system')
  t.match(warn?.data, { severity: 'warn', message: /Hook jail \(preToolUse\) failed: its input fails the parameters schema of fs_write/ })
  const audit = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json()
  t.match(audit.data[0], { name: 'fs_write', input: { path: 'docs/notes.md' } }, 'the audit shows the input the tool got')
})

t.test('postToolUse replaces what the model sees (redaction); the tool call keeps its real result', async (t) => {
  // The README's redaction hook: API keys out of whatever the model would read.
  const storedWhenHeard: Array<Promise<unknown>> = []
  const redactor = await startHookServer(t, (body) => {
    // What the store holds of the call as the hook hears of it (the read is made at once).
    storedWhenHeard.push(ctx.app.agentd.store.getToolCall(body.sessionId, body.call.id))
    const text = JSON.stringify(body.output)
    const clean = text.replace(/sk-[A-Za-z0-9]+/g, '[redacted]')
    return { json: clean === text ? {} : { output: JSON.parse(clean) } }
  })
  const ctx = await buildTestApp(t, { env: hooksEnv(t, [{ name: 'redact', on: 'postToolUse', url: redactor.url, tools: ['fs_read'], secret: SECRET }]) })
  const session = (await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  const workspace = join(ctx.dir, 'workspaces', session.id)
  mkdirSync(workspace, { recursive: true })
  writeFileSync(join(workspace, '.env'), 'OPENAI_API_KEY=sk-abc123secret\n')
  ctx.devModel.script({ toolCalls: [{ name: 'fs_read', arguments: { path: '.env' } }] }, { text: 'done' })
  await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'read it' } })
  const { events } = await observe(ctx, session.id)
  const sent = JSON.stringify(ctx.devModel.requests.at(-1)?.body.messages)
  t.notMatch(sent, /sk-abc123secret/, 'the secret never reaches the model')
  t.match(sent, /OPENAI_API_KEY=\[redacted\]/)
  t.match(redactor.received[0]?.body, { event: 'postToolUse', call: { name: 'fs_read', state: 'completed' } })
  t.match(await storedWhenHeard[0], { name: 'fs_read', state: 'executing' }, 'a hook hears of a call (read-only or not) whose start is stored')
  t.equal(redactor.received[0]?.headers['x-agentd-signature'], expectedSignature(SECRET, redactor.received[0]?.raw ?? ''))
  t.match(ofType(events, 'hook_decided')[0]?.data, { hook: 'redact', decision: 'replace' })
  const messages = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
  t.notMatch(JSON.stringify(messages), /sk-abc123secret/, 'the stored conversation holds what the model saw')
  const audit = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json()
  t.match(audit.data[0], { name: 'fs_read', state: 'completed', result: { content: 'OPENAI_API_KEY=sk-abc123secret' } }, 'the audit keeps the real result')
})

t.test("a postToolUse replacement larger than AGENTD_TOOL_MAX_OUTPUT_BYTES is cut like any tool's result", async (t) => {
  // Before, a hook's answer (up to its 1 MiB delivery limit) went to the model, its events and the stored conversation whole.
  const inflator = await startHookServer(t, () => ({ json: { output: 'x'.repeat(500_000) } }))
  const ctx = await buildTestApp(t, {
    env: { ...hooksEnv(t, [{ name: 'inflate', on: 'postToolUse', url: inflator.url, tools: ['fs_list'] }]), AGENTD_TOOL_MAX_OUTPUT_BYTES: '2000' }
  })
  const session = (await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  ctx.devModel.script({ toolCalls: [{ name: 'fs_list', arguments: {} }] }, { text: 'done' })
  await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'list' } })
  const tool = (ctx.devModel.requests.at(-1)?.body.messages as Array<{ role: string; content: string }>).find((m) => m.role === 'tool')
  t.ok(tool && tool.content.length < 3000, `the model got ${tool?.content.length} characters`)
  t.match(tool?.content, /^x{100}.*output truncated: showing the first \d+ of 500000 bytes/s, 'the replacement, cut with a note')
})

const hostile: Array<[string, (t: TapTest) => Promise<string>, RegExp]> = [
  ['hangs past its timeout', async (t) => (await startHookServer(t, () => ({ hang: true }))).url, /did not answer within 400 ms/],
  ['answers 500', async (t) => (await startHookServer(t, () => ({ status: 500, text: 'boom' }))).url, /answered HTTP 500/],
  ['answers non-JSON', async (t) => (await startHookServer(t, () => ({ text: '<html>ok</html>' }))).url, /body that is not JSON/],
  ['is not listening', async () => deadUrl(), /could not be reached \(ECONNREFUSED\)/],
  ['answers {decision: "maybe"}', async (t) => (await startHookServer(t, () => ({ json: { decision: 'maybe' } }))).url, /decision "maybe" is not one of allow, deny, ask/]
]

for (const [behaviour, start, failure] of hostile) {
  t.test(`a hook that ${behaviour}: the run goes on per onFailure, a warn names it, /healthz and other sessions are untouched`, async (t) => {
    const url = await start(t)
    const ctx = await buildTestApp(t, {
      env: hooksEnv(t, [
        { name: 'lenient', on: 'preToolUse', url, tools: ['fs_list'], timeoutMs: 400 },
        { name: 'strict', on: 'preToolUse', url, tools: ['fs_write'], timeoutMs: 400, onFailure: 'deny' }
      ])
    })
    const { app, devModel } = ctx
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
    const other = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
    devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }, { name: 'fs_write', arguments: { path: 'a.txt', content: 'x' } }] }, { text: 'done' })
    const accepted = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'go' } })).json()
    // Probe while the run is with the hook: tool:start is committed just before the hook is asked.
    for (let i = 0; i < 200 && !(await observeEvents(ctx, session.id)).some((e) => e.type === 'tool:start'); i++) {
      await new Promise((resolve) => setTimeout(resolve, 5))
    }

    const probeStarted = performance.now()
    const health = await app.inject({ method: 'GET', url: '/healthz' })
    t.equal(health.statusCode, 200)
    t.ok(performance.now() - probeStarted < 250, '/healthz answers at once')
    devModel.script({ text: 'the other session answers' })
    const otherRun = (await app.inject({ method: 'POST', url: `/v1/sessions/${other.id}/messages?wait=true`, payload: { content: 'hi' } })).json()
    t.equal(otherRun.run.status, 'completed', 'another session runs meanwhile')

    await app.agentd.runs.waitFor(session.id, accepted.run.id)
    const run = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/runs/${accepted.run.id}` })).json()
    t.equal(run.status, 'completed', 'the run goes on')
    const { events, toolResults } = await observe(ctx, session.id)
    t.equal(toolResults[0].ok, undefined, 'onFailure continue: fs_list ran')
    t.match(toolResults[0], { entries: Array })
    t.match(toolResults[1], { ok: false, code: 'DENIED_BY_USER', error: /strict.*onFailure is deny/ }, 'onFailure deny: fs_write was denied')
    t.notOk(existsSync(join(ctx.dir, 'workspaces', session.id, 'a.txt')))
    const warns = ofType(events, 'error').filter((e) => e.data.phase === 'system')
    t.equal(warns.length, 2, 'one warn per failed hook delivery')
    for (const [warn, name] of [[warns[0], 'lenient'], [warns[1], 'strict']] as const) {
      t.equal(warn?.data.severity, 'warn')
      t.match(warn?.data.message, new RegExp(`Hook ${name} \\(preToolUse\\) failed: `))
      t.match(warn?.data.message, failure)
      t.match(warn?.data.detail, { code: /^HOOK_/, detail: { hook: name, on: 'preToolUse' } })
    }
    t.same(ofType(events, 'hook_decided').map((e) => [e.data.hook, e.data.decision]), [['lenient', 'allow'], ['strict', 'deny']])
    const otherEvents = (await observe(ctx, other.id)).events
    t.notOk(otherEvents.some((e) => e.type === 'error' || e.type === 'hook_decided'), 'the other session saw nothing of it')
    const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body
    t.match(metrics, /agentd_hook_failures_total\{hook="lenient",code="HOOK_[A-Z_]+"\} 1/)
    t.match(metrics, /agentd_hook_decisions_total\{hook="strict",decision="deny"\} 1/)
  })
}

t.test('a failing postToolUse hook with onFailure deny withholds the output; with continue the model gets it unchanged', async (t) => {
  const broken = await startHookServer(t, () => ({ status: 503, text: 'down' }))
  const ctx = await buildTestApp(t, {
    env: hooksEnv(t, [
      { name: 'redact-strict', on: 'postToolUse', url: broken.url, tools: ['fs_read'], onFailure: 'deny' },
      { name: 'audit-lenient', on: 'postToolUse', url: broken.url, tools: ['fs_list'] }
    ])
  })
  const { run, toolResults, events } = await runCalls(ctx, {}, [
    { name: 'fs_read', arguments: { path: 'missing.txt' } },
    { name: 'fs_list', arguments: { path: '.' } }
  ])
  t.equal(run.status, 'completed')
  t.match(toolResults[0], { ok: false, code: 'UNKNOWN', error: /output of fs_read is withheld: its review hook \(redact-strict\) failed \(it answered HTTP 503\)/ })
  t.match(toolResults[1], { entries: Array })
  t.same(ofType(events, 'hook_decided').map((e) => e.data.decision), ['withhold', 'keep'])
  t.equal(ofType(events, 'error').filter((e) => e.data.phase === 'system').length, 2)
})

t.test('runEnd is delivered at least once: retried with backoff, same deliveryId, signed, with the request ID', async (t) => {
  const receiver = await startHookServer(t, (_body, index) => (index < 2 ? { status: 500, text: 'not yet' } : { text: 'thanks' }))
  const ctx = await buildTestApp(t, {
    env: hooksEnv(t, [{ name: 'ledger', on: 'runEnd', url: receiver.url, secret: SECRET }]),
    app: { hookRetry: { baseMs: 20, capMs: 40 } }
  })
  const session = (await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  ctx.devModel.script({ text: 'hello' })
  const { run } = (await ctx.app.inject({
    method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hi' }, headers: { 'x-request-id': 'req-run-end' }
  })).json()
  for (let i = 0; i < 300 && receiver.received.length < 3; i++) await new Promise((resolve) => setTimeout(resolve, 10))
  t.equal(receiver.received.length, 3, 'two failures, then delivered')
  const ids = new Set(receiver.received.map((r) => r.body.deliveryId))
  t.equal(ids.size, 1, 'one deliveryId across retries, for the receiver to drop duplicates')
  for (const delivery of receiver.received) {
    t.equal(delivery.headers['x-agentd-signature'], expectedSignature(SECRET, delivery.raw))
    t.equal(delivery.headers['x-request-id'], 'req-run-end')
    t.equal(delivery.headers['x-agentd-delivery'], delivery.body.deliveryId)
  }
  t.match(receiver.received[2]?.body, {
    event: 'runEnd', hook: 'ledger', sessionId: session.id, tenant: 'default',
    run: { id: run.id, status: 'completed', requestId: 'req-run-end', steps: 1, error: null, usage: { totalTokens: Number } }
  })
  const { events } = await observe(ctx, session.id)
  const warns = ofType(events, 'error').filter((e) => e.data.phase === 'system')
  t.equal(warns.length, 2, 'each failed attempt is a monitor warn')
  t.match(warns[0]?.data.message, /Hook ledger \(runEnd\) failed: it answered HTTP 500; retry 1 of 5 in \d+ ms/)
  t.match(warns[0]?.data.detail, { code: 'HOOK_HTTP_ERROR', detail: { hook: 'ledger', attempt: 1, status: 500 } })
})

t.test('runEnd hears of a run the recovery ended after a restart (it was never told)', async (t) => {
  const receiver = await startHookServer(t, () => ({ json: {} }))
  const db = join(tempDir(t), 'agentd.db')
  // The store as a process that died mid-run left it: the run running, its end never recorded.
  const before = new SqliteStore(db)
  await before.migrate()
  const now = new Date().toISOString()
  await before.createSession(testSession('ses_01M8EPAAAAAAAAAAAAAAAAAAAA', { tenant: 'default', tools: [] }))
  await before.commit([{
    type: 'newRun', run: { id: 'run_dead', sessionId: 'ses_01M8EPAAAAAAAAAAAAAAAAAAAA', status: 'running', requestId: 'req-dead', steps: 0,
      usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 }, error: null, messageId: 'msg_dead', input: 'hi', createdAt: now, startedAt: now, endedAt: null }
  }])
  await before.close()
  await buildTestApp(t, { env: { AGENTD_DB: db, ...hooksEnv(t, [{ name: 'ledger', on: 'runEnd', url: receiver.url }]) } })
  for (let i = 0; i < 300 && receiver.received.length === 0; i++) await new Promise((resolve) => setTimeout(resolve, 10))
  t.match(receiver.received[0]?.body, { event: 'runEnd', hook: 'ledger', tenant: 'default', run: { id: 'run_dead', status: 'failed', error: { errorType: 'exception' } } })
})

t.test('a run whose end the store could not record, ended later by the recovery, reaches runEnd once', async (t) => {
  const receiver = await startHookServer(t, () => ({ json: {} }))
  const logLines: string[] = []
  const { app, devModel } = await buildTestApp(t, { logLines, env: hooksEnv(t, [{ name: 'ledger', on: 'runEnd', url: receiver.url }]) })
  const disk = fullDisk(app.agentd.store)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'an answer that comes too late', delayMs: 300 })
  const { run } = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'x' } })).json()
  await until(async () => (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().status === 'running', 5000, 'the run started')
  disk.full = true
  await until(async () => logLines.some((line) => line.includes('could not record the end of the run')), 5000, 'the run failed to record its end')
  disk.full = false
  const ended = await until(async () => {
    const stored = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/runs/${run.id}` })).json()
    return stored.status === 'failed' ? stored : undefined
  }, 10_000, 'the recovery ended the run')
  t.match(ended, { error: { message: /ended by recovery/ } })
  await until(async () => receiver.received.some((d) => d.body.run?.id === run.id), 5000, 'the runEnd delivery')
  // Any second delivery goes out at once (the hooks are told in the background, with no backoff on a first attempt).
  await new Promise((resolve) => setTimeout(resolve, 500))
  const deliveries = receiver.received.filter((d) => d.body.run?.id === run.id)
  t.equal(deliveries.length, 1, 'one runEnd delivery for the run')
  t.match(deliveries[0]?.body, { event: 'runEnd', hook: 'ledger', run: { id: run.id, status: 'failed', error: { message: /ended by recovery/ } } })
})

/** A run with a runEnd hook to `url` (retried within milliseconds), and the monitor warns of its first failed delivery. */
async function runEndFailing(t: TapTest, url: string): Promise<{ ctx: TestApp; sessionId: string; warns: StreamedEvent[] }> {
  const ctx = await buildTestApp(t, { env: hooksEnv(t, [{ on: 'runEnd', url }]), app: { hookRetry: { baseMs: 5, capMs: 10 } } })
  const session = (await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  ctx.devModel.script({ text: 'hello' })
  await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hi' } })
  let warns: StreamedEvent[] = []
  for (let i = 0; i < 200 && warns.length === 0; i++) {
    await new Promise((resolve) => setTimeout(resolve, 10))
    warns = ofType(await observeEvents(ctx, session.id), 'error')
  }
  return { ctx, sessionId: session.id, warns }
}

t.test('a runEnd receiver whose TLS certificate is not trusted is not retried', async (t) => {
  const receiver = await serveHttps(t, selfSignedCertificate(t))
  const { ctx, sessionId, warns } = await runEndFailing(t, `https://localhost:${receiver.port}/hook`)
  t.match(warns[0]?.data.message, /failed: its TLS handshake failed \(DEPTH_ZERO_SELF_SIGNED_CERT\); giving up after 1 attempt$/)
  t.match(warns[0]?.data.detail, { code: 'HOOK_UNREACHABLE', retryable: false, detail: { errno: 'DEPTH_ZERO_SELF_SIGNED_CERT', reason: 'tls_error', attempt: 1 } })
  await new Promise((resolve) => setTimeout(resolve, 100))
  t.equal(ofType(await observeEvents(ctx, sessionId), 'error').length, 1, 'one attempt, no retries')
})

t.test('runEnd gives up after its retries and a refusing (4xx) receiver is not retried', async (t) => {
  const refusing = await startHookServer(t, () => ({ status: 400, text: 'bad' }))
  const { warns } = await runEndFailing(t, refusing.url)
  t.match(warns[0]?.data.message, /Hook runEnd#0 \(runEnd\) failed: it answered HTTP 400; giving up after 1 attempt$/)
  t.equal(refusing.received.length, 1)
})

t.test("a failed runEnd delivery is logged with the run's request ID", async (t) => {
  const refusing = await startHookServer(t, () => ({ status: 400, text: 'bad' }))
  const logLines: string[] = []
  const { app, devModel } = await buildTestApp(t, { logLines, env: hooksEnv(t, [{ on: 'runEnd', url: refusing.url }]) })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  devModel.script({ text: 'hello' })
  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hi' }, headers: { 'x-request-id': 'run-end-req' } })
  const runId = res.json().run.id
  const lines = () => logLines.map((line) => JSON.parse(line)).filter((line) => line.runId === runId && line.hook === 'runEnd#0')
  await until(async () => lines().length > 0, 5000, 'the failed delivery to be logged')
  t.match(lines()[0], { reqId: 'run-end-req', sessionId: session.id, msg: /answered HTTP 400; giving up/ })
})

t.test('an interrupt does not wait for a hung hook: the run is cancelled at once and the call sealed', async (t) => {
  const hung = await startHookServer(t, () => ({ hang: true }))
  const ctx = await buildTestApp(t, { env: hooksEnv(t, [{ on: 'preToolUse', url: hung.url, timeoutMs: 30_000 }]) })
  const session = (await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  ctx.devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }] }, { text: 'never' })
  await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'go' } })
  for (let i = 0; i < 300 && hung.received.length === 0; i++) await new Promise((resolve) => setTimeout(resolve, 10))
  t.equal(hung.received.length, 1, 'the run is waiting on the hook')
  const started = performance.now()
  const interrupted = await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/interrupt` })
  t.equal(interrupted.statusCode, 202)
  t.equal(interrupted.json().status, 'cancelled')
  t.ok(performance.now() - started < 2000, 'within moments, not the hook timeout')
  const end = ofType(await observeEvents(ctx, session.id), 'tool:end')[0]
  t.equal(end?.data.call.state, 'sealed')
})

t.test('a hook URL with user:password@ authenticates with Basic authorization, and the password is shown nowhere', async (t) => {
  const policy = await startHookServer(t, () => ({ json: { decision: 'allow' } }))
  const url = policy.url.replace('http://', 'http://agentd:pa%3Ass@')
  const ctx = await buildTestApp(t, { env: hooksEnv(t, [{ name: 'guarded', on: 'preToolUse', url, tools: ['fs_list'] }]) })
  const { run, events } = await runCalls(ctx, {}, [{ name: 'fs_list', arguments: { path: '.' } }])
  t.equal(run.status, 'completed')
  t.equal(policy.received[0]?.headers.authorization, `Basic ${Buffer.from('agentd:pa:ss').toString('base64')}`)
  t.match(ofType(events, 'hook_decided')[0]?.data, { hook: 'guarded', decision: 'allow' })
  t.notMatch(JSON.stringify(events), /pa%3Ass|pa:ss/, 'no event carries the password')
})

t.test('a hook answer nested thousands of levels deep is garbage like any other: a warn, and the run goes on', async (t) => {
  const deep = (depth: number) => '['.repeat(depth) + ']'.repeat(depth)
  const redact = await startHookServer(t, () => ({ text: `{"output":${deep(5000)}}` }))
  const policy = await startHookServer(t, () => ({ text: `{"decision":"allow","input":{"path":${deep(5000)}}}` }))
  const ctx = await buildTestApp(t, {
    env: hooksEnv(t, [{ name: 'policy', on: 'preToolUse', url: policy.url }, { name: 'redact', on: 'postToolUse', url: redact.url }])
  })
  const { run, events, toolResults } = await runCalls(ctx, {}, [{ name: 'fs_list', arguments: { path: '.' } }])
  t.equal(run.status, 'completed', 'the run is not failed by what a hook answered')
  const warns = ofType(events, 'error').map((e) => e.data)
  t.match(warns, [
    { severity: 'warn', phase: 'system', detail: { code: 'HOOK_INVALID_RESPONSE', detail: { hook: 'policy', maxDepth: 128 } } },
    { severity: 'warn', phase: 'system', detail: { code: 'HOOK_INVALID_RESPONSE', detail: { hook: 'redact', maxDepth: 128 } } }
  ])
  t.match(ofType(events, 'tool:end')[0]?.data.call, { state: 'completed', input: { path: '.' } }, 'the call ran with its own input')
  t.match(toolResults, [{ entries: Array }], 'the model got the output unchanged (onFailure: continue)')
})

t.test("a preToolUse deny with a huge reason is cut: the model's tool message and the events stay small", async (t) => {
  // Before, a reason as long as the delivery allows (1 MiB) went whole into hook_decided, the
  // DENIED_BY_USER message and its detail, every tool event that carries the error, and the model's context.
  const policy = await startHookServer(t, () => ({ json: { decision: 'deny', reason: `no: ${'r'.repeat(500_000)}` } }))
  const ctx = await buildTestApp(t, { env: hooksEnv(t, [{ name: 'wordy', on: 'preToolUse', url: policy.url, tools: ['fs_list'] }]) })
  const session = (await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  ctx.devModel.script({ toolCalls: [{ name: 'fs_list', arguments: {} }] }, { text: 'done' })
  const res = await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'list' } })
  t.equal(res.json().run.status, 'completed')
  const events = await observeEvents(ctx, session.id)
  const tool = (ctx.devModel.requests.at(-1)?.body.messages as Array<{ role: string; content: string }>).find((m) => m.role === 'tool')
  t.ok(tool && tool.content.length < 16_000, `the model got ${tool?.content.length} characters`)
  t.match(JSON.parse(tool?.content ?? '{}'), { code: 'DENIED_BY_USER', error: /denied this call to fs_list: no: r{100}/ })
  const decided = ofType(events, 'hook_decided')[0]
  t.equal(decided?.data.decision, 'deny')
  t.ok(String(decided?.data.reason).length <= 4200, `hook_decided's reason has ${String(decided?.data.reason).length} characters`)
  const bytes = events.reduce((sum, e) => sum + JSON.stringify(e).length, 0)
  t.ok(bytes < 100_000, `the run's events take ${bytes} bytes`)
})
