import { connect, type Socket } from 'node:net'
import { Pool } from 'undici'
import { startChild, type ChildMemory, type ChildServer } from './child.ts'
import { AgentdClient, cpuTimeMs, runPool, sqliteSetting, startDevModelProcess, startServiceProcess } from './harness.ts'
import { fmt, percentile, printTable } from './report.ts'

/** BENCH_STREAMS overrides it (a quick try with fewer). */
const STREAMS = Number(process.env['BENCH_STREAMS'] ?? 10_000)
/** Connections being opened at once: more than the listen backlog would be refused. */
const OPENING_AT_ONCE = 200
const HEALTH_PROBES = 200
/** 200 probes 80 ms apart take over 16 s, longer than the 15 s ping interval: every stream's ping falls inside the window once. */
const HEALTH_SPACING_MS = 80
/** Sessions whose streams get a run's events, to show the idle streams still work. */
const CHECKED_SESSIONS = 3
const OPEN_TIME_LIMIT_MS = 180_000

/** One stream as the bench holds it: a raw socket, what it has read, and whether its `retry` frame came. */
interface IdleStream {
  readonly socket: Socket
  readonly sessionId: string
  /** Everything read since the `retry: 2000` frame (pings, events), or the head until then. */
  text: string
  ready: boolean
}

/** What one server cost with no stream and with STREAMS idle streams. */
interface Measured {
  before: ChildMemory
  after: ChildMemory
  healthIdle: number[]
  healthLoaded: number[]
  /** CPU of the server during each probe window, in % of one core. */
  cpuIdle: number
  cpuLoaded: number
  openSeconds: number
  streams: IdleStream[]
}

/**
 * idle-streams: what STREAMS idle SSE streams cost one agentd process, beside the floor of what
 * Node itself needs for that many SSE connections (bench/bare-sse-process.ts, measured the same
 * way in the same run). Both servers run in their own process with --expose-gc; the bench opens
 * the streams over raw sockets (GET …/events, read until the `retry: 2000` frame), takes the
 * server's RSS and its V8 heap after a full GC before and after, and times /healthz over a window
 * longer than the ping interval, with no stream and with all of them open. agentd's streams
 * follow one session each, as clients watching their own sessions do (creating 10 000 sessions
 * takes seconds); then runs in a few sessions show their streams still carry events, and the
 * others none.
 */
export async function run(): Promise<void> {
  const bare = await startChild('./bare-sse-process.ts', [], ['--expose-gc'])
  let bareFigures: Measured
  try {
    bareFigures = await measure(bare, Array.from({ length: STREAMS }, (_, i) => `ses_bare${i}`))
    closeStreams(bareFigures.streams)
  } finally {
    await bare.close()
  }

  const model = await startDevModelProcess()
  const service = await startServiceProcess(model.url, sqliteSetting(), ['--expose-gc'])
  const agentd = new AgentdClient(service.url, 8)
  try {
    const created = performance.now()
    const sessionIds = await createSessions(agentd, STREAMS)
    const createSeconds = (performance.now() - created) / 1000
    const figures = await measure(service, sessionIds)
    const check = await checkEvents(agentd, figures.streams)
    closeStreams(figures.streams)

    console.log(`\nidle-streams: ${STREAMS} idle SSE streams held open in one process; memory after a full GC; /healthz one request every ` +
      `${HEALTH_SPACING_MS} ms for ${fmt((HEALTH_PROBES * HEALTH_SPACING_MS) / 1000, 0)} s (a ping interval), and the server's CPU meanwhile`)
    const perStream = (m: Measured, key: 'rss' | 'heapUsed') => fmt((m.after[key] - m.before[key]) / STREAMS / 1024, 1)
    const rows = (label: string, m: Measured) => [
      [label, '0', '', '', fmt(percentile(m.healthIdle, 50)), fmt(percentile(m.healthIdle, 99)), fmt(Math.max(...m.healthIdle)), fmt(m.cpuIdle, 1)],
      [label, String(STREAMS), perStream(m, 'rss'), perStream(m, 'heapUsed'), fmt(percentile(m.healthLoaded, 50)), fmt(percentile(m.healthLoaded, 99)), fmt(Math.max(...m.healthLoaded)), fmt(m.cpuLoaded, 1)]
    ]
    printTable([
      ['server', 'streams', 'RSS KB/stream', 'heap KB/stream', '/healthz p50 ms', 'p99 ms', 'max ms', 'CPU % of a core'],
      ...rows('bare node:http (baseline)', bareFigures),
      ...rows('agentd', figures)
    ])
    const mb = (bytes: number) => fmt(bytes / 2 ** 20, 0)
    for (const [label, m] of [['bare node:http', bareFigures], ['agentd', figures]] as const) {
      console.log(`${label}: RSS ${mb(m.before.rss)} → ${mb(m.after.rss)} MB, heap ${mb(m.before.heapUsed)} → ${mb(m.after.heapUsed)} MB, ` +
        `V8 young generation ${mb(m.before.youngGeneration)} → ${mb(m.after.youngGeneration)} MB, external ${mb(m.before.external)} → ${mb(m.after.external)} MB; ` +
        `${STREAMS} streams opened in ${fmt(m.openSeconds, 1)} s` +
        (m.after.collected ? '' : ' (no forced GC: start it with --expose-gc)'))
    }
    console.log(`agentd: ${STREAMS} sessions created in ${fmt(createSeconds, 1)} s; ${check}`)
  } finally {
    await agentd.close()
    await service.close()
    await model.close()
  }
}

/** Memory and /healthz of a server with no stream, then with one idle stream per given session. */
async function measure(server: ChildServer, sessionIds: string[]): Promise<Measured> {
  const health = new Pool(server.url, { connections: 1 })
  try {
    for (let i = 0; i < 20; i++) await probeHealth(health)
    const idle = await probeWindow(server, health)
    const before = await server.memory()
    const opened = performance.now()
    const streams = await openStreams(server.url, sessionIds)
    const openSeconds = (performance.now() - opened) / 1000
    const loaded = await probeWindow(server, health)
    // Taken after the window: every stream has been idle a ping interval and sent its ping.
    const after = await server.memory()
    return { before, after, healthIdle: idle.latencies, healthLoaded: loaded.latencies, cpuIdle: idle.cpu, cpuLoaded: loaded.cpu, openSeconds, streams }
  } finally {
    await health.close()
  }
}

/** HEALTH_PROBES sequential GET /healthz, HEALTH_SPACING_MS apart; their latencies and the server's CPU meanwhile. */
async function probeWindow(server: ChildServer, health: Pool): Promise<{ latencies: number[]; cpu: number }> {
  const latencies: number[] = []
  const cpuBefore = cpuTimeMs(server.pid)
  const started = performance.now()
  for (let i = 0; i < HEALTH_PROBES; i++) {
    latencies.push(await probeHealth(health))
    await new Promise((resolve) => setTimeout(resolve, HEALTH_SPACING_MS))
  }
  const cpuAfter = cpuTimeMs(server.pid)
  const cpu = cpuBefore === null || cpuAfter === null ? Number.NaN : (100 * (cpuAfter - cpuBefore)) / (performance.now() - started)
  return { latencies, cpu }
}

async function probeHealth(health: Pool): Promise<number> {
  const started = performance.now()
  const res = await health.request({ method: 'GET', path: '/healthz' })
  await res.body.text()
  if (res.statusCode !== 200) throw new Error(`/healthz answered ${res.statusCode}`)
  return performance.now() - started
}

/** Creates `count` text-only sessions, 8 requests at a time. */
async function createSessions(agentd: AgentdClient, count: number): Promise<string[]> {
  const ids: string[] = []
  const outcome = await runPool(count, 8, Date.now() + OPEN_TIME_LIMIT_MS, async (i) => {
    ids[i] = await agentd.createSession({ tools: [] })
  })
  if (outcome.failures.length > 0 || outcome.timedOut) throw new Error(`creating sessions: ${outcome.finished} of ${count}; ${outcome.failures[0] ?? 'time limit'}`)
  return ids
}

/**
 * Opens one SSE stream per session id over a raw socket, OPENING_AT_ONCE at a time, and resolves
 * once every one has its `retry: 2000` frame; a stream that is refused or closes fails the bench.
 */
async function openStreams(baseUrl: string, sessionIds: string[]): Promise<IdleStream[]> {
  const { hostname, port } = new URL(baseUrl)
  const streams: IdleStream[] = []
  const outcome = await runPool(sessionIds.length, OPENING_AT_ONCE, Date.now() + OPEN_TIME_LIMIT_MS, (i) => new Promise<void>((resolve, reject) => {
    const sessionId = sessionIds[i] as string
    const socket = connect(Number(port), hostname)
    const stream: IdleStream = { socket, sessionId, text: '', ready: false }
    streams.push(stream)
    socket.setEncoding('latin1')
    socket.on('data', (chunk: string) => {
      stream.text += chunk
      if (stream.ready) return
      const headEnd = stream.text.indexOf('\r\n\r\n')
      if (headEnd >= 0 && !stream.text.startsWith('HTTP/1.1 200')) {
        reject(new Error(`stream ${i} refused: ${stream.text.slice(0, headEnd)}`))
        socket.destroy()
        return
      }
      const retryAt = stream.text.indexOf('retry: 2000\n\n')
      if (retryAt < 0) return
      stream.ready = true
      stream.text = stream.text.slice(retryAt + 13)
      resolve()
    })
    socket.on('error', (err) => reject(err))
    socket.on('close', () => {
      if (!stream.ready) reject(new Error(`stream ${i} closed before its retry frame`))
      stream.ready = false
    })
    socket.write(`GET /v1/sessions/${sessionId}/events HTTP/1.1\r\nHost: ${hostname}\r\nAccept: text/event-stream\r\n\r\n`)
  }))
  if (outcome.failures.length > 0 || outcome.timedOut) {
    closeStreams(streams)
    throw new Error(`opening streams: ${outcome.finished} of ${sessionIds.length} opened; ${outcome.failures[0] ?? 'time limit'}`)
  }
  return streams
}

/**
 * Runs one message in each of CHECKED_SESSIONS sessions and checks that their streams got every
 * event of it in order, through `done`, that every other stream got no event, and that none closed.
 */
async function checkEvents(agentd: AgentdClient, streams: IdleStream[]): Promise<string> {
  const checked = streams.slice(0, CHECKED_SESSIONS)
  const lastSeqs = await Promise.all(checked.map(async (stream) => (await agentd.streamMessage(stream.sessionId, 'Are you there?')).lastSeq))
  const ids = (text: string) => [...text.matchAll(/\nid: (\d+)\nevent: /g)].map((match) => Number(match[1]))
  const deadline = Date.now() + 10_000
  while (checked.some((stream, i) => ids(`\n${stream.text}`).at(-1) !== lastSeqs[i]) && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  checked.forEach((stream, i) => {
    const got = ids(`\n${stream.text}`)
    const expected = Array.from({ length: lastSeqs[i] as number }, (_, k) => k + 1)
    if (got.join() !== expected.join()) throw new Error(`the stream of ${stream.sessionId} got events ${got.join()}; expected 1…${lastSeqs[i]}`)
    // The last event frame is `done` (frames arrive as chunks of the chunked body, each whole).
    if (!stream.text.startsWith('\nevent: done\n', stream.text.lastIndexOf('\nevent: '))) throw new Error(`the stream of ${stream.sessionId} did not end with done`)
  })
  const others = streams.slice(CHECKED_SESSIONS)
  const withEvents = others.filter((stream) => stream.text.includes('\nevent: ')).length
  const closed = streams.filter((stream) => !stream.ready).length
  if (withEvents > 0) throw new Error(`${withEvents} streams of other sessions got events`)
  if (closed > 0) throw new Error(`${closed} idle streams were closed by the server`)
  const pings = others.filter((stream) => stream.text.includes(': ping\n\n')).length
  return `a run in each of ${CHECKED_SESSIONS} sessions reached their streams (events 1…${lastSeqs.join('/')}, through done); ` +
    `the ${others.length} other streams got no event, ${pings} of them a ping; none was closed`
}

function closeStreams(streams: IdleStream[]): void {
  for (const stream of streams) stream.socket.destroy()
}
