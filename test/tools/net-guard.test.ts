import t from 'tap'
import type { Test } from 'tap'
import { execFileSync } from 'node:child_process'
import dns from 'node:dns'
import dnsPromises from 'node:dns/promises'
import { closeSync, constants, openSync, writeFileSync } from 'node:fs'
import { open } from 'node:fs/promises'
import { syncBuiltinESMExports } from 'node:module'
import { join } from 'node:path'
import { setTimeout as delay } from 'node:timers/promises'
import { sentCallId } from '../../src/agent/conversation.ts'
import { createHttpFetchTool } from '../../src/tools/builtin/http-fetch.ts'
import { runTool } from '../../src/tools/runtime.ts'
import type { Tool } from '../../src/tools/types.ts'
import { makeWorkspace } from '../fixtures/tools/context.ts'
import { buildTestApp, tempDir } from '../helpers/app.ts'

// Names under .hang.test never answer. The tools' lookups (net-guard.ts) go through
// dns/promises' lookup, and a connection made without a lookup of its own (Node's and undici's
// default) through dns' lookup: both are replaced here for the whole process; other names resolve as usual.
type Lookup = typeof dnsPromises.lookup
type CallbackLookup = (hostname: string, options: unknown, callback?: (err: Error | null, ...rest: unknown[]) => void) => void

/** Replaces dns/promises' and dns' lookups for names under .hang.test until the test ends. */
function hangingNames(t: Test, hang: (hostname: string) => Promise<never>): void {
  const system = dnsPromises.lookup
  const lookup = ((hostname: string, options: never) => (hostname.endsWith('.hang.test') ? hang(hostname) : system(hostname, options))) as Lookup
  dnsPromises.lookup = lookup
  const systemCallback = dns.lookup as unknown as CallbackLookup
  const callbackLookup: CallbackLookup = (hostname, options, callback) => {
    if (!hostname.endsWith('.hang.test')) return systemCallback(hostname, options, callback)
    const done = (typeof options === 'function' ? options : callback) as (err: Error) => void
    hang(hostname).catch(done)
  }
  ;(dns as unknown as { lookup: CallbackLookup }).lookup = callbackLookup
  syncBuiltinESMExports()
  t.teardown(() => {
    dnsPromises.lookup = system
    ;(dns as unknown as { lookup: CallbackLookup }).lookup = systemCallback
    syncBuiltinESMExports()
  })
}

const unanswered = (hostname: string) => Object.assign(new Error(`getaddrinfo EAI_AGAIN ${hostname}`), { code: 'EAI_AGAIN' })

/**
 * Lookups that each hold a thread of libuv's pool, as getaddrinfo does while a DNS server does not
 * answer: each opens a FIFO that has no writer, which blocks in open(2) on the pool without CPU.
 */
function poolHoldingLookups(t: Test) {
  const fifo = join(tempDir(t, 'agentd-dns-'), 'resolver')
  execFileSync('mkfifo', [fifo])
  let released = false
  let holding = 0
  const state = { started: 0 }
  hangingNames(t, async (hostname) => {
    if (released) throw unanswered(hostname)
    state.started++
    holding++
    try {
      await (await open(fifo, 'r')).close()
    } finally {
      holding--
    }
    throw unanswered(hostname)
  })
  /** The resolver gives up: every lookup holding a thread returns, and later ones fail at once. */
  const release = async () => {
    if (released) return
    released = true
    // A writer wakes every reader blocked in open; the reader opened first lets the writer open without blocking.
    const reader = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK)
    const writer = openSync(fifo, constants.O_WRONLY)
    for (let i = 0; i < 500 && holding > 0; i++) await delay(10)
    closeSync(writer)
    closeSync(reader)
  }
  t.teardown(release)
  return { state, release }
}

t.test('DNS that never answers holds at most two pool threads: fs tools of other sessions go on, the fetches end at their timeout', async (t) => {
  const resolver = poolHoldingLookups(t)
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_WEBHOOK_HOSTS: 'hook.hang.test' } })
  const limits = { toolTimeoutMs: 1000 }
  const start = async (tools: unknown[], content: string) => {
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools, limits } })).json()
    const { run } = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content } })).json()
    return { sessionId: session.id as string, runId: run.id as string }
  }
  const toolCalls = async (sessionId: string) =>
    (await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/tool-calls` })).json().data as Array<{ id: string; name: string; state: string; durationMs: number | null; result?: unknown; error?: unknown }>

  // Four fetches and a webhook call, in five sessions: more lookups than libuv's pool has threads.
  const hanging = [
    ...(await Promise.all([1, 2, 3, 4].map((n) => start(['http_fetch'], `call http_fetch {"url": "http://site-${n}.hang.test/"}`)))),
    await start([{ type: 'webhook', name: 'lookup_hook', description: 'd', parameters: { type: 'object' }, url: 'http://hook.hang.test/x' }], 'call lookup_hook {}')
  ]
  for (let i = 0; i < 500; i++) {
    const states = await Promise.all(hanging.map(async ({ sessionId }) => (await toolCalls(sessionId))[0]?.state))
    if (resolver.state.started >= 2 && states.every((s) => s === 'executing')) break
    await delay(10)
  }

  // Another session writes and reads a file while those lookups hang: the pool has threads left for it.
  const began = Date.now()
  const fsWork = (async () => {
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['fs_write', 'fs_read'] } })).json()
    const content = 'call fs_write {"path": "note.txt", "content": "still here"} call fs_read {"path": "note.txt"}'
    const { run } = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content } })).json()
    return { run, calls: await toolCalls(session.id) }
  })()
  const done = await Promise.race([fsWork, delay(3000, null)])
  t.ok(done, `the fs tools answered while the lookups hang (${Date.now() - began} ms)`)
  if (done) {
    t.equal(done.run.status, 'completed')
    t.match(done.calls, [{ name: 'fs_write', state: 'completed' }, { name: 'fs_read', state: 'completed', result: { content: /still here/ } }])
  }
  t.equal(resolver.state.started, 2, 'only two lookups reached the resolver')

  for (const { sessionId, runId } of hanging) {
    t.equal((await app.agentd.runs.waitFor(sessionId, runId))?.status, 'completed', 'the run goes on after its call timed out')
    const [call] = await toolCalls(sessionId)
    t.match(call, { state: 'failed', error: { errorType: 'aborted', code: 'TIMEOUT', detail: { timeoutMs: 1000 } } }, `${call?.name} timed out`)
    t.ok(call?.durationMs !== null && call?.durationMs !== undefined && call.durationMs < 1500, `${call?.name} ended at its timeout (${call?.durationMs} ms)`)
    const seen = devModel.requests.flatMap((r) => r.body.messages).find((m) => m.role === 'tool' && m.tool_call_id === sentCallId(call?.id ?? ''))
    t.match(JSON.parse(String(seen?.content)), { ok: false, errorType: 'aborted', code: 'TIMEOUT' }, 'the model got the TIMEOUT envelope')
  }
  await resolver.release()
  await fsWork
})

t.test('hooks and MCP servers look their hosts up through the same two slots: fs tools keep their threads', async (t) => {
  const resolver = poolHoldingLookups(t)
  const dir = tempDir(t)
  const hooks = join(dir, 'hooks.json')
  writeFileSync(hooks, JSON.stringify({ hooks: [{ on: 'preToolUse', url: 'http://policy.hang.test/check', tools: ['http_fetch'], timeoutMs: 1000 }] }))
  const mcp = join(dir, 'mcp.json')
  writeFileSync(mcp, JSON.stringify({ mcpServers: { far: { url: 'http://mcp.hang.test/mcp' } } }))
  const { app } = await buildTestApp(t, {
    env: { AGENTD_HOOKS_CONFIG: hooks, AGENTD_MCP_CONFIG: mcp },
    app: { tools: { mcp: { backoffBaseMs: 50, backoffCapMs: 200, connectTimeoutMs: 1000 } } }
  })
  // An MCP server reconnecting, and three calls whose preToolUse hook looks its host up: more
  // lookups than libuv's pool has threads.
  for (const n of [1, 2, 3]) {
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['http_fetch'] } })).json()
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: `call http_fetch {"url": "http://site-${n}.hang.test/"}` } })
  }
  for (let i = 0; i < 300 && resolver.state.started < 2; i++) await delay(10)

  const began = Date.now()
  const fsWork = (async () => {
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['fs_write', 'fs_read'] } })).json()
    const content = 'call fs_write {"path": "note.txt", "content": "still here"} call fs_read {"path": "note.txt"}'
    return (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content } })).json()
  })()
  const done = await Promise.race([fsWork, delay(3000, null)])
  t.ok(done, `the fs tools answered while the hook's and the MCP server's lookups hang (${Date.now() - began} ms)`)
  t.equal(done?.run.status, 'completed')
  t.equal(resolver.state.started, 2, 'only two lookups reached the resolver')
  await resolver.release()
  await fsWork
})

t.test('a queued lookup leaves the queue at its timeout; one its caller gave up on keeps its slot until the resolver returns', async (t) => {
  const answers: Array<() => void> = []
  let started = 0
  hangingNames(t, (hostname) => {
    started++
    return new Promise<never>((_resolve, reject) => answers.push(() => reject(unanswered(hostname))))
  })
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const tool = createHttpFetchTool({ allowPrivate: false, allowedHosts: [], maxBytes: 10_000, timeoutMs: 5000, maxRedirects: 5 }) as Tool
  const fetch = (url: string) => runTool(tool, { url }, ws.ctx(), { timeoutMs: 300, maxOutputBytes: 100_000 })

  const outcomes = await Promise.all(['a', 'b', 'c'].map((n) => fetch(`http://${n}.hang.test/`)))
  for (const outcome of outcomes) t.match(outcome, { ok: false, error: { errorType: 'aborted', code: 'TIMEOUT' } })
  t.equal(started, 2, 'the third lookup never reached the resolver')
  t.match(await fetch('http://localhost/'), { ok: false, error: { code: 'TIMEOUT' } }, 'the abandoned lookups still hold both slots')

  for (const answer of answers.splice(0)) answer()
  t.match(await fetch('http://localhost/'), { ok: false, error: { code: 'PERMISSION_DENIED', detail: { address: /^(127\.0\.0\.1|::1)$/ } } },
    'once the resolver returned, a lookup goes through (and localhost is refused)')
  t.equal(started, 2, 'localhost was not sent to the hanging resolver')
})
