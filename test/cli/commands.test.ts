import { spawn } from 'node:child_process'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import t from 'tap'
import { buildTestApp, listen, tempDir } from '../helpers/app.ts'
import { agentd, BIN } from '../helpers/cli.ts'
import { until } from '../helpers/server-process.ts'
import { startTcpProxy } from '../helpers/tcp-proxy.ts'

// Every test here runs agentd as a child process: on a busy 2-core machine the file takes minutes.
t.setTimeout(300_000)

t.test('agentd sessions and events', async (t) => {
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const env = { AGENTD_URL: base }
  const create = async (payload: object = {}) => (await app.inject({ method: 'POST', url: '/v1/sessions', payload })).json()

  t.test('sessions lists newest first and rm deletes', async (t) => {
    const older = await create({ tools: [] })
    const newer = await create({ tools: [] })
    const listed = await agentd(['sessions'], { env })
    t.equal(listed.code, 0)
    t.ok(listed.stdout.indexOf(newer.id) < listed.stdout.indexOf(older.id), 'newest first')
    const json = await agentd(['sessions', 'ls', '--json', '--limit', '1'], { env })
    t.equal(JSON.parse(json.stdout.trim().split('\n')[0] ?? '').id, newer.id)

    const removed = await agentd(['sessions', 'rm', older.id], { env })
    t.equal(removed.code, 0)
    t.match(removed.stdout, `deleted ${older.id}`)
    t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${older.id}` })).statusCode, 404)

    const missing = await agentd(['sessions', 'rm', older.id], { env })
    t.equal(missing.code, 1)
    t.match(missing.stderr, /^agentd: SESSION_NOT_FOUND \(HTTP 404\): .*\n {2}request: req_\w+\n$/, 'the envelope on two lines, no stack')
  })

  t.test('events prints a session, and --follow --json streams it live', async (t) => {
    const session = await create({ tools: [] })
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'first' } })
    const printed = await agentd(['events', session.id], { env })
    t.equal(printed.code, 0)
    t.match(printed.stdout, /^#1 {2}\S+ {2}state_changed +queued → running$/m)
    t.match(printed.stdout, /text_chunk_end +You said: first/)

    const child = spawn(process.execPath, [BIN, 'events', session.id, '--follow', '--json', '--after', '1'], { env: { PATH: process.env.PATH ?? '', ...env } })
    t.teardown(() => child.kill())
    let stdout = ''
    child.stdout.on('data', (chunk) => (stdout += chunk))
    await until(async () => app.streams.count > 0, 10_000, 'the follow stream')
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'second' } })
    await until(async () => stdout.split('"type":"done"').length === 3, 10_000, 'the second run in the follow output')
    const { lastSeq } = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json()
    const seqs = stdout.trim().split('\n').map((line) => JSON.parse(line).seq)
    t.same(seqs, Array.from({ length: lastSeq - 1 }, (_, i) => i + 2), 'every event after --after, in order, once')
  })

  t.test('sessions prints one line per session, whatever its model name holds', async (t) => {
    // Before, a model name with a line break (any client may set it) split its session over two
    // lines, the second one free to pass for another session.
    const odd = await create({ tools: [], model: 'gpt\nses_fake  idle' })
    const run = await agentd(['sessions', '--limit', '1'], { env })
    t.equal(run.code, 0)
    const lines = run.stdout.split('\n').filter((line) => line.startsWith('ses_'))
    t.equal(lines.length, 1, run.stdout)
    t.match(lines[0], `${odd.id}  idle                  gpt ses_fake  idle  `)
  })

  t.test('sessions rm goes on past an ID it cannot delete, and exits 1', async (t) => {
    // Before, it stopped at the first failure: `rm a gone c` left c in place.
    const first = await create({ tools: [] })
    const last = await create({ tools: [] })
    const run = await agentd(['sessions', 'rm', first.id, 'ses_gone', last.id], { env })
    t.equal(run.code, 1)
    t.equal(run.stdout, `deleted ${first.id}\ndeleted ${last.id}\n`)
    t.match(run.stderr, /^agentd: SESSION_NOT_FOUND \(HTTP 404\): No session ses_gone\n/)
    for (const id of [first.id, last.id]) t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${id}` })).statusCode, 404, `${id} is gone`)
  })

  t.test('events prints one line per event, even for an error message of several lines', async (t) => {
    // Before, a client tool's error of three lines (or a webhook's, an MCP server's) took three
    // lines of `agentd events`, which says one event a line: grep and head split it.
    const session = await create({ tools: [{ type: 'client', name: 'pick_colour', description: 'Ask the user', parameters: { type: 'object' } }] })
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'call pick_colour {}' } })
    const call = await until(async () => (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json().data[0], 10_000, 'the call')
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/tool-results/${call.id}`, payload: { error: 'no colour:\n  the user\n  walked away' } })
    await until(async () => (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().status === 'idle', 10_000, 'the run to end')
    const printed = await agentd(['events', session.id], { env })
    t.equal(printed.code, 0)
    const { lastSeq } = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json()
    const lines = printed.stdout.trimEnd().split('\n')
    t.equal(lines.length, lastSeq, 'as many lines as events')
    t.ok(lines.every((line, i) => line.startsWith(`#${i + 1}  `)), 'each line one event')
    t.match(printed.stdout, /tool:error +pick_colour .*no colour: the user walked away/)
  })

  t.test('command line mistakes get one line and exit code 2', async (t) => {
    const unknown = await agentd(['frobnicate'], { env })
    t.equal(unknown.code, 2)
    t.match(unknown.stderr, 'agentd: unknown command "frobnicate"')
    const badFlag = await agentd(['chat', '--approval', 'sometimes'], { env })
    t.equal(badFlag.code, 2)
    t.match(badFlag.stderr, '--approval must be one of auto, always')
    // Before, words past what a command takes were dropped: `agentd chat "hello"` started a
    // session and sent nothing.
    const message = await agentd(['chat', 'what is 2+2?'], { env })
    t.equal(message.code, 2)
    t.match(message.stderr, 'agentd: chat takes no words after it ("what is 2+2?"): it reads the messages from stdin, one a line')
    const listed = await agentd(['sessions', 'ls', 'ses_x'], { env })
    t.equal(listed.code, 2)
    t.match(listed.stderr, 'agentd: sessions ls takes no words after it ("ses_x")')
    const events = await agentd(['events', 'ses_a', 'ses_b'], { env })
    t.equal(events.code, 2)
    t.match(events.stderr, 'agentd: events takes one session id, not 2')
    const help = await agentd(['--help'], { env })
    t.equal(help.code, 0)
    t.match(help.stdout, 'agentd <command>')
  })

  t.test('a service URL that is not an http(s) URL is a command line mistake, not an unreachable service', async (t) => {
    // Before, `--url localhost:3000` (no scheme; URL reads "localhost:" as one) said
    // "UNREACHABLE: cannot reach localhost:3000 (fetch failed)" with exit 1, of a service that was up.
    for (const url of ['localhost:3000', '127.0.0.1:3000', 'ftp://127.0.0.1:3000', 'not a url']) {
      const byFlag = await agentd(['sessions', '--url', url], { env })
      t.equal(byFlag.code, 2, `--url ${url}`)
      t.match(byFlag.stderr, `agentd: --url must be an http:// or https:// URL such as http://127.0.0.1:3000, not "${url}"`)
    }
    const byEnv = await agentd(['sessions'], { env: { AGENTD_URL: 'localhost:3000' } })
    t.equal(byEnv.code, 2)
    t.match(byEnv.stderr, 'agentd: AGENTD_URL must be an http:// or https:// URL such as http://127.0.0.1:3000, not "localhost:3000"')
  })

  t.test('an API key a header cannot carry is a command line mistake, named but not shown', async (t) => {
    // Before: "UNREACHABLE: cannot reach http://… (Cannot convert argument to a ByteString …)",
    // exit 1, of a service that was up, for a key copied with a curly quote or a line break in it.
    const byFlag = await agentd(['sessions', '--key', 'secret’key-0123456789'], { env })
    t.equal(byFlag.code, 2)
    t.equal(byFlag.stderr.split('\n')[0], 'agentd: --key holds a character an HTTP header cannot carry (U+2019 at position 7): was it copied with a curly quote or a line break?')
    const byEnv = await agentd(['sessions'], { env: { ...env, AGENTD_API_KEY: 'secret\nkey-0123456789' } })
    t.equal(byEnv.code, 2)
    t.match(byEnv.stderr, 'agentd: AGENTD_API_KEY holds a character an HTTP header cannot carry (U+000A at position 7)')
    t.notMatch(byFlag.stderr + byEnv.stderr, 'secret', 'the key is not printed')
  })

  t.test('a URL where something else than agentd answers (a web app\'s dev server) is said so, exit 1', async (t) => {
    // Before: "agentd: Cannot read properties of null (reading 'data')", and `events --follow`
    // reconnected for ever to a page that was no event stream.
    const page = createServer((_request, response) => response.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><div id="root"></div>'))
    await new Promise<void>((resolve) => page.listen(0, '127.0.0.1', resolve))
    t.teardown(() => page.close())
    const url = `http://127.0.0.1:${(page.address() as AddressInfo).port}`
    for (const args of [['sessions'], ['chat'], ['events', 'ses_x'], ['events', 'ses_x', '--follow']]) {
      const run = await agentd([...args, '--url', url], { env, timeoutMs: 10_000 })
      t.equal(run.code, 1, args.join(' '))
      t.match(run.stderr, `agentd: INVALID_RESPONSE (HTTP 200): ${url} answered with text/html, not the ${args.includes('--follow') ? 'event stream' : 'JSON'} of agentd's API: is it an agentd server?\n`)
    }
  })

  t.test('a URL that redirects (http to https) is said so with the address to use, exit 1', async (t) => {
    // Before, fetch followed the redirect and turned the POST that creates a session into a GET
    // of the session list: "session undefined", then SESSION_NOT_FOUND "No session undefined".
    const redirector = createServer((request, response) => response.writeHead(301, { location: `${base}${request.url}` }).end())
    await new Promise<void>((resolve) => redirector.listen(0, '127.0.0.1', resolve))
    t.teardown(() => redirector.close())
    const url = `http://127.0.0.1:${(redirector.address() as AddressInfo).port}`
    for (const args of [['chat'], ['sessions'], ['events', 'ses_x', '--follow']]) {
      const run = await agentd([...args, '--url', url], { env, input: 'hello\n', timeoutMs: 10_000 })
      t.equal(run.code, 1, args.join(' '))
      t.match(run.stderr, `agentd: REDIRECTED (HTTP 301): ${url} sends requests to ${base}: give that address to --url\n`)
      t.notMatch(run.stdout, 'undefined')
    }
  })

  t.test('an unreachable service is one line, exit 1', async (t) => {
    const run = await agentd(['sessions', '--url', 'http://127.0.0.1:9'], { env })
    t.equal(run.code, 1)
    t.match(run.stderr, /^agentd: UNREACHABLE: cannot reach http:\/\/127\.0\.0\.1:9 \(.+\)\n$/)
  })
})

t.test('agentd serve runs the service, console included, and drains on SIGTERM', async (t) => {
  const workspaces = tempDir(t)
  const child = spawn(process.execPath, [BIN, 'serve'], {
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', HOST: '127.0.0.1', PORT: '0', AGENTD_DB: ':memory:', AGENTD_WORKSPACES: workspaces, LOG_LEVEL: 'info' },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  t.teardown(() => child.kill('SIGKILL'))
  const exited = new Promise<number | null>((resolve) => child.on('exit', resolve))
  let stdout = ''
  child.stdout.on('data', (chunk) => (stdout += chunk))
  const base = await until(async () => /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout)?.[1], 20_000, 'the service to listen')
  const page = await fetch(`${base}/console`)
  t.equal(page.status, 200)
  t.match(await page.text(), '<title>agentd console</title>')
  child.kill('SIGTERM')
  t.equal(await exited, 0, 'a clean exit after draining')
})

t.test('events --follow says once that the connection was lost, not at every attempt while the service is away', async (t) => {
  // Before, a line a second for as long as the service was down.
  const { app } = await buildTestApp(t)
  const target = new URL(await listen(app))
  const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port) })
  t.teardown(() => proxy.close())
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const child = spawn(process.execPath, [BIN, 'events', session.id, '--follow', '--url', `http://127.0.0.1:${proxy.port}`], { env: { PATH: process.env.PATH ?? '' } })
  t.teardown(() => child.kill())
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => (stdout += chunk))
  child.stderr.on('data', (chunk) => (stderr += chunk))
  await until(async () => app.streams.count > 0, 10_000, 'the follow stream')
  proxy.cut()
  await new Promise((resolve) => setTimeout(resolve, 3500))
  proxy.restore()
  await until(async () => app.streams.count > 0, 10_000, 'the stream opened again')
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'after the outage' } })
  await until(async () => stdout.includes('You said: after the outage'), 10_000, 'the run after the outage')
  t.equal(stderr.split('(connection lost').length - 1, 1, `one line for the outage:\n${stderr}`)
  // Before, "(connection lost: terminated; resuming)": undici's word, without what it meant. As
  // the cut reaches undici, the client sees the stream's body end or its request fail (seen on a
  // fresh clone): either way, with the cause.
  t.match(stderr, /\(connection lost: (terminated \((other side closed|read ECONNRESET)\)|UNREACHABLE: cannot reach \S+ \(UND_ERR_SOCKET\)); resuming\)/)
})

t.test('sessions --limit above a page (100) reads the pages it needs, and the hint for more is one that shows more', async (t) => {
  // Before, past 100 sessions the hint was "(more: --limit 100)" after `--limit 100`, and
  // `--limit 200` was refused by the API: the older sessions could not be listed.
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const ids: string[] = []
  for (let i = 0; i < 105; i++) ids.push((await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json().id)
  const hundred = await agentd(['sessions', '--limit', '100'], { env: { AGENTD_URL: base } })
  t.equal(hundred.code, 0, hundred.stderr)
  t.equal(hundred.stdout.split('\n').filter((line) => line.startsWith('ses_')).length, 100)
  t.match(hundred.stdout, '(more: --limit 200)')
  const all = await agentd(['sessions', '--limit', '200'], { env: { AGENTD_URL: base } })
  t.equal(all.code, 0, all.stderr)
  t.same(all.stdout.split('\n').filter((line) => line.startsWith('ses_')).map((line) => line.split(' ')[0]), ids.toReversed(), 'all of them, newest first')
  t.notMatch(all.stdout, '(more', 'no hint when all are shown')
})
