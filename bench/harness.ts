/**
 * What the benches share. Every bench runs three processes: the bench itself (the clients and the
 * stopwatch), agentd (buildApp, in bench/service-process.ts) and the model. In one event loop each
 * one's work would delay the others' timers and sockets and blur what is measured: the model's
 * send stamps would wait behind the service's work, and the clients' SSE parsing would be billed
 * to the service. Separate processes are also how agentd and a model server run for real.
 */
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import OpenAI from 'openai'
import type { ChatCompletionCreateParamsStreaming } from 'openai/resources/chat/completions'
import { Agent, Pool, fetch as undiciFetch } from 'undici'
import { startChild, type ChildServer } from './child.ts'
import { fmt } from './report.ts'
import { printCpuProfile } from './cpu-profile.ts'
import { preciseNow, type StampingModelOptions } from './stamping-model.ts'

/** The dev model (src/model/dev-model.ts) in its own process. */
export function startDevModelProcess(): Promise<ChildServer> {
  return startChild('./model-process.ts', ['dev'])
}

/** The stamping model (bench/stamping-model.ts) in its own process. */
export function startStampingModelProcess(options: StampingModelOptions): Promise<ChildServer> {
  return startChild('./model-process.ts', ['stamping', JSON.stringify(options)])
}

/**
 * The bare agent (bench/bare-agent-process.ts): the same loop, provider and tools as agentd with
 * nothing around them, in its own process; its workspaces in a temporary folder removed after it exits.
 * It runs with agentd's Node flags and BENCH_SERVICE_FLAGS, so that a yardstick is measured as what it measures.
 */
export function startBareAgentProcess(modelUrl: string): Promise<ChildServer> {
  return inTempDir('agentd-bench-bare-', (dir) => startChild('./bare-agent-process.ts', [modelUrl, dir], serviceFlags()))
}

/**
 * The Node flags agentd runs with when deployed: those of `npm start` (package.json; the
 * Dockerfile's CMD repeats them). The servers under test get them first, so that the benches
 * measure agentd as it runs (and the bare agent alike); BENCH_SERVICE_FLAGS come after and win.
 */
const DEPLOYED_FLAGS: string[] = (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { scripts: { start: string } })
  .scripts.start.split(/\s+/).filter((arg) => arg.startsWith('--'))

/** BENCH_SERVICE_FLAGS: more Node flags for the server under test (agentd, and the bare agent beside it), e.g. "--trace-gc --max-semi-space-size=8". */
export const serviceFlags = (): string[] => [...DEPLOYED_FLAGS, ...(process.env['BENCH_SERVICE_FLAGS'] ?? '').split(' ').filter(Boolean)]

/**
 * A child started with a temporary folder of its own, removed once the child has exited (or has
 * failed to start); `beforeRemove` reads what the child left there.
 */
async function inTempDir(prefix: string, start: (dir: string) => Promise<ChildServer>, beforeRemove?: (dir: string, child: ChildServer) => void): Promise<ChildServer> {
  const dir = mkdtempSync(join(tmpdir(), prefix))
  const child = await start(dir).catch((err: unknown) => {
    rmSync(dir, { recursive: true, force: true })
    throw err
  })
  return {
    ...child,
    async close() {
      await child.close()
      try {
        beforeRemove?.(dir, child)
      } finally {
        rmSync(dir, { recursive: true, force: true })
      }
    }
  }
}

/** Where agentd's SQLite store lives in a bench: a file (every event on disk) or `:memory:`. */
export type BenchSqlite = 'file' | 'memory'

/** BENCH_SQLITE=file|memory (default file), for the benches that run one agentd process. */
export function sqliteSetting(): BenchSqlite {
  const value = process.env['BENCH_SQLITE'] ?? 'file'
  if (value !== 'file' && value !== 'memory') throw new Error('BENCH_SQLITE must be file or memory')
  return value
}

/**
 * agentd in its own process, its SQLite file (or `:memory:`) and workspaces in a temporary folder
 * removed after it exits. With BENCH_CPU_PROF=1 it runs under --cpu-prof and its profile is
 * summarised when it closes. `execArgv` adds Node flags (--expose-gc for memory figures);
 * `watch`: it answers `ask('sample')` with a ServiceSample (bench/service-watch.ts).
 */
export async function startServiceProcess(
  modelUrl: string, sqlite: BenchSqlite = 'file', execArgv: string[] = [], options: { watch?: boolean } = {}
): Promise<ChildServer> {
  const profiling = Boolean(process.env['BENCH_CPU_PROF'])
  const extra = serviceFlags()
  const env = { ...(sqlite === 'memory' ? { BENCH_SERVICE_SQLITE: 'memory' } : {}), ...(options.watch ? { BENCH_SERVICE_WATCH: '1' } : {}) }
  return inTempDir('agentd-bench-', (dir) => {
    const flags = [...execArgv, ...extra, ...(profiling ? ['--cpu-prof', `--cpu-prof-dir=${join(dir, 'profile')}`] : [])]
    return startChild('./service-process.ts', [modelUrl, dir], flags, env)
  }, (dir, service) => {
    if (!profiling) return
    for (const file of readdirSync(join(dir, 'profile'))) {
      printCpuProfile(join(dir, 'profile', file), `agentd CPU profile (pid ${service.pid})`)
      // BENCH_CPU_PROF_KEEP=<folder>: the raw profile is kept there, for Chrome DevTools or speedscope.
      const keep = process.env['BENCH_CPU_PROF_KEEP']
      if (keep) {
        mkdirSync(keep, { recursive: true })
        copyFileSync(join(dir, 'profile', file), join(keep, file))
        console.log(`profile kept: ${join(keep, file)}`)
      }
    }
  })
}

/** The origin of a model base URL ("http://127.0.0.1:1234/v1" → "http://127.0.0.1:1234"), for its /__ routes. */
export const originOf = (url: string): string => new URL(url).origin

/** Sends a JSON request to one of the bench's own servers (dev model scripting, clocks) and returns the parsed answer. */
export async function callJson<T>(url: string, method = 'GET', body?: unknown): Promise<T> {
  const res = await undiciFetch(url, {
    method,
    ...(body === undefined ? {} : { body: JSON.stringify(body), headers: { 'content-type': 'application/json' } })
  })
  if (!res.ok) throw new Error(`${method} ${url}: HTTP ${res.status} ${await res.text()}`)
  return (res.status === 204 ? null : await res.json()) as T
}

/** How a streamed run ended, as the client saw it. */
export interface StreamedRun {
  /** The `done` event's reason. */
  reason: string
  /** The `done` event's seq: every event the session has persisted. */
  lastSeq: number
}

/** An agentd client over one undici Pool, with the few calls the benches make. */
export class AgentdClient {
  readonly pool: Pool

  constructor(baseUrl: string, connections: number) {
    // Streams hold their connection until `done`; a stalled run fails the bench instead of hanging it.
    this.pool = new Pool(baseUrl, { connections, pipelining: 1, headersTimeout: 30_000, bodyTimeout: 30_000 })
  }

  /** POST /v1/sessions; returns the new session's id. */
  async createSession(body: object): Promise<string> {
    const res = await this.pool.request({
      method: 'POST', path: '/v1/sessions', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body)
    })
    const session = (await res.body.json()) as { id?: string }
    if (res.statusCode !== 201 || !session.id) throw new Error(`POST /v1/sessions: HTTP ${res.statusCode} ${JSON.stringify(session)}`)
    return session.id
  }

  /**
   * POSTs a message with Accept: text/event-stream and reads the run's events to `done`.
   * `onEvent` gets each event frame's type and raw data, when its bytes arrived, and the whole
   * frame as received (its `id`, `event` and `data` lines, without the blank line that ends it).
   */
  async streamMessage(sessionId: string, content: string, onEvent?: (type: string, data: string, receivedAt: number, frame: string) => void): Promise<StreamedRun> {
    const res = await this.pool.request({
      method: 'POST',
      path: `/v1/sessions/${sessionId}/messages`,
      headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
      body: JSON.stringify({ content })
    })
    if (res.statusCode !== 200) throw new Error(`POST messages: HTTP ${res.statusCode} ${await res.body.text()}`)
    res.body.setEncoding('utf8')
    let buffer = ''
    let done: StreamedRun | null = null
    // Read to the end of the body even after `done` (agentd ends it there) so the connection is kept for the next request.
    for await (const piece of res.body as AsyncIterable<string>) {
      const receivedAt = preciseNow()
      buffer += piece
      let end: number
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const frame = buffer.slice(0, end)
        buffer = buffer.slice(end + 2)
        // agentd's frames are `id`, `event`, `data` lines in that order (one SSE encoder); others are retry and comments.
        const eventAt = frame.indexOf('\nevent: ')
        const dataAt = frame.indexOf('\ndata: ')
        if (eventAt < 0 || dataAt < 0) continue
        const type = frame.slice(eventAt + 8, dataAt)
        const data = frame.slice(dataAt + 7)
        onEvent?.(type, data, receivedAt, frame)
        if (type === 'done') {
          const event = JSON.parse(data) as { seq: number; data: { reason: string } }
          done = { reason: event.data.reason, lastSeq: event.seq }
        }
      }
    }
    if (!done) throw new Error(`the stream of ${sessionId} ended before done`)
    return done
  }

  close(): Promise<void> {
    return this.pool.close()
  }
}

/**
 * True when agentd's default session tools include a working fs_list: a run asked to call it
 * (the dev model's `call fs_list {}`; the stamping model calls it whenever offered) executes it.
 * Until the fs_* tools are wired into sessions, the benches fall back to what works and say so.
 */
export async function fsListIsWired(client: AgentdClient): Promise<boolean> {
  const sessionId = await client.createSession({})
  let executed = false
  await client.streamMessage(sessionId, 'call fs_list {}', (type, data) => {
    if (type === 'tool_executed' && (JSON.parse(data) as { data: { ok: boolean } }).data.ok) executed = true
  })
  return executed
}

/** The openai SDK set up as agentd's provider sets it up (undici, no SDK retries), for the direct baselines. */
export function createDirectClient(modelUrl: string): { client: OpenAI; close(): Promise<void> } {
  const dispatcher = new Agent({ keepAliveTimeout: 30_000 })
  const client = new OpenAI({
    apiKey: 'bench',
    baseURL: modelUrl,
    maxRetries: 0,
    fetch: undiciFetch as unknown as typeof globalThis.fetch,
    fetchOptions: { dispatcher }
  })
  return { client, close: () => dispatcher.close() }
}

/** One streaming chat completion, read to its end; returns the number of chunks. */
export async function streamCompletion(client: OpenAI, body: ChatCompletionCreateParamsStreaming): Promise<number> {
  let chunks = 0
  for await (const _chunk of await client.chat.completions.create(body)) chunks++
  return chunks
}

/**
 * Runs `task(i)` for i = 0 … count-1 with at most `concurrency` at once, stopping early at
 * `deadline` (Date.now() ms). Resolves with how many finished and the failures.
 */
export async function runPool(count: number, concurrency: number, deadline: number, task: (i: number) => Promise<void>): Promise<{ finished: number; failures: string[]; timedOut: boolean }> {
  let next = 0
  let finished = 0
  let timedOut = false
  const failures: string[] = []
  const worker = async () => {
    while (next < count) {
      if (Date.now() > deadline) {
        timedOut = true
        return
      }
      const i = next++
      try {
        await task(i)
        finished++
      } catch (err) {
        failures.push(err instanceof Error ? err.message : String(err))
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, worker))
  return { finished, failures, timedOut }
}

/** Throws with a clear message when a bench phase had failures, so bad figures are never printed as good ones. */
export function assertClean(phase: string, outcome: { finished: number; failures: string[]; timedOut: boolean }, expected: number): void {
  if (outcome.failures.length > 0) throw new Error(`${phase}: ${outcome.failures.length} runs failed; first: ${outcome.failures[0]}`)
  if (outcome.timedOut) console.log(`note: ${phase} hit its time limit after ${outcome.finished} of ${expected} runs; figures are from those`)
}

/**
 * CPU time (user + system, every thread) a process has used so far, in ms, from /proc; null
 * where there is no /proc. Shows which of the three processes a bench kept busy.
 */
export function cpuTimeMs(pid: number): number | null {
  try {
    // Fields after the command name, which is in parentheses and may hold spaces; utime and stime are the 12th and 13th.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS_PER_SECOND
  } catch {
    return null
  }
}

// USER_HZ: 100 on every Linux architecture Node supports.
const CLOCK_TICKS_PER_SECOND = 100

/** Starts measuring the CPU each process uses; stop() describes it as shares of one core. */
export function cpuMeter(processes: Record<string, number>): { stop(): string } {
  const started = performance.now()
  const own = process.cpuUsage()
  const before = Object.fromEntries(Object.entries(processes).map(([name, pid]) => [name, cpuTimeMs(pid)]))
  return {
    stop() {
      const wallMs = performance.now() - started
      const ownUsage = process.cpuUsage(own)
      const shares = [`bench client ${fmt((100 * (ownUsage.user + ownUsage.system)) / 1000 / wallMs, 0)} %`]
      for (const [name, pid] of Object.entries(processes)) {
        const start = before[name]
        const end = cpuTimeMs(pid)
        if (start !== null && start !== undefined && end !== null) shares.push(`${name} ${fmt((100 * (end - start)) / wallMs, 0)} %`)
      }
      return `CPU used, in % of one core: ${shares.join(', ')}`
    }
  }
}
