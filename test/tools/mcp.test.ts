import { readFileSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import t from 'tap'
import { SqliteStore } from '../../src/store/sqlite.ts'
import type { McpServersOptions } from '../../src/tools/mcp/servers.ts'
import { buildTestApp, tempDir, type TapTest, type TestApp } from '../helpers/app.ts'
import { startMcpHttpServer } from '../helpers/mcp-http-server.ts'
import type { StreamedEvent } from '../helpers/sse.ts'

const everything = new URL('../../node_modules/@modelcontextprotocol/server-everything/dist/index.js', import.meta.url).pathname
const misbehaving = new URL('../fixtures/mcp/misbehaving-server.ts', import.meta.url).pathname
const fast: Partial<McpServersOptions> = { backoffBaseMs: 50, backoffCapMs: 200, connectTimeoutMs: 30_000, killGraceMs: 500 }

/** The app with these MCP servers in its AGENTD_MCP_CONFIG file. */
async function appWithMcp(t: TapTest, servers: Record<string, unknown>, options: { mcp?: Partial<McpServersOptions>; env?: Record<string, string> } = {}): Promise<TestApp> {
  const file = join(tempDir(t), 'mcp.json')
  writeFileSync(file, JSON.stringify({ mcpServers: servers }))
  return buildTestApp(t, { env: { AGENTD_MCP_CONFIG: file, ...options.env }, app: { tools: { mcp: { ...fast, ...options.mcp } } } })
}

/** The misbehaving fixture server over stdio; its log file records cancellations and pids. */
function fixture(t: TapTest, env: Record<string, string> = {}) {
  const log = join(tempDir(t), 'fixture.log')
  writeFileSync(log, '')
  return { log, entry: { command: process.execPath, args: [misbehaving], env: { MCP_FIXTURE_LOG: log, ...env } } }
}

/** Runs one message whose first model answer makes these calls; returns the run, its events and the tool results the model got. */
async function runCalls(ctx: TestApp, sessionBody: object, calls: Array<{ name: string; arguments: unknown }>) {
  const { app, devModel } = ctx
  const created = await app.inject({ method: 'POST', url: '/v1/sessions', payload: sessionBody })
  if (created.statusCode !== 201) throw new Error(`session not created: ${created.body}`)
  const session = created.json()
  devModel.script({ toolCalls: calls as never }, { text: 'all done' })
  const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'use the tools' } })).json()
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  const last = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  const toolResults = last.messages.filter((m) => m.role === 'tool').map((m) => parsed(m.content))
  return { session, run: res.run, events, toolResults }
}

/** A tool message's content: JSON for objects (errors), the text itself for a text result. */
function parsed(content: string): unknown {
  try {
    return JSON.parse(content)
  } catch {
    return content
  }
}

async function tools(ctx: TestApp) {
  return (await ctx.app.inject({ method: 'GET', url: '/v1/tools' })).json() as {
    data: Array<{ name: string; server?: string; description: string; parameters: Record<string, unknown> }>
    servers: Array<{ name: string; state: string; tools: number; lastError: string | null; restarts: number; nextAttemptAt: string | null }>
  }
}

async function until(t: TapTest, what: string, check: () => Promise<boolean> | boolean, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
  t.pass(what)
}

/** Alive and not a zombie (an orphan killed by agentd waits for init to reap it). */
function running(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'))
  } catch {
    return false
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

t.test('the reference server over stdio: listed with schemas, called, validated, progress, images described', async (t) => {
  // A secret in agentd's own environment must not reach a stdio server.
  process.env['AGENTD_TEST_SECRET'] = 'do-not-pass-on'
  t.teardown(() => delete process.env['AGENTD_TEST_SECRET'])
  const ctx = await appWithMcp(t, { everything: { command: process.execPath, args: [everything, 'stdio'], env: { GREETING: 'from the entry' } } })
  const listed = await tools(ctx)
  t.match(listed.servers, [{ name: 'everything', transport: 'stdio', state: 'up', lastError: null }])
  const echo = listed.data.find((tool) => tool.name === 'everything__echo')
  t.match(echo, { server: 'everything', parameters: { type: 'object', properties: { message: { type: 'string' } }, required: ['message'] } })
  t.ok(listed.data.some((tool) => tool.name === 'fs_read' && tool.server === undefined), 'built-ins stay, without a server')

  const { run, events, toolResults } = await runCalls(ctx, { tools: ['everything__*'] }, [
    { name: 'everything__echo', arguments: { message: 'hi there' } },
    { name: 'everything__get-sum', arguments: { a: 2, b: 3 } },
    { name: 'everything__get-sum', arguments: { a: 'two', b: 3 } },
    { name: 'everything__trigger-long-running-operation', arguments: { duration: 0.3, steps: 3 } },
    { name: 'everything__get-tiny-image', arguments: {} },
    { name: 'everything__get-resource-reference', arguments: { resourceType: 'Text', resourceId: -1 } },
    { name: 'everything__get-env', arguments: {} }
  ])
  t.equal(run.status, 'completed')
  const [echoed, sum, invalid, long, image, refused, env] = toolResults as [string, string, Record<string, unknown>, string, string, Record<string, unknown>, Record<string, string>]
  t.match(echoed, /hi there/)
  t.match(sum, /5/)
  t.match(invalid, { ok: false, errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false })
  t.match((invalid['recommendations'] as string[]).join(' '), /"a" must be number/, 'the failing field is named')
  t.match(long, /completed/i)
  t.match(image, /\[image: image\/png, \d+ bytes/, 'the image is described, not dropped')
  t.match(env, { GREETING: 'from the entry', PATH: String }, "the server gets its entry's env and a small default one")
  t.notOk('AGENTD_TEST_SECRET' in env, "and none of agentd's own variables")
  t.match(refused, { ok: false, errorType: 'logical', retryable: true, error: /Invalid resourceId: -1/ }, 'an error result is logical with the server text')

  const longCall = events.find((e) => e.type === 'tool:start' && e.data.call.name === 'everything__trigger-long-running-operation')?.data.call
  const progress = events.filter((e) => e.type === 'tool:progress')
  // The SDK drops a progress notification that arrives right before the result (its handler is
  // removed with the request), so the last of the three may be missing.
  t.ok(progress.length >= 2, `tool:progress events (${progress.length})`)
  t.match(progress[0]?.data, { callId: longCall.id, name: 'everything__trigger-long-running-operation', progress: 1, total: 3 })
  t.match(progress[1]?.data, { callId: longCall.id, progress: 2, total: 3 })
})

t.test('a session selects MCP tools by name or <server>__*, and unknown ones are a 400', async (t) => {
  const { entry } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry })
  const create = (tools: unknown) => ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools } })
  t.equal((await create(['misbehaving__echo', 'fs_read'])).statusCode, 201)
  t.equal((await create(['misbehaving__*'])).statusCode, 201)
  const unknown = await create(['misbehaving__nope'])
  t.equal(unknown.statusCode, 400)
  t.match(unknown.json().error.message, /unknown tool misbehaving__nope; the MCP server misbehaving offers .*misbehaving__echo/)
  const noServer = await create(['nosuch__*'])
  t.equal(noServer.statusCode, 400)
  t.match(noServer.json().error.message, /unknown tool nosuch__\*/)

  const { toolResults } = await runCalls(ctx, { tools: ['misbehaving__echo'] }, [
    { name: 'misbehaving__echo', arguments: { text: 'one' } },
    { name: 'misbehaving__fail', arguments: { why: 'x' } }
  ])
  t.equal(toolResults[0], 'one')
  t.match(toolResults[1], { errorType: 'validation', code: 'TOOL_NOT_FOUND' }, 'only the selected tools are offered')
})

t.test('isError results are logical with the server text; content blocks become readable text', async (t) => {
  const { entry } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry })
  const { toolResults, events } = await runCalls(ctx, { tools: ['misbehaving__*'] }, [
    { name: 'misbehaving__fail', arguments: { why: 'the disk is full' } },
    { name: 'misbehaving__mixed', arguments: {} }
  ])
  t.match(toolResults[0], { ok: false, errorType: 'logical', code: 'UNKNOWN', retryable: true, error: 'could not do it: the disk is full' })
  t.match((toolResults[0] as { recommendations: string[] }).recommendations.join(' '), /misbehaving__fail ran and reported this error/)
  t.ok(events.some((e) => e.type === 'tool:error' && e.data.error.errorType === 'logical'), 'a tool:error event')
  t.equal(toolResults[1], [
    'here it is',
    '[image: image/png, 16 bytes; the image itself is not shown here]',
    '[resource file:///notes.txt]\nnote text',
    '[resource file:///blob.bin: application/octet-stream, 8 bytes; binary content not shown]',
    '[resource link: more.txt file:///more.txt (text/plain)]'
  ].join('\n'))
})

t.test('content blocks of a type agentd does not know are described; the rest of the result is kept', async (t) => {
  const ctx = await appWithMcp(t, { raw: rawServer([{ name: 'future', inputSchema: { type: 'object' } }]) })
  const { toolResults } = await runCalls(ctx, { tools: ['raw__future'] }, [{ name: 'raw__future', arguments: {} }])
  t.equal(toolResults[0], '[video content; not shown]\n[a content block that is not an object; not shown]\ncaption')
})

t.test('an isError result is capped like any result: a huge one does not make a huge event', async (t) => {
  const { entry } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry })
  const { events } = await runCalls(ctx, { tools: ['misbehaving__fail'] }, [{ name: 'misbehaving__fail', arguments: { why: 'y', times: 2_000_000 } }])
  const error = events.find((e) => e.type === 'tool:error')
  const message = String(error?.data.error.message)
  t.ok(message.length < 101_000, `the message is cut (${message.length} characters)`)
  t.match(message.slice(-100), /\[output truncated: showing the first \d+ of 2000017 bytes\]$/)
  t.ok(JSON.stringify(error).length < 500_000, `the tool:error event is ${JSON.stringify(error).length} bytes`)
})

t.test('a hanging call times out as aborted and the server gets notifications/cancelled', async (t) => {
  const { entry, log } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry })
  const started = Date.now()
  const { toolResults, run } = await runCalls(ctx, { tools: ['misbehaving__*'], limits: { toolTimeoutMs: 300 } }, [
    { name: 'misbehaving__hang', arguments: {} },
    { name: 'misbehaving__echo', arguments: { text: 'still answering' } }
  ])
  t.ok(Date.now() - started < 5000, 'the run did not wait for the server')
  t.equal(run.status, 'completed')
  t.match(toolResults[0], { ok: false, errorType: 'aborted', code: 'TIMEOUT', retryable: false })
  t.equal(toolResults[1], 'still answering', 'the connection is still usable')
  await until(t, 'the server saw the cancellation', () => /cancelled \d+/.test(readFileSync(log, 'utf8')))
})

t.test('an interrupt cancels the MCP request and ends the call as aborted', async (t) => {
  const { entry, log } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry })
  const { app, devModel } = ctx
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['misbehaving__hang'] } })).json()
  devModel.script({ toolCalls: [{ name: 'misbehaving__hang', arguments: {} }] as never }, { text: 'unused' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'hang' } })
  const events = async () => (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data as StreamedEvent[]
  await until(t, 'the server is running the call', () => /hanging \d+/.test(readFileSync(log, 'utf8')))
  const interrupted = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/interrupt` })
  t.equal(interrupted.statusCode, 202)
  await until(t, 'the run is done', async () => (await events()).some((e) => e.type === 'done'))
  const end = (await events()).find((e) => e.type === 'tool:end')
  t.match(end?.data.call, { name: 'misbehaving__hang', state: 'sealed', error: { errorType: 'aborted' } })
  await until(t, 'the server saw the cancellation', () => /cancelled \d+/.test(readFileSync(log, 'utf8')))
})

t.test('a server killed mid-call: exception, retryable, with a recommendation; restarted with backoff', async (t) => {
  const { entry, log } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry }, { mcp: { backoffBaseMs: 1500, backoffCapMs: 1500 } })
  const { toolResults, run } = await runCalls(ctx, { tools: ['misbehaving__*'] }, [
    { name: 'misbehaving__die', arguments: {} },
    { name: 'misbehaving__echo', arguments: { text: 'while down' } }
  ])
  t.equal(run.status, 'completed', 'the run goes on')
  t.match(toolResults[0], { ok: false, errorType: 'exception', code: 'IO_ERROR', retryable: true, detail: { reason: 'connection_lost', server: 'misbehaving' } })
  t.match((toolResults[0] as { recommendations: string[] }).recommendations.join(' '), /retry misbehaving__die/)
  t.match(toolResults[1], { ok: false, errorType: 'exception', code: 'IO_ERROR', retryable: true, detail: { reason: 'server_unavailable', state: 'down' } })
  t.match((toolResults[1] as { recommendations: string[] }).recommendations.join(' '), /restarts the MCP server "misbehaving" by itself/)

  const down = await tools(ctx)
  t.match(down.servers, [{ name: 'misbehaving', state: 'down', lastError: /exited with code 7/ }])
  t.ok(down.data.some((tool) => tool.name === 'misbehaving__echo'), 'its tools stay listed while it is down')
  const ready = await ctx.app.inject({ method: 'GET', url: '/readyz' })
  t.equal(ready.statusCode, 200, 'an MCP server down does not make agentd unready')
  t.match(ready.json().mcp, [{ name: 'misbehaving', state: 'down' }])

  await until(t, 'the server is restarted', async () => (await tools(ctx)).servers[0]?.state === 'up')
  t.match((await tools(ctx)).servers[0], { restarts: 1, lastError: null })
  t.equal(readFileSync(log, 'utf8').match(/started/g)?.length, 2, 'a second process was started')
  const again = await runCalls(ctx, { tools: ['misbehaving__echo'] }, [{ name: 'misbehaving__echo', arguments: { text: 'back' } }])
  t.equal(again.toolResults[0], 'back')
})

t.test('a server that floods: a large result is cut with a note, an endless line stops the server', async (t) => {
  const { entry } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry }, { mcp: { maxMessageBytes: 1024 * 1024 } })
  const { toolResults, run } = await runCalls(ctx, { tools: ['misbehaving__*'], limits: { toolTimeoutMs: 10_000 } }, [
    { name: 'misbehaving__big', arguments: { bytes: 300_000 } },
    { name: 'misbehaving__flood_stdout', arguments: {} }
  ])
  t.equal(run.status, 'completed')
  const big = toolResults[0] as string
  t.ok(big.length < 101_000, `cut to the output cap (${big.length} characters)`)
  t.match(big, /\[output truncated: showing the first \d+ of 300000 bytes\]$/)
  t.match(toolResults[1], { ok: false, code: 'OUTPUT_TOO_LARGE', errorType: 'runtime', detail: { reason: 'message_too_large' } })
  await until(t, 'the server is back after being stopped', async () => (await tools(ctx)).servers[0]?.state === 'up')
})

t.test('a flood of progress notifications becomes a bounded number of tool:progress events', async (t) => {
  const { entry } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry })
  const { toolResults, events, run } = await runCalls(ctx, { tools: ['misbehaving__flood_progress'] }, [{ name: 'misbehaving__flood_progress', arguments: { count: 2000 } }])
  t.equal(run.status, 'completed')
  t.equal(toolResults[0], 'sent 2000')
  const progress = events.filter((e) => e.type === 'tool:progress')
  t.match(progress[0]?.data, { progress: 1, total: 2000 }, 'the first ones are reported')
  t.ok(progress.length >= 10 && progress.length <= 40, `a burst of them, not all 2000 (${progress.length})`)
})

t.test('the tool list follows notifications/tools/list_changed', async (t) => {
  const { entry } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry })
  t.notOk((await tools(ctx)).data.some((tool) => tool.name === 'misbehaving__added'))
  await runCalls(ctx, { tools: ['misbehaving__add_tool'] }, [{ name: 'misbehaving__add_tool', arguments: {} }])
  await until(t, 'the new tool is listed', async () => (await tools(ctx)).data.some((tool) => tool.name === 'misbehaving__added'))
  const { toolResults } = await runCalls(ctx, { tools: ['misbehaving__added'] }, [{ name: 'misbehaving__added', arguments: {} }])
  t.equal(toolResults[0], 'I am new')
})

t.test('closing the app stops a stdio server with its whole process group', async (t) => {
  const { entry, log } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry })
  await runCalls(ctx, { tools: ['misbehaving__spawn_child'] }, [{ name: 'misbehaving__spawn_child', arguments: {} }])
  const text = readFileSync(log, 'utf8')
  const serverPid = Number(/started (\d+)/.exec(text)?.[1])
  const childPid = Number(/child (\d+)/.exec(text)?.[1])
  t.ok(alive(serverPid) && alive(childPid), 'server and its child run')
  await ctx.app.close()
  await until(t, 'both are gone', () => !alive(serverPid) && !alive(childPid), 5000)
})

t.test('a start that fails after the MCP servers started stops them: none outlives the process', async (t) => {
  // Before, buildApp threw (here: the recovery's first read) with the servers running in process
  // groups of their own, and server.ts exited without an app to close: they were orphaned.
  const { log, entry } = fixture(t)
  const file = join(tempDir(t), 'mcp.json')
  writeFileSync(file, JSON.stringify({ mcpServers: { fixture: entry } }))
  const store = new SqliteStore(':memory:')
  t.teardown(() => store.close())
  store.listUnfinishedRuns = async () => { throw new Error('the store failed at start') }
  await t.rejects(buildTestApp(t, { env: { AGENTD_MCP_CONFIG: file }, store, app: { tools: { mcp: fast } } }), /the store failed at start/)
  const pid = Number(/started (\d+)/.exec(readFileSync(log, 'utf8'))?.[1])
  t.ok(pid > 0, `the server had started (pid ${pid})`)
  const alive = () => { try { process.kill(pid, 0); return true } catch { return false } }
  for (let i = 0; i < 100 && alive(); i++) await new Promise((resolve) => setTimeout(resolve, 50))
  t.notOk(alive(), 'and is gone')
})

t.test('a stdio server that dies by itself takes what it started with it, before its restart', async (t) => {
  const { entry, log } = fixture(t)
  const ctx = await appWithMcp(t, { misbehaving: entry })
  await runCalls(ctx, { tools: ['misbehaving__spawn_child'] }, [{ name: 'misbehaving__spawn_child', arguments: {} }])
  const childPid = Number(/child (\d+)/.exec(readFileSync(log, 'utf8'))?.[1])
  t.ok(running(childPid), 'the server started a child')
  await runCalls(ctx, { tools: ['misbehaving__die'] }, [{ name: 'misbehaving__die', arguments: {} }])
  await until(t, 'the server is back', async () => (await tools(ctx)).servers[0]?.state === 'up')
  await until(t, 'the child of the dead server is gone', () => !running(childPid), 5000)
})

/** The raw fixture server over stdio, listing these tools exactly as given. */
function rawServer(tools: unknown[], env: Record<string, string> = {}) {
  return { command: process.execPath, args: [new URL('../fixtures/mcp/raw-server.ts', import.meta.url).pathname], env: { MCP_RAW_TOOLS: JSON.stringify(tools), ...env } }
}

t.test('a server that crashes each time soon after it is up is restarted with a growing delay', async (t) => {
  // Each attempt succeeds (initialize, tools/list), then the process exits: a crash loop.
  const ctx = await appWithMcp(t, { crashy: rawServer([], { MCP_RAW_EXIT_AFTER_LIST: '1' }) }, { mcp: { backoffBaseMs: 400, backoffCapMs: 10_000 } })
  let delay = 0
  await until(t, 'it went down a third time', async () => {
    const [server] = (await tools(ctx)).servers
    if (server?.state !== 'down' || server.restarts < 2 || !server.nextAttemptAt) return false
    delay = Date.parse(server.nextAttemptAt) - Date.now()
    return true
  })
  // Delays are half fixed, half random: 200-400 ms after the first crash, 800-1600 ms after the third.
  t.ok(delay > 500, `the next attempt is ${delay} ms away`)
})

t.test('tools whose names collide keep one name each: <server>__* stays selectable and a call reaches the first', async (t) => {
  const empty = { type: 'object', properties: {} }
  const ctx = await appWithMcp(t, { raw: rawServer([
    { name: 'get.item', inputSchema: empty },
    { name: 'get_item', inputSchema: empty },
    { name: 'twice', inputSchema: empty },
    { name: 'twice', inputSchema: empty }
  ]) })
  const listed = (await tools(ctx)).data.filter((tool) => tool.server === 'raw').map((tool) => tool.name)
  t.same(listed, ['raw__get_item', 'raw__twice'], 'each name is offered once')
  const { toolResults, run } = await runCalls(ctx, { tools: ['raw__*'] }, [{ name: 'raw__get_item', arguments: {} }])
  t.equal(run.status, 'completed')
  t.same(toolResults[0], { name: 'get.item', arguments: {} }, 'the first tool of that name is called')
})

t.test('a malformed tool is skipped, an output schema that cannot compile is not checked; the server stays up', async (t) => {
  const ctx = await appWithMcp(t, { raw: rawServer([
    { name: 'no_schema' },
    { name: 'string_schema', inputSchema: { type: 'string' } },
    { name: 'bad_output', inputSchema: { type: 'object' }, outputSchema: { type: 'object', $id: 'urn:bad' } },
    { name: 'fine', inputSchema: { type: 'object', properties: { n: { type: 'number' } } } }
  ]) })
  const listed = await tools(ctx)
  t.match(listed.servers, [{ name: 'raw', state: 'up', tools: 2, lastError: null }])
  t.same(listed.data.filter((tool) => tool.server === 'raw').map((tool) => tool.name), ['raw__bad_output', 'raw__fine'])
  const { toolResults } = await runCalls(ctx, { tools: ['raw__*'] }, [
    { name: 'raw__fine', arguments: { n: 1 } },
    { name: 'raw__bad_output', arguments: {} }
  ])
  t.same(toolResults[0], { name: 'fine', arguments: { n: 1 } })
  t.same(toolResults[1], { name: 'bad_output', arguments: {} })
})

t.test("a server's regular expressions are left to the server: a catastrophic one does not stall agentd", async (t) => {
  const ctx = await appWithMcp(t, { raw: rawServer([{
    name: 'lookup',
    inputSchema: { type: 'object', properties: { id: { type: 'string', pattern: '^(a+)+$' }, n: { type: 'number' } }, required: ['id'] }
  }]) })
  const listed = (await tools(ctx)).data.find((tool) => tool.name === 'raw__lookup')
  t.match(listed?.parameters, { properties: { id: { pattern: '^(a+)+$' } } }, 'the model still sees the pattern')
  // Matching this against ^(a+)+$ backtracks 2^27 times: about 15 s of the main thread.
  const evil = `${'a'.repeat(27)}!`
  const started = Date.now()
  const { toolResults } = await runCalls(ctx, { tools: ['raw__lookup'] }, [
    { name: 'raw__lookup', arguments: { id: evil } },
    { name: 'raw__lookup', arguments: { n: 'one' } }
  ])
  t.ok(Date.now() - started < 5000, `answered in ${Date.now() - started} ms`)
  t.same(toolResults[0], { name: 'lookup', arguments: { id: evil } }, 'the server gets the arguments and judges them')
  t.match(toolResults[1], { errorType: 'validation', code: 'VALIDATION_ERROR', error: /'id'|\/n/ }, 'the rest of the schema is still checked')
})

t.test('a tools/list that pages forever ends as a failed attempt, not a start-up that never ends', async (t) => {
  const started = Date.now()
  const ctx = await appWithMcp(t, { endless: rawServer([], { MCP_RAW_CURSOR: 'again' }) }, { mcp: { backoffBaseMs: 60_000, backoffCapMs: 60_000 } })
  t.ok(Date.now() - started < 20_000, `the app was built in ${Date.now() - started} ms`)
  t.match((await tools(ctx)).servers, [{ name: 'endless', state: 'down', lastError: /tools\/list/ }])
})

t.test('a tool the server withdrew during a run is refused by agentd as no longer offered', async (t) => {
  const empty = { type: 'object', properties: {} }
  const ctx = await appWithMcp(t, { raw: rawServer([{ name: 'withdraw', inputSchema: { type: 'object' } }, { name: 'old', inputSchema: empty }]) })
  const session = (await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['raw__*'] } })).json()
  ctx.devModel.script(
    { toolCalls: [{ name: 'raw__withdraw', arguments: { name: 'old' } }] as never },
    { toolCalls: [{ name: 'raw__old', arguments: {} }] as never },
    { text: 'done' }
  )
  const { run } = (await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'go' } })).json()
  t.equal(run.status, 'completed')
  const last = ctx.devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  const [withdrew, old] = last.messages.filter((m) => m.role === 'tool').map((m) => parsed(m.content)) as [string, Record<string, unknown>]
  t.equal(withdrew, 'withdrew old')
  t.match(old, { ok: false, errorType: 'runtime', code: 'CONFIG_ERROR', retryable: false, detail: { reason: 'tool_withdrawn' } })
  t.match((old['recommendations'] as string[]).join(' '), /do not call raw__old again/i)
})

t.test('a tool description longer than providers accept is cut for the model; GET /v1/tools shows it whole', async (t) => {
  const long = 'Looks a record up by its id and answers with every field of it. '.repeat(50).slice(0, 3000)
  const smiles = '\u{1F600}'.repeat(1500)
  const idDescription = 'The id of the record, as the ticket system shows it. '.repeat(60).slice(0, 3000)
  const ctx = await appWithMcp(t, { raw: rawServer([
    { name: 'lookup', description: long, inputSchema: { type: 'object', properties: { id: { type: 'string', description: idDescription } } } },
    { name: 'smile', description: smiles, inputSchema: { type: 'object' } }
  ]) })
  const listed = (await tools(ctx)).data
  t.equal(listed.find((tool) => tool.name === 'raw__lookup')?.description, long, 'GET /v1/tools shows all 3000 characters')
  t.equal(listed.find((tool) => tool.name === 'raw__smile')?.description, smiles, 'and every emoji')

  const ask = { type: 'client', name: 'ask_user', description: 'Asks the user a question. '.repeat(160).slice(0, 4000), parameters: { type: 'object', properties: {} } }
  const session = (await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['raw__*', ask] } })).json()
  ctx.devModel.script({ text: 'nothing to look up' })
  const { run } = (await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hello' } })).json()
  t.equal(run.status, 'completed', 'the model call went through')
  const offered = new Map((ctx.devModel.requests.at(-1)?.body.tools ?? []).flatMap((tool) => (tool.type === 'function' ? [[tool.function.name, tool.function] as const] : [])))
  t.equal(offered.size, 3, 'the model is offered the three tools')
  for (const [name, fn] of offered) t.ok(String(fn.description).length <= 1024, `${name}: the model got ${fn.description?.length} characters`)
  t.equal(offered.get('raw__lookup')?.description, `${long.slice(0, 1023)}…`, 'cut at the limit, ending with …')
  t.equal(offered.get('raw__smile')?.description, `${'\u{1F600}'.repeat(511)}…`, 'never inside a surrogate pair')
  t.equal(offered.get('ask_user')?.description, `${ask.description.slice(0, 1023)}…`, "a client tool's too")
  t.match(offered.get('raw__lookup')?.parameters, { properties: { id: { description: idDescription } } }, "a parameter's description is left whole")
})

t.test('a storm of list_changed notifications is followed by a few listings, not one each', async (t) => {
  const empty = { type: 'object', properties: {} }
  const ctx = await appWithMcp(t, { raw: rawServer([{ name: 'storm', inputSchema: empty }, { name: 'lists', inputSchema: empty }]) })
  await runCalls(ctx, { tools: ['raw__storm'] }, [{ name: 'raw__storm', arguments: {} }])
  // Calls are answered in order, after every listing asked for before them.
  const { toolResults } = await runCalls(ctx, { tools: ['raw__lists'] }, [{ name: 'raw__lists', arguments: {} }])
  const lists = Number(toolResults[0])
  t.ok(lists >= 2 && lists <= 4, `tools/list answered ${lists} times (the first listing, then one or two for the storm)`)
})

t.test('two tools whose schemas share an $id are each checked against their own schema', async (t) => {
  const needs = (field: string) => ({ $id: 'https://example.com/arguments.json', type: 'object', allOf: [{ required: [field] }] })
  const ctx = await appWithMcp(t, { raw: rawServer([{ name: 'needs_a', inputSchema: needs('a') }, { name: 'needs_b', inputSchema: needs('b') }]) })
  const { toolResults } = await runCalls(ctx, { tools: ['raw__*'] }, [
    { name: 'raw__needs_b', arguments: { b: 1 } },
    { name: 'raw__needs_a', arguments: { b: 1 } }
  ])
  t.same(toolResults[0], { name: 'needs_b', arguments: { b: 1 } }, 'valid arguments reach the server')
  t.match(toolResults[1], { errorType: 'validation', code: 'VALIDATION_ERROR', error: /'a'/ })
})

t.test('a server that fails to start or hangs at start does not stop agentd; it shows as down and is retried', async (t) => {
  // A Streamable HTTP server that refuses agentd's credentials without a word.
  const locked = createServer((_req, res) => res.writeHead(401).end())
  await new Promise<void>((resolve) => locked.listen(0, '127.0.0.1', resolve))
  t.teardown(() => locked.close())
  const ctx = await appWithMcp(t, {
    locked: { url: `http://127.0.0.1:${(locked.address() as AddressInfo).port}/mcp` },
    broken: { command: process.execPath, args: ['-e', 'console.error("no API token given"); process.exit(3)'] },
    missing: { command: '/nonexistent/mcp-server' },
    elsewhere: { command: process.execPath, args: ['-e', ''], cwd: '/nonexistent/folder' },
    silent: { command: process.execPath, args: ['-e', 'setInterval(() => {}, 1000)'] },
    nowhere: { url: 'http://127.0.0.1:1/mcp' }
  }, { mcp: { connectTimeoutMs: 5000, backoffBaseMs: 100, backoffCapMs: 400 } })
  const { servers } = await tools(ctx)
  // A retry may be under way already (state starting); lastError stays until one succeeds.
  t.match(servers, [
    { name: 'locked', transport: 'http', state: /down|starting/, lastError: /^HTTP 401: / },
    { name: 'broken', state: /down|starting/, lastError: /exited with code 3 \(stderr: no API token given\)/ },
    { name: 'missing', state: /down|starting/, lastError: /ENOENT/ },
    { name: 'elsewhere', state: /down|starting/, lastError: 'its cwd /nonexistent/folder does not exist' },
    { name: 'silent', state: /down|starting/, lastError: /timed out/i },
    { name: 'nowhere', transport: 'http', state: /down|starting/, lastError: /fetch failed|ECONNREFUSED/ }
  ])
  const ready = await ctx.app.inject({ method: 'GET', url: '/readyz' })
  t.equal(ready.statusCode, 200)
  t.equal(ready.json().mcp.length, 6)
  await until(t, 'each is retried', async () => (await tools(ctx)).servers.every((s) => s.restarts >= 1), 30_000)
  t.equal((await ctx.app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200)
  const closing = Date.now()
  await ctx.app.close()
  t.ok(Date.now() - closing < 4000, 'closing does not wait for a server that never answers')
})

t.test('a Streamable HTTP server: headers, results, errors, progress, cancellation, unreachable', async (t) => {
  const http = await startMcpHttpServer()
  t.teardown(() => http.close())
  const ctx = await appWithMcp(t, { remote: { url: http.url, headers: { authorization: 'Bearer remote-secret' } } })
  const listed = await tools(ctx)
  t.match(listed.servers, [{ name: 'remote', transport: 'http', state: 'up' }])
  t.same(listed.data.filter((tool) => tool.server === 'remote').map((tool) => tool.name).sort(), ['remote__countdown', 'remote__echo', 'remote__fail', 'remote__hang'])
  t.equal(http.headers[0]?.authorization, 'Bearer remote-secret', 'the configured headers are sent')

  const { toolResults, events } = await runCalls(ctx, { tools: ['remote__*'], limits: { toolTimeoutMs: 500 } }, [
    { name: 'remote__echo', arguments: { text: 'over http' } },
    { name: 'remote__fail', arguments: {} },
    { name: 'remote__countdown', arguments: { steps: 2 } },
    { name: 'remote__hang', arguments: {} }
  ])
  t.equal(toolResults[0], 'over http')
  t.match(toolResults[1], { errorType: 'logical', error: 'the upstream system said no' })
  t.equal(toolResults[2], 'counted 2')
  t.match(events.filter((e) => e.type === 'tool:progress').map((e) => e.data), [
    { name: 'remote__countdown', progress: 1, total: 2, message: 'step 1' },
    { name: 'remote__countdown', progress: 2, total: 2, message: 'step 2' }
  ])
  t.match(toolResults[3], { errorType: 'aborted', code: 'TIMEOUT' })
  await until(t, 'the server saw the cancellation', () => http.cancelled.length === 1)

  await http.close()
  const gone = await runCalls(ctx, { tools: ['remote__echo'] }, [{ name: 'remote__echo', arguments: { text: 'anyone?' } }])
  t.match(gone.toolResults[0], { ok: false, errorType: 'exception', code: 'IO_ERROR', retryable: true })
  await until(t, 'the server shows as down', async () => (await tools(ctx)).servers[0]?.state !== 'up')
})

t.test('closing agentd ends its session on a Streamable HTTP server: a DELETE with the Mcp-Session-Id', async (t) => {
  const http = await startMcpHttpServer()
  t.teardown(() => http.close())
  const ctx = await appWithMcp(t, { remote: { url: http.url } })
  t.equal(http.sessions.length, 1, 'agentd has one session on the server')
  t.same(http.deletes, [], 'which it keeps while it runs')
  await ctx.app.close()
  t.same(http.deletes, http.sessions, 'the session agentd was handed is ended on close')
})

t.test('a Streamable HTTP server that never answers the DELETE does not hold the close of agentd', async (t) => {
  const http = await startMcpHttpServer({ holdDeletes: true })
  t.teardown(() => http.close())
  const ctx = await appWithMcp(t, { remote: { url: http.url } })
  const closing = Date.now()
  await ctx.app.close()
  const took = Date.now() - closing
  t.same(http.deletes, http.sessions, 'the DELETE was sent')
  t.ok(took < 6000, `agentd closed in ${took} ms`)
})

t.test('JSON-RPC errors are classified by code; a schema with allOf is still checked', async (t) => {
  const jsonrpc = new URL('../fixtures/mcp/jsonrpc-server.ts', import.meta.url).pathname
  const ctx = await appWithMcp(t, { rpc: { command: process.execPath, args: [jsonrpc] } })
  const { toolResults, run } = await runCalls(ctx, { tools: ['rpc__*'] }, [
    { name: 'rpc__invalid_params', arguments: {} },
    { name: 'rpc__no_method', arguments: {} },
    { name: 'rpc__internal', arguments: {} },
    { name: 'rpc__merge', arguments: { a: 'x' } },
    { name: 'rpc__merge', arguments: { a: 'x', b: 2 } }
  ])
  t.equal(run.status, 'completed')
  t.match(toolResults[0], { errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false, error: /JSON-RPC error -32602: .*path must be absolute/, detail: { jsonRpcCode: -32602 } })
  t.match(toolResults[1], { errorType: 'runtime', code: 'CONFIG_ERROR', retryable: false, detail: { jsonRpcCode: -32601 } })
  t.match(toolResults[2], { errorType: 'runtime', code: 'UNKNOWN', retryable: true, error: /database connection lost/ })
  t.match(toolResults[3], { errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false, error: /Invalid arguments for rpc__merge: .*'b'/ }, 'checked by agentd before the server sees it')
  t.same(toolResults[4], { a: 'x', b: 2 }, 'valid arguments reach the server')
  t.equal((await tools(ctx)).servers[0]?.state, 'up', 'a JSON-RPC error does not take the server down')
})

t.test('a Streamable HTTP server that goes away mid-call ends the call classified, before its timeout', async (t) => {
  const http = await startMcpHttpServer()
  t.teardown(() => http.close())
  const ctx = await appWithMcp(t, { remote: { url: http.url } })
  const started = Date.now()
  const running = runCalls(ctx, { tools: ['remote__hang'], limits: { toolTimeoutMs: 20_000 } }, [{ name: 'remote__hang', arguments: {} }])
  await until(t, 'the call is running on the server', () => http.hanging.length === 1)
  await http.close()
  const { toolResults } = await running
  t.match(toolResults[0], { ok: false, errorType: 'exception', code: 'IO_ERROR', retryable: true, detail: { reason: 'connection_lost' } })
  t.ok(Date.now() - started < 15_000, 'well before the 20 s timeout')
})

t.test("a preToolUse hook's rewrite of an MCP tool's input is checked against the whole schema (allOf) and names the hook", async (t) => {
  // Before, the hook's check passed anything for a schema only Ajv checks (allOf, $ref, a
  // pattern); the tool's own check then refused it as the model's mistake, naming no hook.
  const { startHookServer, hooksEnv } = await import('../helpers/hook-server.ts')
  const rewriter = await startHookServer(t, () => ({ json: { decision: 'allow', input: { a: 'x' } } }))
  const jsonrpc = new URL('../fixtures/mcp/jsonrpc-server.ts', import.meta.url).pathname
  const ctx = await appWithMcp(t, { rpc: { command: process.execPath, args: [jsonrpc] } }, {
    env: hooksEnv(t, [{ name: 'rewriter', on: 'preToolUse', url: rewriter.url, tools: ['rpc__merge'] }])
  })
  const { toolResults, events } = await runCalls(ctx, { tools: ['rpc__*'] }, [{ name: 'rpc__merge', arguments: { a: 'x', b: 2 } }])
  t.match(toolResults[0], { errorType: 'validation', code: 'VALIDATION_ERROR', error: /the hook rewriter gave rpc__merge fail its schema: .*'b'/, detail: { hook: 'rewriter' } })
  t.ok(events.some((e) => e.type === 'error' && /Hook rewriter/.test(String(e.data.message))), 'a monitor warn names the hook')
})

t.test("a progress notification's _meta and other fields stay out of tool:progress: {callId, name, progress, total?, message?}", async (t) => {
  // Before, the notification's _meta went into the stored event whole (200 kB here, up to the 16 MiB message limit).
  const ctx = await appWithMcp(t, { raw: rawServer([{ name: 'progress_meta', inputSchema: { type: 'object' } }]) })
  const { toolResults, events } = await runCalls(ctx, { tools: ['raw__progress_meta'] }, [{ name: 'raw__progress_meta', arguments: {} }])
  t.equal(toolResults[0], 'progressed')
  const progress = events.filter((e) => e.type === 'tool:progress')
  t.equal(progress.length, 1)
  t.same(progress[0]?.data, { callId: progress[0]?.data.callId, name: 'raw__progress_meta', progress: 1, total: 2, message: 'half' })
})

t.test('a result in the {toolResult} form of protocol 2024-10-07 (which the SDK negotiates) reaches the model', async (t) => {
  // Before, it had neither content nor structuredContent, and the model got an empty result.
  const ctx = await appWithMcp(t, { raw: rawServer([{ name: 'legacy', inputSchema: { type: 'object' } }]) })
  const { toolResults, run } = await runCalls(ctx, { tools: ['raw__legacy'] }, [{ name: 'raw__legacy', arguments: {} }])
  t.equal(run.status, 'completed')
  t.same(toolResults[0], { answer: 42 })
})

t.test('a result whose content is not a list of blocks is never an empty result: text and one block are read, else a classified error', async (t) => {
  const ctx = await appWithMcp(t, { raw: rawServer([{ name: 'content_as', inputSchema: { type: 'object' } }]) })
  const contents = ['bare text', { type: 'text', text: 'one block' }, 42, null, { answer: 1 }, [{ type: 'text', text: { not: 'a string' } }]]
  const { toolResults, run } = await runCalls(ctx, { tools: ['raw__content_as'] }, contents.map((content) => ({ name: 'raw__content_as', arguments: { content } })))
  t.equal(run.status, 'completed', 'the run goes on')
  t.same(toolResults.slice(0, 2), ['bare text', 'one block'])
  t.same(toolResults[5], { not: 'a string' }, 'a text block whose text is no string is shown as its JSON, not "[object Object]"')
  for (const [i, kind] of [[2, 'a number'], [3, 'null'], [4, 'an object that is not a content block']] as const) {
    t.match(toolResults[i], {
      ok: false, errorType: 'runtime', code: 'IO_ERROR', retryable: false,
      error: `The MCP server "raw" answered raw__content_as with a result agentd cannot read: its content is ${kind}, not a list of content blocks.`,
      recommendations: [/fault of the server: do not retry/],
      detail: { reason: 'invalid_result', server: 'raw', tool: 'raw__content_as' }
    }, `content ${JSON.stringify(contents[i])}`)
  }
})

t.test('a Streamable HTTP server that forgot agentd\'s session (404) gets a new one, and the call is sent again on it', async (t) => {
  // MCP: a 404 to a request with an Mcp-Session-Id means the server no longer knows the session
  // (it expired it, or restarted) and did not run the request; the client must start a new one.
  // Before, the call failed as "went away during the call", its effects "maybe partial", and the
  // server was marked down until its next attempt, failing the calls in between too.
  const http = await startMcpHttpServer()
  t.teardown(() => http.close())
  const ctx = await appWithMcp(t, { remote: { url: http.url } })
  const first = await runCalls(ctx, { tools: ['remote__echo'] }, [{ name: 'remote__echo', arguments: { text: 'first' } }])
  t.same(first.toolResults, ['first'])

  await http.forgetSessions()
  const { run, toolResults, events } = await runCalls(ctx, { tools: ['remote__echo'] }, [
    { name: 'remote__echo', arguments: { text: 'on a new session' } },
    { name: 'remote__echo', arguments: { text: 'and the next call' } }
  ])
  t.match(run, { status: 'completed' })
  t.same(toolResults, ['on a new session', 'and the next call'])
  t.notOk(events.some((e) => e.type === 'tool:error'), 'no call failed')
  t.equal(http.sessions.length, 2, 'one new session')
  t.match((await tools(ctx)).servers, [{ name: 'remote', state: 'up' }])
})

t.test('a Streamable HTTP server that expires agentd\'s idle session and ends its stream gets a new session at once, never shown as down', async (t) => {
  // The client reopens the ended stream with the old Mcp-Session-Id and gets a 404; so does the
  // ping that checks whether the server is there. Before, that ping marked the server down and
  // it came back only after its backoff (a restart), failing every call in between.
  const http = await startMcpHttpServer()
  t.teardown(() => http.close())
  const ctx = await appWithMcp(t, { remote: { url: http.url } })
  await http.forgetSessions({ closeStreams: true })
  await until(t, 'a new session was made', () => http.sessions.length === 2)
  await until(t, 'the server is up on it', async () => (await tools(ctx)).servers[0]?.state === 'up')
  t.match((await tools(ctx)).servers, [{ name: 'remote', state: 'up', restarts: 0, lastError: null }], 'not restarted after being down')
  const { toolResults } = await runCalls(ctx, { tools: ['remote__echo'] }, [{ name: 'remote__echo', arguments: { text: 'still here' } }])
  t.same(toolResults, ['still here'])
})

t.test('a Streamable HTTP server whose answer to a call ends without a result fails the call at once as connection lost, not at its timeout', async (t) => {
  // Before, the SDK kept waiting for the answer and reported nothing: the call ended at its
  // timeout, 20 s here, as TIMEOUT, which tells the model to ask for less, not to retry.
  const http = await startMcpHttpServer({ endWithoutAnswer: ['hang'] })
  t.teardown(() => http.close())
  const ctx = await appWithMcp(t, { remote: { url: http.url } })
  const started = Date.now()
  const { toolResults } = await runCalls(ctx, { tools: ['remote__*'], limits: { toolTimeoutMs: 20_000 } }, [
    { name: 'remote__hang', arguments: {} },
    { name: 'remote__echo', arguments: { text: 'the next call' } }
  ])
  t.match(toolResults[0], {
    ok: false, errorType: 'exception', code: 'IO_ERROR', retryable: true, error: /ended its answer without a result/, detail: { reason: 'connection_lost' }
  })
  t.equal(toolResults[1], 'the next call', 'the server was not taken for gone')
  t.ok(Date.now() - started < 15_000, 'well before the 20 s timeout')
})
