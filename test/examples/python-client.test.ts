import { execFile } from 'node:child_process'
import { connect, createServer, type Socket } from 'node:net'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { buildTestApp, listen, type TapTest } from '../helpers/app.ts'
import { connectionRefusedError, failSessionReads } from '../helpers/store-faults.ts'

const script = fileURLToPath(new URL('../../examples/python/agentd_client.py', import.meta.url))
const API_KEY = 'python-client-test-key-0123'

interface Outcome {
  code: number | null
  stdout: string
  stderr: string
}

/** Runs the example client to its end (at most 15 s) and collects what it printed. */
function runClient(args: string[]): Promise<Outcome> {
  return new Promise((resolve) => {
    execFile('python3', ['-B', script, ...args], { timeout: 15_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : null) : 0
      resolve({ code, stdout, stderr })
    })
  })
}

/** The `seq type json` lines the client printed, parsed. */
function printedEvents(stderr: string): Array<{ seq: number; type: string; data: Record<string, unknown> }> {
  return stderr
    .split('\n')
    .map((line) => /^(\d+) (\S+) (\{.*\})$/.exec(line))
    .filter((match) => match !== null)
    .map((match) => ({ seq: Number(match[1]), type: match[2] as string, data: JSON.parse(match[3] as string) }))
}

const textRunTypes = [
  'state_changed', 'text_chunk_start', 'text_chunk', 'text_chunk', 'text_chunk', 'text_chunk', 'text_chunk_end',
  'token_usage', 'step_complete', 'state_changed', 'done'
]

async function startService(t: TapTest) {
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `python:${API_KEY}` } })
  return { base: await listen(app), devModel }
}

t.test('a completed run prints every event in order and the final text, and exits 0', async (t) => {
  const { base, devModel } = await startService(t)
  devModel.script({ text: 'The answer is 42.', chunks: 4 })

  const out = await runClient(['--base-url', base, '--api-key', API_KEY, 'What is the answer?'])
  t.equal(out.code, 0, 'exits 0', { stderr: out.stderr })
  t.equal(out.stdout, 'The answer is 42.\n')
  const events = printedEvents(out.stderr)
  t.same(events.map((e) => e.type), textRunTypes)
  t.same(events.map((e) => e.seq), events.map((_, i) => i + 1))
  t.same(events.filter((e) => e.type === 'text_chunk').map((e) => e.data.delta).join(''), 'The answer is 42.')
  t.match(out.stderr, /^session ses_/)
  t.same(devModel.requests[0]?.body.messages.at(-1), { role: 'user', content: 'What is the answer?' })
})

t.test('a run that fails on a model 401 exits non-zero and names AUTHENTICATION_ERROR', async (t) => {
  const { base, devModel } = await startService(t)
  devModel.script({ status: 401 })

  const out = await runClient(['--base-url', base, '--api-key', API_KEY, 'hello'])
  t.equal(out.code, 1)
  t.equal(out.stdout, '')
  t.same(printedEvents(out.stderr).map((e) => e.type), ['state_changed', 'error', 'state_changed', 'done'])
  t.match(out.stderr, /^run ended: failed: AUTHENTICATION_ERROR: /m)
})

t.test('an HTTP error prints the envelope code and message and exits 2', async (t) => {
  const { base } = await startService(t)
  const out = await runClient(['--base-url', base, '--api-key', 'not-the-key-at-all', 'hello'])
  t.equal(out.code, 2)
  t.match(out.stderr, /^error: UNAUTHORIZED: The API key is not valid \(HTTP 401, request \S+\)$/m)
})

t.test('a dropped stream is resumed with Last-Event-ID: nothing missed, nothing repeated', async (t) => {
  const { base, devModel } = await startService(t)
  devModel.script({ text: 'Still here after the cut.', chunks: 4 })
  const proxy = await startCuttingProxy(t, Number(new URL(base).port), 4)

  const out = await runClient(['--base-url', proxy.url, '--api-key', API_KEY, 'hello'])
  t.equal(out.code, 0, 'exits 0', { stderr: out.stderr })
  t.ok(proxy.cut, 'the proxy cut the first event stream')
  t.match(out.stderr, /reconnecting in 2 s from event 3/, 'resumes after the last event it got, after the server\'s retry')
  const events = printedEvents(out.stderr)
  t.same(events.map((e) => e.type), textRunTypes)
  t.same(events.map((e) => e.seq), events.map((_, i) => i + 1))
  t.equal(out.stdout, 'Still here after the cut.\n')
})

t.test('a stream cut in the middle of a frame is resumed from a clean parser: the half frame is dropped, then replayed whole', async (t) => {
  const { base, devModel } = await startService(t)
  devModel.script({ text: 'Cut inside a frame.', chunks: 4 })
  // After the retry frame and three events, 40 bytes into the fourth: inside its data line.
  const proxy = await startCuttingProxy(t, Number(new URL(base).port), 4, 1, 40)

  const out = await runClient(['--base-url', proxy.url, '--api-key', API_KEY, 'hello'])
  t.equal(out.code, 0, 'exits 0', { stderr: out.stderr })
  t.ok(proxy.cut, 'the proxy cut the first event stream')
  t.match(out.stderr, /reconnecting in 2 s from event 3/)
  const events = printedEvents(out.stderr)
  t.same(events.map((e) => e.type), textRunTypes)
  t.same(events.map((e) => e.seq), events.map((_, i) => i + 1))
  t.equal(out.stdout, 'Cut inside a frame.\n')
})

t.test('a reconnection answered 503 (retryable, Retry-After) waits and goes on; nothing missed', async (t) => {
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `python:${API_KEY}` } })
  const base = await listen(app)
  devModel.script({ text: 'Still here after the outage.', chunks: 4 })
  const proxy = await startCuttingProxy(t, Number(new URL(base).port), 4)
  // The reconnection after the cut finds the store out of reach (a real ECONNREFUSED), once.
  const refusals = failSessionReads(app.agentd.store, await connectionRefusedError(), () => proxy.cut)

  const out = await runClient(['--base-url', proxy.url, '--api-key', API_KEY, 'hello'])
  t.equal(out.code, 0, 'exits 0', { stderr: out.stderr })
  t.equal(refusals.failed, 1, 'one reconnection was refused')
  t.match(out.stderr, /UNAVAILABLE: The store is unreachable\); reconnecting in 1 s from event 3/, "waits the answer's Retry-After")
  const events = printedEvents(out.stderr)
  t.same(events.map((e) => e.type), textRunTypes)
  t.same(events.map((e) => e.seq), events.map((_, i) => i + 1))
  t.equal(out.stdout, 'Still here after the outage.\n')
})

t.test('stream_message on a session with earlier runs, cut before its first event, resumes in its own run', async (t) => {
  const { base, devModel } = await startService(t)
  const auth = { authorization: `Bearer ${API_KEY}`, 'content-type': 'application/json' }
  const session = await (await fetch(`${base}/v1/sessions`, { method: 'POST', headers: auth, body: '{}' })).json() as { id: string }
  devModel.script({ text: 'the first answer' })
  const first = await fetch(`${base}/v1/sessions/${session.id}/messages?wait=true`, { method: 'POST', headers: auth, body: '{"content":"one"}' })
  t.equal(first.status, 200)
  const firstRunId = ((await first.json()) as { run: { id: string } }).run.id
  devModel.script({ text: 'the second answer', delayMs: 50 })
  // One frame: the stream's opening `retry:`, so the cut comes before any event of the run.
  const proxy = await startCuttingProxy(t, Number(new URL(base).port), 1)
  const program = [
    'import json, sys',
    `sys.path.insert(0, ${JSON.stringify(fileURLToPath(new URL('../../examples/python', import.meta.url)))})`,
    'import agentd_client',
    'agentd_client.DEFAULT_RETRY_MS = 10',
    `client = agentd_client.AgentdClient(${JSON.stringify(proxy.url)}, ${JSON.stringify(API_KEY)})`,
    `for e in client.stream_message(${JSON.stringify(session.id)}, "two"):`,
    '    print(e.data)'
  ].join('\n')
  const out = await new Promise<string>((resolve, reject) => {
    execFile('python3', ['-B', '-c', program], { timeout: 15_000 }, (err, stdout) => (err ? reject(err) : resolve(stdout)))
  })
  t.ok(proxy.cut, 'the proxy cut the first event stream')
  const events = out.trim().split('\n').map((line) => JSON.parse(line) as { seq: number; type: string; runId: string; data: { text?: string } })
  t.ok(events.length > 0 && events.every((e) => e.runId !== firstRunId), 'none of the earlier run\'s events')
  t.same(events.map((e) => e.seq), events.map((_, i) => events[0]!.seq + i), 'nothing missed or repeated')
  t.equal(events.find((e) => e.type === 'text_chunk_end')?.data.text, 'the second answer')
  t.equal(events.at(-1)?.type, 'done')
})

t.test('a stream dropped more often than MAX_RECONNECTS, each time after progress, still runs to the end', async (t) => {
  const { base, devModel } = await startService(t)
  devModel.script({ text: 'Many cuts, one answer.', chunks: 4 })
  // Every connection but the last is cut after its `retry:` frame and one event.
  const proxy = await startCuttingProxy(t, Number(new URL(base).port), 2, 8)
  const program = [
    'import sys, time',
    `sys.path.insert(0, ${JSON.stringify(fileURLToPath(new URL('../../examples/python', import.meta.url)))})`,
    'import agentd_client',
    'time.sleep = lambda seconds: None  # the waits between reconnections are not what is tested',
    `sys.exit(agentd_client.main(["--base-url", ${JSON.stringify(proxy.url)}, "--api-key", ${JSON.stringify(API_KEY)}, "hello"]))`
  ].join('\n')
  const out = await new Promise<Outcome>((resolve) => {
    execFile('python3', ['-B', '-c', program], { timeout: 15_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : null) : 0, stdout, stderr })
    })
  })
  t.equal(proxy.cuts, 8, 'cut eight times')
  t.equal(out.code, 0, 'exits 0', { stderr: out.stderr })
  const events = printedEvents(out.stderr)
  t.same(events.map((e) => e.type), textRunTypes)
  t.same(events.map((e) => e.seq), events.map((_, i) => i + 1))
  t.equal(out.stdout, 'Many cuts, one answer.\n')
})

t.test('the SSE parser follows the standard: multi-line data, comments, retry, ids and split line ends', async (t) => {
  const program = [
    'import json, sys',
    `sys.path.insert(0, ${JSON.stringify(fileURLToPath(new URL('../../examples/python', import.meta.url)))})`,
    'from agentd_client import SseParser',
    'parser = SseParser()',
    'events = []',
    'for piece in json.load(sys.stdin):',
    '    events += [e.__dict__ for e in parser.feed(piece)]',
    'print(json.dumps({"events": events, "retry": parser.retry_ms, "lastId": parser.last_event_id}))'
  ].join('\n')
  const pieces = [
    '\ufeffretry: 1500\n\n: ping\n\nid: 7\nevent: text_chunk\ndata: {"a":\ndata:1}\n\n',
    'data: no event name\r',
    '\n\r\n',
    'id: 8\rdata:  two spaces\r\rid\ndata\n\nevent: empty\n\n',
    'data: unfinished'
  ]
  const out = await new Promise<string>((resolve, reject) => {
    const child = execFile('python3', ['-B', '-c', program], { timeout: 10_000 }, (err, stdout) => (err ? reject(err) : resolve(stdout)))
    child.stdin?.end(JSON.stringify(pieces))
  })
  t.same(JSON.parse(out), {
    events: [
      { type: 'text_chunk', data: '{"a":\n1}', last_event_id: '7' },
      { type: 'message', data: 'no event name', last_event_id: '7' },
      { type: 'message', data: ' two spaces', last_event_id: '8' },
      { type: 'message', data: '', last_event_id: '' }
    ],
    retry: 1500,
    lastId: ''
  })
})

t.test('a very large event is parsed in time linear in its size: 8 MiB in 64 KiB pieces takes about 8 times 1 MiB', async (t) => {
  const program = [
    'import json, sys, time',
    `sys.path.insert(0, ${JSON.stringify(fileURLToPath(new URL('../../examples/python', import.meta.url)))})`,
    'from agentd_client import SseParser',
    'def parse_seconds(size):',
    '    stream = "id: 1\\r\\nevent: tool:end\\r\\ndata: " + "x" * size + "\\r\\n\\r\\n"',
    '    best = None',
    '    for _ in range(3):',
    '        parser = SseParser()',
    '        started = time.perf_counter()',
    '        events = [e for i in range(0, len(stream), 65536) for e in parser.feed(stream[i:i + 65536])]',
    '        elapsed = time.perf_counter() - started',
    '        assert [(e.type, len(e.data)) for e in events] == [("tool:end", size)]',
    '        best = elapsed if best is None else min(best, elapsed)',
    '    return best',
    'print(json.dumps({"small": parse_seconds(1 << 20), "large": parse_seconds(8 << 20)}))'
  ].join('\n')
  const out = await new Promise<string>((resolve, reject) => {
    execFile('python3', ['-B', '-c', program], { timeout: 60_000 }, (err, stdout) => (err ? reject(err) : resolve(stdout)))
  })
  const { small, large } = JSON.parse(out) as { small: number; large: number }
  // Linear is a ratio near 8; reading the whole buffer again per piece made it about 60.
  t.ok(large / small < 24, `1 MiB in ${(small * 1000).toFixed(1)} ms, 8 MiB in ${(large * 1000).toFixed(1)} ms`)
})

/**
 * A TCP proxy in front of the service that cuts the first `times` SSE responses after `frames` frames
 * and `into` bytes of the next one
 * (the `retry:` frame counts) and passes everything else through.
 */
async function startCuttingProxy(t: TapTest, targetPort: number, frames: number, times = 1, into = 0): Promise<{ url: string; cut: boolean; cuts: number }> {
  const sockets = new Set<Socket>()
  const state = { url: '', cut: false, cuts: 0 }
  const server = createServer((client) => {
    const upstream = connect(targetPort, '127.0.0.1')
    for (const socket of [client, upstream]) {
      sockets.add(socket)
      socket.on('close', () => sockets.delete(socket))
      socket.on('error', () => socket.destroy())
    }
    client.on('close', () => upstream.destroy())
    upstream.on('close', () => client.destroy())
    client.pipe(upstream)

    let seen = ''
    let passing = state.cuts >= times
    upstream.on('data', (data: Buffer) => {
      if (passing || (seen === '' && !data.includes('text/event-stream'))) return void client.write(data)
      seen += data.toString('latin1')
      let end = 0
      for (let i = 0; i < frames; i++) {
        end = seen.indexOf('\n\n', end)
        if (end < 0) return void client.write(data)
        end += 2
      }
      const cutAt = end + into
      if (seen.length < cutAt) return void client.write(data)
      state.cut = true
      state.cuts++
      passing = true
      client.end(data.subarray(0, data.length - (seen.length - cutAt)), () => client.destroy())
      upstream.destroy()
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    for (const socket of sockets) socket.destroy()
    return new Promise<void>((resolve) => server.close(() => resolve()))
  })
  const address = server.address()
  if (!address || typeof address === 'string') throw new Error('no proxy address')
  state.url = `http://127.0.0.1:${address.port}`
  return state
}
