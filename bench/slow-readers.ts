/**
 * slow-readers: what readers that never read cost agentd. Starts agentd (`src/server.ts` of the
 * given checkout, default this one) on a SQLite file, opens READERS event streams on one session
 * whose sockets never read, runs RUNS long answers on it, and prints agentd's RSS (from /proc)
 * before, at its peak and after, and the slowest /healthz answer meanwhile. Linux only.
 * `node bench/slow-readers.ts [agentd checkout] [readers]`
 */
import { spawn } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { connect, createServer, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { startDevModel } from '../src/model/dev-model.ts'

const checkout = resolve(process.argv[2] ?? '.')
const READERS = Number(process.argv[3] ?? 64)
const RUNS = 4
const CHUNK = 'x'.repeat(64 * 1024)

const freePort = () => new Promise<number>((done) => {
  const server = createServer().listen(0, '127.0.0.1', () => {
    const { port } = server.address() as { port: number }
    server.close(() => done(port))
  })
})
const rssMb = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]) / 1024

const model = await startDevModel({ host: '127.0.0.1', port: 0 })
const dir = mkdtempSync(join(tmpdir(), 'agentd-slow-readers-'))
const port = await freePort()
const base = `http://127.0.0.1:${port}`
const agentd = spawn(process.execPath, [join(checkout, 'src/server.ts')], {
  cwd: checkout,
  stdio: ['ignore', 'ignore', 'inherit'],
  env: {
    ...process.env, PORT: String(port), AGENTD_DB: join(dir, 'agentd.db'), AGENTD_WORKSPACES: join(dir, 'ws'),
    OPENAI_BASE_URL: model.url, OPENAI_API_KEY: 'bench', LOG_LEVEL: 'silent', AGENTD_RATE_LIMIT_MAX: '0',
    AGENTD_MAX_STREAMS_PER_KEY: String(READERS + 10)
  }
})
const pid = agentd.pid as number
const sockets: Socket[] = []
try {
  for (let i = 0; ; i++) {
    if (await fetch(`${base}/healthz`).then((r) => r.ok, () => false)) break
    if (i > 600) throw new Error('agentd did not start')
    await new Promise((r) => setTimeout(r, 100))
  }
  const session = (await (await fetch(`${base}/v1/sessions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"tools":[]}' })).json()) as { id: string }
  for (let i = 0; i < READERS; i++) {
    const socket = connect(port, '127.0.0.1')
    socket.pause()
    socket.write(`GET /v1/sessions/${session.id}/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n`)
    sockets.push(socket)
  }
  await new Promise((r) => setTimeout(r, 1000))
  const before = rssMb(pid)
  let peak = before
  const sampler = setInterval(() => (peak = Math.max(peak, rssMb(pid))), 20)
  let slowest = 0
  let probing = true
  const probe = (async () => {
    while (probing) {
      const started = performance.now()
      await fetch(`${base}/healthz`)
      slowest = Math.max(slowest, performance.now() - started)
      await new Promise((r) => setTimeout(r, 50))
    }
  })()
  model.script(...Array.from({ length: RUNS }, () => ({ text: Array.from({ length: 60 }, () => CHUNK).join(' '), chunks: 60 })))
  const started = performance.now()
  for (let i = 0; i < RUNS; i++) {
    await fetch(`${base}/v1/sessions/${session.id}/messages?wait=true`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ content: `round ${i}` }) })
  }
  const seconds = (performance.now() - started) / 1000
  await new Promise((r) => setTimeout(r, 1000))
  probing = false
  await probe
  clearInterval(sampler)
  const metrics = await (await fetch(`${base}/metrics`)).text()
  const open = /^agentd_sse_connections (\S+)$/m.exec(metrics)?.[1]
  const heldPeak = /^agentd_sse_held_bytes_peak (\S+)$/m.exec(metrics)?.[1]
  console.log(`checkout ${checkout}: ${READERS} silent readers, ${RUNS} runs of ~7.7 MB of events each in ${seconds.toFixed(1)} s`)
  console.log(`agentd RSS: before ${before.toFixed(0)} MB, peak ${peak.toFixed(0)} MB, after ${rssMb(pid).toFixed(0)} MB; slowest /healthz ${slowest.toFixed(0)} ms; streams still open ${open}; held bytes peak ${heldPeak ?? 'n/a'}`)
} finally {
  for (const socket of sockets) socket.destroy()
  agentd.kill('SIGKILL')
  await model.close()
  rmSync(dir, { recursive: true, force: true })
}
