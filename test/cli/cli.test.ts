import { spawn, spawnSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { until } from '../helpers/server-process.ts'

const BIN = new URL('../../bin/agentd.js', import.meta.url).pathname

interface CliRun {
  code: number | null
  stdout: string
  stderr: string
}

/** Runs `agentd <args>` as a child process, with `input` as its whole stdin. */
function agentd(args: string[], options: { env?: Record<string, string>; input?: string; node?: string } = {}): Promise<CliRun> {
  const child = spawn(options.node ?? process.execPath, [BIN, ...args], {
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...options.env },
    stdio: ['pipe', 'pipe', 'pipe']
  })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => (stdout += chunk))
  child.stderr.on('data', (chunk) => (stderr += chunk))
  child.stdin.end(options.input ?? '')
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })))
}

t.test('the agentd command', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const base = await listen(app)
  const env = { AGENTD_URL: base }
  const create = async (payload: object = {}) => (await app.inject({ method: 'POST', url: '/v1/sessions', payload })).json()

  t.test('chat streams the answer and prints each tool call on a line of its own', async (t) => {
    const run = await agentd(['chat'], { env, input: 'call fs_write {"path": "hello.txt", "content": "hi"}\ncall fs_list {"path": "."}\n' })
    t.equal(run.code, 0, run.stderr)
    t.match(run.stdout, /^session ses_\w+/)
    t.match(run.stdout, '⚙ fs_write {"path":"hello.txt","content":"hi"}')
    t.match(run.stdout, /✓ fs_write \d+ ms/)
    t.match(run.stdout, 'Tool fs_list returned: {"path":".","entries":[{"path":"hello.txt"')
    t.match(run.stdout, /— completed · \d+ tokens · req_\w+/)
    t.notMatch(run.stdout, '\x1b[', 'no colour codes in a pipe')
  })

  t.test('chat prints a classified error compactly, with its recommendations', async (t) => {
    const run = await agentd(['chat'], { env, input: 'call fs_read {"path": "missing.txt"}\n' })
    t.equal(run.code, 0)
    t.match(run.stdout, '✗ fs_read logical NOT_FOUND (retryable): "missing.txt" does not exist in the workspace.')
    t.match(run.stdout, /→ Use fs_glob/)
  })

  t.test('chat asks y/n for an approval and acts on the answer', async (t) => {
    const session = await create({ approval: { mode: 'always' } })
    const run = await agentd(['chat', '--session', session.id], {
      env,
      input: 'call fs_write {"path": "yes.txt", "content": "allowed"}\ny\ncall fs_write {"path": "no.txt", "content": "denied"}\nn\n'
    })
    t.equal(run.code, 0, run.stderr)
    t.match(run.stdout, 'Allow fs_write {"path":"yes.txt","content":"allowed"}? [y/n] y')
    t.match(run.stdout, '✗ fs_write aborted DENIED_BY_USER')
    const calls = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
      .filter((m: { role: string }) => m.role === 'tool').map((m: { content: string }) => m.content)
    t.equal(calls.length, 2)
    t.match(calls[0], '"created":true', 'the allowed call ran')
    t.match(calls[1], 'DENIED_BY_USER', 'the denied one did not')
  })

  t.test('chat answers a client tool from stdin', async (t) => {
    const session = await create({ tools: [{ type: 'client', name: 'pick_colour', description: 'Ask the user', parameters: { type: 'object' } }] })
    const run = await agentd(['chat', '--session', session.id], { env, input: 'call pick_colour {}\n{"colour": "green"}\n' })
    t.equal(run.code, 0, run.stderr)
    t.match(run.stdout, 'Result for pick_colour {}')
    t.match(run.stdout, 'Tool pick_colour returned: {"colour":"green"}')
  })

  t.test('chat resumes the stream after the connection drops, without repeating or losing a word', async (t) => {
    const session = await create({ tools: [] })
    // Under the test model's 1 s headers timeout, yet long enough to drop the connection before the answer.
    devModel.script({ text: 'this answer arrives after the connection dropped', delayMs: 700 })
    const child = spawn(process.execPath, [BIN, 'chat', '--session', session.id], { env: { PATH: process.env.PATH ?? '', ...env }, stdio: ['pipe', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (chunk) => (stdout += chunk))
    child.stderr.on('data', (chunk) => (stderr += chunk))
    const closed = new Promise<number | null>((resolve) => child.on('close', resolve))
    child.stdin.write('tell me\n')
    await until(async () => app.agentd.streamCount > 0, 10_000, 'the chat stream')
    app.server.closeAllConnections()
    await until(async () => stdout.includes('— completed'), 15_000, 'the end of the run')
    child.stdin.end()
    t.equal(await closed, 0)
    t.match(stderr, '(connection lost')
    t.equal(stdout.split('this answer arrives after the connection dropped').length, 2, `the answer is printed exactly once:\n${stdout}`)
  })

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
    await until(async () => app.agentd.streamCount > 0, 10_000, 'the follow stream')
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'second' } })
    await until(async () => stdout.split('"type":"done"').length === 3, 10_000, 'the second run in the follow output')
    const { lastSeq } = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json()
    const seqs = stdout.trim().split('\n').map((line) => JSON.parse(line).seq)
    t.same(seqs, Array.from({ length: lastSeq - 1 }, (_, i) => i + 2), 'every event after --after, in order, once')
  })

  t.test('command line mistakes get one line and exit code 2', async (t) => {
    const unknown = await agentd(['frobnicate'], { env })
    t.equal(unknown.code, 2)
    t.match(unknown.stderr, 'agentd: unknown command "frobnicate"')
    const badFlag = await agentd(['chat', '--approval', 'sometimes'], { env })
    t.equal(badFlag.code, 2)
    t.match(badFlag.stderr, '--approval must be one of auto, always, tools')
    const help = await agentd(['--help'], { env })
    t.equal(help.code, 0)
    t.match(help.stdout, 'agentd <command>')
  })

  t.test('an unreachable service is one line, exit 1', async (t) => {
    const run = await agentd(['sessions', '--url', 'http://127.0.0.1:9'], { env })
    t.equal(run.code, 1)
    t.match(run.stderr, /^agentd: UNREACHABLE: cannot reach http:\/\/127\.0\.0\.1:9 \(.+\)\n$/)
  })
})

t.test('with API keys on, --key or AGENTD_API_KEY is sent', async (t) => {
  const key = 'cli-test-key-0123456789abcdef'
  const { app } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `acme:${key}` } })
  const base = await listen(app)
  const without = await agentd(['sessions'], { env: { AGENTD_URL: base } })
  t.equal(without.code, 1)
  t.match(without.stderr, 'agentd: UNAUTHORIZED (HTTP 401)')
  const byFlag = await agentd(['chat', '--key', key], { env: { AGENTD_URL: base }, input: 'hi there\n' })
  t.equal(byFlag.code, 0, byFlag.stderr)
  t.match(byFlag.stdout, 'You said: hi there')
  const byEnv = await agentd(['sessions'], { env: { AGENTD_URL: base, AGENTD_API_KEY: key } })
  t.equal(byEnv.code, 0)
  t.match(byEnv.stdout, /^ses_\w+ +idle/)
})

/** A Node older than the project needs, if the machine has one (the README's fresh-machine case). */
const olderNode = ['/usr/bin/node', '/usr/local/bin/node'].find((path) => {
  if (!existsSync(path)) return false
  const [major = 0, minor = 0] = spawnSync(path, ['-p', 'process.versions.node'], { encoding: 'utf8' }).stdout.trim().split('.').map(Number)
  return major < 22 || (major === 22 && minor < 18)
})
if (olderNode) {
  t.test(`on the machine's older Node (${olderNode}) the command runs on the Node 24 npm installed`, async (t) => {
    const { app } = await buildTestApp(t)
    const base = await listen(app)
    const run = await agentd(['chat'], { env: { AGENTD_URL: base }, input: 'from an old node\n', node: olderNode })
    t.equal(run.code, 0, run.stderr)
    t.match(run.stdout, 'You said: from an old node')
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8'))
    t.match(pkg.dependencies.node, /^\^24\./, 'the node package is pinned to major 24')
  })
}
