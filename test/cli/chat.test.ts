import { spawn, spawnSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { agentd, BIN } from '../helpers/cli.ts'
import { until } from '../helpers/server-process.ts'
import { startDevModel } from '../../src/model/dev-model.ts'
import { createOpenAIProvider } from '../../src/model/provider.ts'

// Every test here runs agentd as a child process: on a busy 2-core machine the file takes minutes.
t.setTimeout(300_000)

t.test('agentd chat', async (t) => {
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

  t.test('chat --ask creates a session where only the named tools need approval', async (t) => {
    const run = await agentd(['chat', '--tools', 'fs_list,fs_write', '--ask', 'fs_write'], {
      env,
      input: 'call fs_list {"path": "."}\ncall fs_write {"path": "asked.txt", "content": "ok"}\ny\n'
    })
    t.equal(run.code, 0, run.stderr)
    const sessionId = /session (ses_\w+)/.exec(run.stdout)?.[1]
    const session = (await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}` })).json()
    t.same(session.approval, { mode: 'tools', tools: ['fs_write'] })
    t.same(session.tools, ['fs_list', 'fs_write'])
    t.notMatch(run.stdout, 'Allow fs_list', 'fs_list ran without asking')
    t.match(run.stdout, 'Allow fs_write {"path":"asked.txt","content":"ok"}? [y/n] y')
    t.match(run.stdout, /✓ fs_write \d+ ms/)
  })

  t.test('escape sequences from the model and in tool inputs are printed as text, not acted on by the terminal', async (t) => {
    // Before, they reached the terminal as they were: OSC 52 in the answer could set the clipboard,
    // and a right-to-left override or an 8-bit CSI (which JSON leaves as they are) in a tool's
    // input changed what the approval question showed.
    const session = await create({ approval: { mode: 'always' } })
    devModel.script(
      { toolCalls: [{ name: 'fs_write', arguments: { path: 'evil\u202ehs.txt', content: 'x\u009b2K' } }] },
      { text: 'done \x1b]52;c;ZXZpbA==\x07 and \u202eeulav\r\nnext line' }
    )
    const run = await agentd(['chat', '--session', session.id], { env, input: 'go\nn\n' })
    t.equal(run.code, 0, run.stderr)
    t.notMatch(run.stdout, /[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]/, 'no control character reaches the terminal')
    t.match(run.stdout, 'Allow fs_write {"path":"evil\\u202ehs.txt","content":"x\\u009b2K"}? [y/n] n', 'the question shows the call as it is')
    t.match(run.stdout, 'done \\u001b]52;c;ZXZpbA==\\u0007 and \\u202eeulav\nnext line', 'the answer, its CRLF a newline')
    const events = await agentd(['events', session.id], { env })
    t.notMatch(events.stdout, /[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]/, 'nor from agentd events')
  })

  t.test('a CRLF that the model streams in two chunks is a newline too', async (t) => {
    // Before, the CR that ended one chunk was printed as "\u000d" at the end of the line.
    devModel.script({ text: 'one\r\ntwo\r\nthree', chunks: 14 })
    const run = await agentd(['chat'], { env, input: 'lines please\n' })
    t.equal(run.code, 0, run.stderr)
    t.match(run.stdout, 'one\ntwo\nthree')
    t.notMatch(run.stdout, '\\u000d')
  })

  t.test('a tool input cut short is not cut inside a character', async (t) => {
    // Before, the cut at 120 UTF-16 units could split an emoji's surrogate pair: "�…" was shown.
    devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: `a${'😀'.repeat(80)}` } }] }, { text: 'listed' })
    const run = await agentd(['chat'], { env, input: 'list it\n' })
    t.equal(run.code, 0, run.stderr)
    t.match(run.stdout, `⚙ fs_list {"path":"a${'😀'.repeat(54)}…`)
    t.notMatch(run.stdout, '\ufffd', 'no replacement character')
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
    await until(async () => app.streams.count > 0, 10_000, 'the chat stream')
    app.server.closeAllConnections()
    await until(async () => stdout.includes('— completed'), 15_000, 'the end of the run')
    child.stdin.end()
    t.equal(await closed, 0)
    t.match(stderr, '(connection lost')
    t.equal(stdout.split('this answer arrives after the connection dropped').length, 2, `the answer is printed exactly once:\n${stdout}`)
  })

  t.test('options that set up a new session are refused with --session, not ignored', async (t) => {
    // Before, `--session <id> --approval always` chatted on with the session's own approval
    // (auto): tools the user meant to be asked about ran without a question.
    const session = await create({ tools: ['fs_write'] })
    for (const options of [['--approval', 'always'], ['--ask', 'fs_write'], ['--tools', 'fs_list']]) {
      const run = await agentd(['chat', '--session', session.id, ...options], { env, input: 'call fs_write {"path": "a.txt", "content": "x"}\n' })
      t.equal(run.code, 2, options.join(' '))
      t.match(run.stderr, `agentd: ${options[0]} sets up a new session; an existing one (--session) keeps its own tools and approval`)
    }
    const both = await agentd(['chat', '--approval', 'auto', '--ask', 'fs_write'], { env })
    t.equal(both.code, 2, '--approval and --ask together')
    t.match(both.stderr, 'agentd: --approval and --ask are alternatives: one approval mode or the tools that need approval')
    t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data.length, 0, 'nothing was sent')
  })

  t.test('a session deleted while chatting ends the chat with its error and exit code 1', async (t) => {
    // Before, the chat went on: every later line was refused with SESSION_NOT_FOUND, and a
    // script's chat ended with exit code 0.
    const session = await create({ tools: [] })
    const child = spawn(process.execPath, [BIN, 'chat', '--session', session.id], { env: { PATH: process.env.PATH ?? '', ...env }, stdio: ['pipe', 'pipe', 'pipe'] })
    t.teardown(() => child.kill('SIGKILL'))
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (chunk) => (stdout += chunk))
    child.stderr.on('data', (chunk) => (stderr += chunk))
    const closed = new Promise<number | null>((resolve) => child.on('close', resolve))
    child.stdin.write('first\n')
    await until(async () => stdout.includes('— completed'), 10_000, 'the first run')
    await app.inject({ method: 'DELETE', url: `/v1/sessions/${session.id}` })
    child.stdin.write('second\n')
    const code = await Promise.race([closed, new Promise<string>((resolve) => setTimeout(resolve, 10_000, 'still running').unref())])
    t.equal(code, 1, 'the chat ends by itself, exit code 1')
    t.match(stderr, /^agentd: SESSION_NOT_FOUND \(HTTP 404\): .*\n {2}request: req_\w+\n$/, 'the envelope on stderr')
  })

  t.test('Ctrl+C at an approval or client tool question interrupts the run and takes back the question', async (t) => {
    // Before, the run was interrupted but the question stayed: the next line typed was taken as
    // its answer (refused with 409 NOT_AWAITING) instead of being sent as the next message.
    const session = await create({
      approval: { mode: 'tools', tools: ['fs_write'] },
      tools: ['fs_write', { type: 'client', name: 'pick_colour', description: 'Ask the user', parameters: { type: 'object' } }]
    })
    const child = spawn(process.execPath, [BIN, 'chat', '--session', session.id], { env: { PATH: process.env.PATH ?? '', ...env }, stdio: ['pipe', 'pipe', 'pipe'] })
    t.teardown(() => child.kill('SIGKILL'))
    let stdout = ''
    child.stdout.on('data', (chunk) => (stdout += chunk))
    const closed = new Promise<number | null>((resolve) => child.on('close', resolve))
    const questions = [
      { message: 'call fs_write {"path": "a.txt", "content": "x"}', question: 'Allow fs_write' },
      { message: 'call pick_colour {}', question: 'Result for pick_colour' }
    ]
    for (const [i, { message, question }] of questions.entries()) {
      child.stdin.write(`${message}\n`)
      await until(async () => stdout.includes(question), 10_000, question)
      child.kill('SIGINT')
      await until(async () => stdout.split('— interrupted').length === i + 2, 10_000, `the interrupted run after "${question}"`)
      child.stdin.write(`after question ${i}\n`)
      await until(async () => stdout.includes(`You said: after question ${i}`), 10_000, `the next message after "${question}"`)
    }
    child.stdin.end()
    t.equal(await closed, 0)
    t.notMatch(stdout, 'NOT_AWAITING', 'no answer went to a question that was gone')
    const tools = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
      .filter((m: { role: string }) => m.role === 'tool')
    t.equal(tools.length, 2, 'each call was settled by the interrupt')
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

t.test('Ctrl+C while the answer streams interrupts the run, its notice on the next line with no blank line after it', async (t) => {
  // Before: "This answer stops \n(interrupting; Ctrl+C again quits)\n\n— interrupted", a blank
  // line where the answer's unfinished line was ended a second time.
  const devModel = await startDevModel({ host: '127.0.0.1', port: 0 })
  t.teardown(() => devModel.close())
  // Timeouts long enough for the answer to hang until the interrupt.
  const model = createOpenAIProvider({ kind: 'dev', apiKey: 'test-key', baseURL: devModel.url, headersTimeoutMs: 60_000, bodyTimeoutMs: 60_000 })
  t.teardown(() => model.close())
  const { app } = await buildTestApp(t, { devModel, app: { model } })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ hang: true, afterChunks: 3 })
  const child = spawn(process.execPath, [BIN, 'chat', '--session', session.id], { env: { PATH: process.env.PATH ?? '', AGENTD_URL: base }, stdio: ['pipe', 'pipe', 'pipe'] })
  t.teardown(() => child.kill('SIGKILL'))
  let stdout = ''
  child.stdout.on('data', (chunk) => (stdout += chunk))
  const closed = new Promise<number | null>((resolve) => child.on('close', resolve))
  child.stdin.write('hello\n')
  await until(async () => stdout.includes('This answer stops '), 10_000, 'the first words')
  child.kill('SIGINT')
  await until(async () => stdout.includes('— interrupted'), 10_000, 'the interrupted run')
  child.stdin.end()
  t.equal(await closed, 0)
  t.match(stdout, /This answer stops \n\(interrupting; Ctrl\+C again quits\)\n— interrupted/)
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
    t.match(pkg.optionalDependencies.node, /^\^24\./, 'the node package is pinned to major 24')
  })
}

if (olderNode) {
  t.test(`on the machine's older Node, a Ctrl+C (to the whole process group, as a terminal sends it) interrupts the run once`, async (t) => {
    // Before, the bin forwarded the SIGINT to the Node 24 child that had already had it from the
    // terminal: a second Ctrl+C at once, which quits, so Ctrl+C never interrupted a run.
    const { app } = await buildTestApp(t)
    const base = await listen(app)
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [{ type: 'client', name: 'pick_colour', description: 'Ask the user', parameters: { type: 'object' } }] } })).json()
    // Detached: a process group of its own, as a shell gives a job.
    const child = spawn(olderNode, [BIN, 'chat', '--session', session.id], { env: { PATH: process.env.PATH ?? '', AGENTD_URL: base }, stdio: ['pipe', 'pipe', 'pipe'], detached: true })
    t.teardown(() => {
      try {
        process.kill(-(child.pid as number), 'SIGKILL')
      } catch {
        // Already gone.
      }
    })
    let stdout = ''
    child.stdout.on('data', (chunk) => (stdout += chunk))
    const closed = new Promise<number | null>((resolve) => child.on('close', resolve))
    child.stdin.write('call pick_colour {}\n')
    await until(async () => stdout.includes('Result for pick_colour'), 20_000, 'the question')
    process.kill(-(child.pid as number), 'SIGINT')
    await until(async () => stdout.includes('— interrupted'), 10_000, `the interrupted run:\n${stdout}`)
    child.stdin.write('still here\n')
    await until(async () => stdout.includes('You said: still here'), 10_000, 'the next message')
    child.stdin.end()
    t.equal(await closed, 0)
  })
}

/** util-linux's `script`: runs a command on a pseudo-terminal, for what chat does only on a terminal. */
const script = ['/usr/bin/script', '/bin/script'].find((path) => existsSync(path))
if (script) {
  t.test('on a terminal, a line typed ahead while the answer streams is the next message, not the answer to a question asked after it', async (t) => {
    // Before, it answered the approval question that came next (not "y": denied), and the "y"
    // typed for the question went out as a message of its own.
    const { app } = await buildTestApp(t)
    const base = await listen(app)
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { approval: { mode: 'always' } } })).json()
    const child = spawn(script, ['-qfec', `${process.execPath} ${BIN} chat --session ${session.id}`, '/dev/null'], {
      env: { PATH: process.env.PATH ?? '', AGENTD_URL: base, TERM: 'dumb', NO_COLOR: '1' },
      stdio: ['pipe', 'pipe', 'pipe']
    })
    t.teardown(() => child.kill('SIGKILL'))
    let screen = ''
    child.stdout.on('data', (chunk) => (screen += chunk))
    await until(async () => screen.includes('you> '), 20_000, 'the prompt')
    // Both lines at once: the second is typed before the question about the first one's call.
    child.stdin.write('call fs_write {"path": "a.txt", "content": "x"}\rtyped ahead\r')
    await until(async () => screen.includes('[y/n]'), 10_000, 'the question')
    child.stdin.write('y\r')
    await until(async () => screen.includes('You said: typed ahead'), 10_000, 'the typed-ahead message')
      .catch((err: Error) => t.fail(`${err.message}:\n${screen}`))
    child.stdin.write('\x04')
    t.match(screen, /✓ fs_write \d+ ms/, 'the call was allowed by the "y" typed for it')
    t.notMatch(screen, 'DENIED_BY_USER')
  })

  t.test('on a terminal, Ctrl+D at the prompt ends the line, so the shell\'s prompt starts on its own', async (t) => {
    // Before, the shell's prompt followed "you> " on the same line.
    const { app } = await buildTestApp(t)
    const base = await listen(app)
    const child = spawn(script, ['-qfec', `${process.execPath} ${BIN} chat`, '/dev/null'], {
      env: { PATH: process.env.PATH ?? '', AGENTD_URL: base, TERM: 'dumb', NO_COLOR: '1' },
      stdio: ['pipe', 'pipe', 'pipe']
    })
    t.teardown(() => child.kill('SIGKILL'))
    let screen = ''
    child.stdout.on('data', (chunk) => (screen += chunk))
    const closed = new Promise<number | null>((resolve) => child.on('close', resolve))
    await until(async () => screen.includes('you> '), 20_000, 'the prompt')
    child.stdin.write('\x04')
    t.equal(await closed, 0)
    t.match(screen, /you> \r?\n$/)
  })
}
