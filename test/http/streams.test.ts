import { spawn } from 'node:child_process'
import { connect, type Socket } from 'node:net'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { readSse } from '../helpers/sse.ts'

/** A raw connection that asks for a session's events and never reads a byte of the answer. */
function silentReader(t: { teardown(fn: () => void): void }, base: string, sessionId: string): { socket: Socket; closed: Promise<void> } {
  const { port } = new URL(base)
  const socket = connect(Number(port), '127.0.0.1')
  socket.pause()
  socket.write(`GET /v1/sessions/${sessionId}/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n`)
  t.teardown(() => socket.destroy())
  return { socket, closed: new Promise((resolve) => socket.on('close', () => resolve())) }
}

const until = async (condition: () => boolean, timeoutMs = 5000) => {
  const deadline = Date.now() + timeoutMs
  while (!condition() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10))
  return condition()
}

/** A raw stream that notes when its `retry` frame and each `: ping` comment arrive. */
function pingWatcher(t: { teardown(fn: () => void): void }, base: string, sessionId: string): { opened: number | null; pings: number[] } {
  const { port } = new URL(base)
  const socket = connect(Number(port), '127.0.0.1')
  const watcher: { opened: number | null; pings: number[] } = { opened: null, pings: [] }
  let text = ''
  socket.setEncoding('latin1')
  socket.on('data', (chunk: string) => {
    const now = performance.now()
    text += chunk
    if (watcher.opened === null && text.includes('retry: 2000\n\n')) watcher.opened = now
    for (let at = text.indexOf(': ping\n\n'); at >= 0; at = text.indexOf(': ping\n\n')) {
      watcher.pings.push(now)
      text = text.slice(at + 8)
    }
  })
  socket.write(`GET /v1/sessions/${sessionId}/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n`)
  t.teardown(() => socket.destroy())
  return watcher
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

t.test('every stream gets a ping within an interval of opening, then every interval, however many open at once', async (t) => {
  const interval = 300
  const { app } = await buildTestApp(t, { app: { ssePingMs: interval } })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  // Some open together (a reconnect storm), some one after the other over two intervals.
  const watchers = Array.from({ length: 6 }, () => pingWatcher(t, base, session.id))
  for (let i = 0; i < 6; i++) {
    await sleep(interval / 3)
    watchers.push(pingWatcher(t, base, session.id))
  }
  await sleep(3.5 * interval)
  const now = performance.now()
  // Timers fire late on a busy machine, so a gap may stretch and the next shrink; the bounds
  // are wide, but a stream pinged at the wrong rate, or not at all, falls outside them.
  for (const [i, watcher] of watchers.entries()) {
    if (watcher.opened === null) {
      t.fail(`stream ${i} never opened`)
      continue
    }
    const first = Math.round((watcher.pings[0] ?? now) - watcher.opened)
    const gaps = watcher.pings.slice(1).map((time, k) => Math.round(time - (watcher.pings[k] as number)))
    const expected = Math.floor((now - watcher.opened) / interval)
    t.ok(first <= interval * 1.5, `stream ${i}: its first ping ${first} ms after it opened`)
    t.ok(gaps.every((gap) => gap >= interval / 2 && gap <= interval * 1.5), `stream ${i}: then one after each of ${gaps.join(', ')} ms`)
    t.ok(watcher.pings.length >= expected - 1 && watcher.pings.length <= expected + 1, `stream ${i}: ${watcher.pings.length} pings in ${Math.round(now - watcher.opened)} ms`)
  }
})

t.test('the process serves at most AGENTD_MAX_STREAMS streams: beyond, 503 UNAVAILABLE with Retry-After, and no run starts', async (t) => {
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_MAX_STREAMS: '2' } })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const first = silentReader(t, base, session.id)
  silentReader(t, base, session.id)
  t.ok(await until(() => app.streams.count === 2), 'two streams open')

  const refused = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events`, headers: { accept: 'text/event-stream' } })
  t.equal(refused.statusCode, 503)
  t.equal(refused.headers['retry-after'], '5')
  t.match(refused.json().error, { code: 'UNAVAILABLE', retryable: true, details: { limit: 'streams', max: 2 } })
  t.match(refused.json().error.message, /AGENTD_MAX_STREAMS/)

  const posted = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, headers: { accept: 'text/event-stream' }, payload: { content: 'hi' } })
  t.equal(posted.statusCode, 503, 'a streamed POST is refused before its run exists')
  t.equal(devModel.requests.length, 0, 'so the model was never called')

  first.socket.destroy()
  t.ok(await until(() => app.streams.count === 1), 'a closed stream frees its place')
  const again = await readSse(`${base}/v1/sessions/${session.id}/events`, { timeoutMs: 200 })
  t.equal(again.status, 200)
})

/**
 * A client in its own process that reads its stream as fast as it comes and prints each event id;
 * like any SSE client it reconnects with Last-Event-ID when the stream is dropped (a busy machine
 * can leave even a fast reader behind for a moment), so it must still get every event once.
 */
function keepingUpReader(t: { teardown(fn: () => void): void }, base: string, sessionId: string): { ids: number[] } {
  const { port } = new URL(base)
  const script = `
    let last = 0
    const open = () => {
      const socket = require('node:net').connect(${Number(port)}, '127.0.0.1')
      socket.write('GET /v1/sessions/${sessionId}/events HTTP/1.1\\r\\nHost: x\\r\\nAccept: text/event-stream\\r\\n' +
        (last ? 'Last-Event-ID: ' + last + '\\r\\n' : '') + '\\r\\n')
      let tail = ''
      socket.setEncoding('latin1')
      socket.on('data', (chunk) => {
        const text = tail + chunk
        for (const match of text.matchAll(/\\nid: (\\d+)\\n/g)) {
          last = Number(match[1])
          process.stdout.write(match[1] + '\\n')
        }
        tail = text.slice(-40)
      })
      socket.on('close', () => setTimeout(open, 20))
      socket.on('error', () => {})
    }
    open()`
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] })
  t.teardown(() => child.kill())
  const ids: number[] = []
  let rest = ''
  child.stdout.setEncoding('utf8')
  child.stdout.on('data', (chunk: string) => {
    const lines = (rest + chunk).split('\n')
    rest = lines.pop() ?? ''
    for (const line of lines) if (ids.at(-1) !== Number(line)) ids.push(Number(line))
  })
  return { ids }
}

const gauge = async (base: string, name: string) => {
  const text = await (await fetch(`${base}/metrics`)).text()
  return Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1])
}

t.test('readers that never read hold a bounded number of bytes in all; a reader that keeps up gets everything; /healthz stays fast', async (t) => {
  const totalBudget = 4 * 1024 * 1024
  const { app, devModel } = await buildTestApp(t, {
    env: { AGENTD_MAX_STREAM_BYTES: String(totalBudget) },
    app: { sseMaxBufferedBytes: 1024 * 1024 }
  })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const readers = Array.from({ length: 30 }, () => silentReader(t, base, session.id))
  const good = keepingUpReader(t, base, session.id)
  t.ok(await until(() => app.streams.count === readers.length + 1, 15_000), `${readers.length} silent streams and one that reads are open`)

  let slowestHealth = 0
  let probing = true
  const probe = (async () => {
    while (probing) {
      const started = performance.now()
      const res = await fetch(`${base}/healthz`)
      if (res.status !== 200) t.fail(`/healthz answered ${res.status}`)
      slowestHealth = Math.max(slowestHealth, performance.now() - started)
      await new Promise((r) => setTimeout(r, 20))
    }
  })()

  // Four runs of 60 chunks of 32 KiB each: some 16 MB of events for every stream, far more
  // than the kernel's socket buffers take from a reader that never reads.
  const chunk = 'x'.repeat(32 * 1024)
  const runs = 4
  devModel.script(...Array.from({ length: runs }, () => ({ text: Array.from({ length: 60 }, () => chunk).join(' '), chunks: 60 })))
  const rssBefore = process.memoryUsage().rss
  for (let i = 0; i < runs; i++) {
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: `round ${i}` } })
  }
  const rssGrowth = process.memoryUsage().rss - rssBefore
  probing = false
  await probe

  // A stream is dropped at its next event once over its limits, so the bound is the budget plus
  // at most one frame per stream (the largest here is the 2 MB text_chunk_end).
  const peak = await gauge(base, 'agentd_sse_held_bytes_peak')
  const largestFrame = 61 * chunk.length
  t.ok(peak > 0 && peak <= totalBudget + readers.length * largestFrame, `held at most ${peak} bytes at once`)
  t.ok(peak < readers.length * 1024 * 1024, `far less than the per-stream limits summed (${readers.length} MiB): ${peak}`)
  t.ok(await until(() => app.streams.count === 1), `every silent reader was dropped; the one that reads is open (${app.streams.count} open)`)
  // A paused socket does not report its end until it reads what the kernel still holds for it.
  for (const reader of readers) reader.socket.resume()
  const closedAll = await Promise.race([Promise.all(readers.map((r) => r.closed)).then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 5000))])
  t.ok(closedAll, 'their connections are closed')
  t.ok(await until(() => app.streams.heldBytes === 0), 'the bytes of dropped streams are no longer counted')

  const stored = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data
  const lastSeq = stored.at(-1).seq
  t.ok(await until(() => good.ids.at(-1) === lastSeq), `the reader that keeps up reached the last event (${good.ids.length} of ${stored.length})`)
  t.same(good.ids, stored.map((e: { seq: number }) => e.seq), 'and got every event once, in order, across any reconnect')
  t.ok(slowestHealth < 2000, `/healthz answered within ${slowestHealth.toFixed(0)} ms throughout`)
  t.comment(`RSS grew by ${(rssGrowth / 1e6).toFixed(0)} MB while ${readers.length} silent readers followed ~16 MB of events each; held bytes peaked at ${(peak / 1e6).toFixed(1)} MB`)
  t.ok(rssGrowth < 400e6, 'memory stays bounded')
})

t.test('a reader that comes back for a backlog larger than its limit gets it all, at its own pace', async (t) => {
  const { app, devModel } = await buildTestApp(t, { app: { sseMaxBufferedBytes: 256 * 1024 } })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const chunk = 'y'.repeat(64 * 1024)
  devModel.script({ text: Array.from({ length: 30 }, () => chunk).join(' '), chunks: 30 })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'big' } })
  const stored = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data
  const replayed = await readSse(`${base}/v1/sessions/${session.id}/events?until=done`, { timeoutMs: 10_000 })
  t.equal(replayed.status, 200)
  t.same(replayed.events.map((e) => e.seq), stored.map((e: { seq: number }) => e.seq), 'every stored event, though they are some 4 MB against a 256 KiB limit')
})
