import { writeFileSync } from 'node:fs'
import type { ChildServer } from './child.ts'
import { AgentdClient, callJson, cpuMeter, originOf, startBareAgentProcess, startServiceProcess, startStampingModelProcess } from './harness.ts'
import { printCpuProfile } from './cpu-profile.ts'
import { fmt, percentile, printTable } from './report.ts'
import type { HeapSample } from './heap-watch.ts'
import { PAUSE_MS } from './pause-totals.ts'
import { watchService, type Pause, type ServiceSample } from './service-watch.ts'
import { preciseNow } from './stamping-model.ts'

const CHUNKS = 20
/** About what a fast hosted model streams (50 chunks/s); spacing the chunks keeps each measure its own. */
const INTERVAL_MS = 20
const ALONE_RUNS = 50
/**
 * Streams at once, in the rounds and in the staggered phase (BENCH_LATENCY_STREAMS to change it):
 * the aims are set for 100; fewer or more show where, on the machine at hand, one agentd
 * process stops meeting them (its capacity under steady load).
 */
const CONCURRENT = streamsOf(process.env['BENCH_LATENCY_STREAMS'])
/**
 * Measured rounds of CONCURRENT runs (BENCH_LATENCY_ROUNDS to change it). Ten give the p99 20 000
 * chunks rather than three rounds' 6 000, so one stall of the machine weighs a third as much;
 * they add ~5 s per target to the warm-up's ~25.
 */
const ROUNDS = Number(process.env['BENCH_LATENCY_ROUNDS'] ?? 10)
const WARMUP = 10
/**
 * Unmeasured rounds of CONCURRENT runs after WARMUP: the figures are a running service's, whose
 * code V8 has optimised. A run's start is passed once a run, and takes hundreds of runs to get
 * there; until then, a round's burst of starts holds the event loop several times longer.
 */
const WARMUP_ROUNDS = 5
/**
 * How far apart the staggered clients start: one run's chunks spread over CONCURRENT clients, so
 * that a run starts (and one ends) every STAGGER_MS and a chunk arrives every INTERVAL_MS / CONCURRENT.
 */
const STAGGER_MS = (CHUNKS * INTERVAL_MS) / CONCURRENT

/**
 * latency: the time from a text chunk leaving the model to its SSE frame reaching a client. The
 * stamping model writes its send time into each chunk's text; the client, on the same machine and
 * clock, subtracts it from the time the frame's bytes arrived. Measured once agentd is warm
 * (WARMUP_ROUNDS): with one run at a time, then with CONCURRENT runs streaming at once, ROUNDS
 * times (each round creates its sessions, then posts all its messages at once), then with
 * CONCURRENT clients staggered (each runs ROUNDS runs back to back, the clients starting
 * STAGGER_MS apart: CONCURRENT streams at once, as in a round, but their runs start and end one
 * by one and their chunks arrive spread over time instead of in waves). Then the same
 * runs through the bare agent (bench/bare-agent-process.ts: agentd's provider behind
 * node:http, every text part written as a frame at once, nothing stored), with agentd stopped: what
 * this machine, model and client give a Node service without agentd's machinery, beside which
 * agentd's figures are read.
 *
 * Where the time goes, from agentd's own watch (bench/service-watch.ts): when each chunk was
 * published inside agentd (the client's own delay left out), agentd's main-thread CPU clock (the
 * CPU time per session, per run start and per chunk, and the CPU time a chunk was in flight for,
 * which other processes on the machine do not change), and its pauses: stalls of the event loop
 * (on a CPU, queued for one), GC, long group commits, WAL checkpoints and the COMMITs that rewound
 * the WAL after one (each fsyncs the WAL's new header on the event loop). The last table gives
 * the p99 of the chunks left once those in flight during each kind of pause are set aside.
 */
export async function run(): Promise<void> {
  const model = await startStampingModelProcess({ chunks: CHUNKS, intervalMs: INTERVAL_MS, toolName: 'fs_list' })
  let service: ChildServer | null = await startServiceProcess(model.url, 'file', [], { watch: true })
  const agentd = new AgentdClient(service.url, CONCURRENT + 4)
  // The bench's own pauses (its GC, its turns): a frame that arrives meanwhile is read late.
  const client = watchService(null)
  let bare: { server: ChildServer; client: AgentdClient } | null = null
  try {
    const offset = await clockOffset(originOf(model.url))
    const watched = service
    let aloneService: ServiceSample | undefined
    let aloneClient: ServiceSample | undefined
    let loadedService: ServiceSample | undefined
    let loadedClient: ServiceSample | undefined
    let staggeredService: ServiceSample | undefined
    let staggeredClient: ServiceSample | undefined
    let loadedCpu = ''
    let staggeredCpu = ''
    let cpu: { stop(): string } | undefined
    // BENCH_LATENCY_PROF=<file>: agentd's CPU profiled while the rounds' runs stream at once, and nothing else;
    // BENCH_LATENCY_HEAP_PROF=<file>: what it allocated meanwhile (sampled), instead;
    // BENCH_LATENCY_PROF_PHASE=staggered: either profile covers the staggered phase instead of the rounds.
    const heapProfile = process.env['BENCH_LATENCY_HEAP_PROF']
    const profile = heapProfile ?? process.env['BENCH_LATENCY_PROF']
    const profiledPhase = process.env['BENCH_LATENCY_PROF_PHASE'] === 'staggered' ? 'staggered' : 'at once'
    const profiled = `${CONCURRENT} runs streamed ${profiledPhase}`
    // The profile starts and stops around the phase it covers; for the other phase these do nothing.
    const profileFrom = async (phase: typeof profiledPhase) => {
      if (profile && phase === profiledPhase) await watched.ask('profile', heapProfile ? 'heap' : 'cpu')
    }
    const profileUntil = async (phase: typeof profiledPhase) => {
      if (profile && phase === profiledPhase) await watched.ask('profiled', profile)
    }
    const { alone, loaded, rounds, staggered } = await measure(agentd, {
      async warmed() {
        await watched.ask<ServiceSample>('sample')
        client.sample()
      },
      async aloneDone() {
        aloneService = await watched.ask<ServiceSample>('sample')
        aloneClient = client.sample()
        await profileFrom('at once')
        cpu = cpuMeter({ agentd: watched.pid, model: model.pid })
      },
      async loadedDone() {
        loadedCpu = cpu?.stop() ?? ''
        await profileUntil('at once')
        loadedService = await watched.ask<ServiceSample>('sample')
        loadedClient = client.sample()
        await profileFrom('staggered')
        cpu = cpuMeter({ agentd: watched.pid, model: model.pid })
      },
      async staggeredDone() {
        staggeredCpu = cpu?.stop() ?? ''
        await profileUntil('staggered')
        staggeredService = await watched.ask<ServiceSample>('sample')
        staggeredClient = client.sample()
      }
    })
    if (!aloneService || !aloneClient || !loadedService || !loadedClient || !staggeredService || !staggeredClient) throw new Error('a phase of the measure was skipped')
    // The yardstick: the same runs through the bare agent, with agentd gone so that it has the machine as agentd had.
    await service.close()
    service = null
    const bareServer = await startBareAgentProcess(model.url)
    bare = { server: bareServer, client: new AgentdClient(bareServer.url, CONCURRENT + 4) }
    let bareCpu = ''
    let bareStaggeredCpu = ''
    let bareMeter: { stop(): string } | undefined
    let bareAloneHeap: HeapSample | undefined
    let bareLoadedHeap: HeapSample | undefined
    const bareRuns = await measure(bare.client, {
      async warmed() {
        await bareServer.ask<HeapSample>('heap')
      },
      async aloneDone() {
        bareAloneHeap = await bareServer.ask<HeapSample>('heap')
        bareMeter = cpuMeter({ 'bare agent': bareServer.pid, model: model.pid })
      },
      async loadedDone() {
        bareCpu = bareMeter?.stop() ?? ''
        bareLoadedHeap = await bareServer.ask<HeapSample>('heap')
        bareMeter = cpuMeter({ 'bare agent': bareServer.pid, model: model.pid })
      },
      async staggeredDone() {
        bareStaggeredCpu = bareMeter?.stop() ?? ''
      }
    })
    if (!bareAloneHeap || !bareLoadedHeap) throw new Error('a phase of the bare agent\'s measure was skipped')

    console.log(`\nlatency: model chunk sent → SSE frame received by the client, ${CHUNKS} chunks per run ${INTERVAL_MS} ms apart`)
    console.log(`each target warmed up first: ${WARMUP} runs one at a time, then ${WARMUP_ROUNDS} unmeasured rounds of ${CONCURRENT} at once; ` +
      `then measured: ${ALONE_RUNS} runs one at a time, ${ROUNDS} rounds of ${CONCURRENT} at once, and ${CONCURRENT} clients staggered ` +
      `${fmt(STAGGER_MS, 0)} ms apart running ${ROUNDS} runs each (kept: the ${fmt((staggered.to - staggered.from) / 1000, 1)} s while all ${CONCURRENT} streamed)`)
    console.log('bare agent: agentd\'s provider behind node:http, each text part written as its frame at once: no store, no events, no framework, ' +
      'no turns for starting runs (bench/bare-agent-process.ts); the same client, model and runs, measured after agentd, in the same run')
    console.log(`clocks: model − bench = ${fmt(offset.ms, 3)} ms (± ${fmt(offset.uncertaintyMs, 3)}); figures are not adjusted for it`)
    console.log('published: from the model\'s send to agentd handing the event to its SSE streams (the client\'s own delay left out);')
    console.log('CPU in flight: the CPU time agentd\'s main thread spent while the chunk travelled to the client (other processes do not count)')
    // A chunk is known by its send time, to the µs: two that share one share the entry.
    const published = new Map<number, number>()
    for (const { sentAt, delay } of [aloneService.published, loadedService.published, staggeredService.published]) sentAt.forEach((at, i) => published.set(at, delay[i] as number))
    const row = (label: string, chunks: Chunk[], service?: ServiceSample) => {
      const values = chunks.map((chunk) => chunk.delay)
      const latency = [label, String(values.length), fmt(percentile(values, 50)), fmt(percentile(values, 99)), fmt(Math.max(...values))]
      if (!service) return [...latency, '-', '-', '-']
      const inAgentd = chunks.map((chunk) => published.get(chunk.sentAt) ?? Number.NaN).filter(Number.isFinite)
      const work = chunks.map(cpuInFlight(service.cpuClock))
      return [...latency, fmt(percentile(inAgentd, 50)), fmt(percentile(inAgentd, 99)), fmt(percentile(work, 99))]
    }
    printTable([
      ['streams', 'chunks', 'p50 ms', 'p99 ms', 'max ms', 'published p50', 'p99', 'CPU in flight p99'],
      row('bare agent, 1 at a time', bareRuns.alone),
      row(`bare agent, ${CONCURRENT} at once`, bareRuns.loaded),
      row('  sent while runs were starting', bareRuns.loaded.filter((chunk) => chunk.whileStarting)),
      row(`  sent once all ${CONCURRENT} streamed`, bareRuns.loaded.filter((chunk) => !chunk.whileStarting)),
      row(`bare agent, ${CONCURRENT} staggered`, bareRuns.staggered),
      row('agentd, 1 at a time', alone, aloneService),
      row(`agentd, ${CONCURRENT} at once`, loaded, loadedService),
      row('  first chunk of a run', loaded.filter((chunk) => chunk.index === 0), loadedService),
      row(`  chunks 2..${CHUNKS}`, loaded.filter((chunk) => chunk.index > 0), loadedService),
      row('  sent while runs were starting', loaded.filter((chunk) => chunk.whileStarting), loadedService),
      row(`  sent once all ${CONCURRENT} streamed`, loaded.filter((chunk) => !chunk.whileStarting), loadedService),
      row(`agentd, ${CONCURRENT} staggered`, staggered, staggeredService)
    ])
    const ratio = (agentdMs: number, bareMs: number) => `${fmt(agentdMs)} ms (${fmt(agentdMs / bareMs)} × the bare agent's ${fmt(bareMs)})`
    const p = (chunks: Chunk[], q: number) => percentile(chunks.map((chunk) => chunk.delay), q)
    console.log(`aims, ${CONCURRENT} at once: p50 <= 1 ms: ${ratio(p(loaded, 50), p(bareRuns.loaded, 50))}; p99 <= 10 ms: ${ratio(p(loaded, 99), p(bareRuns.loaded, 99))}`)
    console.log(`the same, ${CONCURRENT} staggered: p50 ${ratio(p(staggered, 50), p(bareRuns.staggered, 50))}; p99 ${ratio(p(staggered, 99), p(bareRuns.staggered, 99))}`)
    console.log(`with ${CONCURRENT} at once (${CONCURRENT * (1000 / INTERVAL_MS)} text chunks/s for agentd to persist and send): ${loadedCpu}`)
    console.log(`the bare agent with ${CONCURRENT} at once: ${bareCpu}`)
    console.log(`with ${CONCURRENT} staggered: ${staggeredCpu}; the bare agent: ${bareStaggeredCpu}`)
    // What GC pauses come from: how much each process allocates for the same chunks (a scavenge comes every few tens of MB).
    const heapRow = (label: string, heap: HeapSample, chunks: number) => {
      const { count, totalMs, maxMs, long } = heap.gc
      return [label, fmt(heap.allocatedBytes / 1e6, 0), fmt(heap.allocatedBytes / chunks / 1024, 1), `${count}, ${fmt(totalMs, 0)}, ${fmt(maxMs, 1)}, ${long}`]
    }
    console.log('\nV8 heap: bytes allocated (a run\'s start and end included, per text chunk streamed) and GC pauses, as V8 counts them (bench/heap-watch.ts)')
    printTable([
      ['streams', 'allocated MB', 'KB per chunk', 'GC pauses: n, total, max ms, >= 5 ms'],
      heapRow('bare agent, 1 at a time', bareAloneHeap, bareRuns.alone.length),
      heapRow(`bare agent, ${CONCURRENT} at once`, bareLoadedHeap, bareRuns.loaded.length),
      heapRow('agentd, 1 at a time', aloneService.heap, alone.length),
      heapRow(`agentd, ${CONCURRENT} at once`, loadedService.heap, loaded.length)
    ])
    const cpuAt = cpuClockAt(loadedService.cpuClock)
    const spent = (from: keyof Round, to: keyof Round) => rounds.reduce((sum, round) => sum + cpuAt(round[to]) - cpuAt(round[from]), 0)
    const runs = CONCURRENT * rounds.length
    const staggeredCpuAt = cpuClockAt(staggeredService.cpuClock)
    console.log(`agentd's main thread, CPU with ${CONCURRENT} at once: ${fmt((1000 * spent('startedAt', 'sessionsAt')) / runs, 0)} µs per session created, ` +
      `${fmt((1000 * spent('sessionsAt', 'openedAt')) / runs, 0)} µs per run started (message POSTed, its stream opened, its model call made), ` +
      `${fmt((1000 * spent('openedAt', 'endedAt')) / loaded.length, 0)} µs per chunk after that (the runs' ends included); ` +
      `all of it, ${fmt((1000 * spent('startedAt', 'endedAt')) / loaded.length, 0)} µs per chunk, against ` +
      `${fmt((1000 * (staggeredCpuAt(staggered.to) - staggeredCpuAt(staggered.from))) / staggered.length, 0)} µs ` +
      `per chunk with ${CONCURRENT} staggered (sessions, starts and ends included)`)
    console.log('\nagentd meanwhile (its own event loop, GC and SQLite):')
    printTable([
      ['streams', 'loop delay p50 / p99 / max ms', 'stalls: n, total, on CPU, queued ms', 'GC pauses: n, total, max ms, >= 5 ms',
        'group commits: n, statements, total, max ms, >= 5 ms', 'WAL checkpoints: n, total, max ms', 'WAL restarts: n, total, max ms, >= 5 ms'],
      serviceRow('1 at a time', aloneService),
      serviceRow(`${CONCURRENT} at once`, loadedService),
      serviceRow(`${CONCURRENT} staggered`, staggeredService),
      serviceRow('bench client, 1 at a time', aloneClient),
      serviceRow(`bench client, ${CONCURRENT} at once`, loadedClient),
      serviceRow(`bench client, ${CONCURRENT} staggered`, staggeredClient)
    ])
    const statements = Object.entries(loadedService.statements).sort((a, b) => b[1].totalMs - a[1].totalMs).slice(0, 4)
    console.log(`SQLite with ${CONCURRENT} at once: ${loadedService.commits.count} COMMITs ${fmt((1000 * loadedService.commits.totalMs) / loadedService.commits.count, 0)} µs each` +
      statements.map(([kind, { count, totalMs }]) => `, ${count} × ${kind} ${fmt((1000 * totalMs) / count, 0)} µs`).join(''))
    attributeTail(`${CONCURRENT} at once`, loaded, loadedService.pauses, loadedClient.pauses, published)
    attributeTail(`${CONCURRENT} staggered`, staggered, staggeredService.pauses, staggeredClient.pauses, published)
    // BENCH_LATENCY_DUMP=<file>: every chunk and every pause, for a closer look.
    const dump = process.env['BENCH_LATENCY_DUMP']
    if (dump) writeFileSync(dump, JSON.stringify({ alone, loaded, rounds, staggered, aloneService, loadedService, staggeredService, bareAgent: bareRuns }))
    if (profile && !heapProfile) printCpuProfile(profile, `agentd CPU profile while ${profiled}`)
    if (heapProfile) console.log(`agentd's allocations while ${profiled}: ${heapProfile} (Chrome DevTools, Memory tab)`)
  } finally {
    await agentd.close()
    await service?.close()
    await bare?.client.close()
    await bare?.server.close()
    await model.close()
  }
}

/** What measure() lets the caller do between its phases: after the warm-up, the runs one at a time, the rounds at once and the staggered runs. */
interface Phases {
  warmed(): Promise<void>
  aloneDone(): Promise<void>
  loadedDone(): Promise<void>
  staggeredDone(): Promise<void>
}

/**
 * One target's chunks, as its client saw them: WARMUP runs and WARMUP_ROUNDS rounds unmeasured,
 * then ALONE_RUNS runs one at a time, then ROUNDS rounds of CONCURRENT runs at once (each round
 * creates its sessions, then posts all its messages at once), then the staggered clients (stagger).
 */
async function measure(target: AgentdClient, phases: Phases): Promise<{ alone: Chunk[]; loaded: Chunk[]; rounds: Round[]; staggered: Staggered }> {
  /** One run's chunks, in order, and when its stream's first event arrived. */
  const sample = async (sessionId: string): Promise<Chunk[] & { openedAt: number }> => {
    const chunks = Object.assign([] as Chunk[], { openedAt: 0 })
    const done = await target.streamMessage(sessionId, 'Stream me some timestamps.', (type, data, receivedAt) => {
      chunks.openedAt ||= receivedAt
      if (type !== 'text_chunk') return
      const sentAt = Number((JSON.parse(data) as { data: { delta: string } }).data.delta)
      chunks.push({ index: chunks.length, sentAt, delay: receivedAt - sentAt, whileStarting: false })
    })
    if (done.reason !== 'completed' || chunks.length !== CHUNKS) throw new Error(`a run ended ${done.reason} with ${chunks.length} chunks`)
    return chunks
  }
  // Text only: tool steps would not change how a chunk travels.
  const session = () => target.createSession({ tools: [] })

  for (let i = 0; i < WARMUP; i++) await sample(await session())
  for (let round = 0; round < WARMUP_ROUNDS; round++) {
    const sessions = await Promise.all(Array.from({ length: CONCURRENT }, session))
    await Promise.all(sessions.map(sample))
  }
  await phases.warmed()
  const alone: Chunk[] = []
  for (let i = 0; i < ALONE_RUNS; i++) alone.push(...(await sample(await session())))
  await phases.aloneDone()
  const loaded: Chunk[] = []
  const rounds: Round[] = []
  for (let round = 0; round < ROUNDS; round++) {
    const startedAt = preciseNow()
    const sessions = await Promise.all(Array.from({ length: CONCURRENT }, session))
    const sessionsAt = preciseNow()
    const runs = await Promise.all(sessions.map(sample))
    rounds.push({ startedAt, sessionsAt, openedAt: Math.max(...runs.map((chunks) => chunks.openedAt)), endedAt: preciseNow() })
    // Until the last run's first chunk, runs of the round were still being started.
    const started = Math.max(...runs.map((chunks) => (chunks[0] as Chunk).sentAt))
    for (const chunks of runs) for (const chunk of chunks) loaded.push({ ...chunk, whileStarting: chunk.sentAt <= started })
  }
  await phases.loadedDone()
  const staggered = await stagger(sample, session)
  await phases.staggeredDone()
  return { alone, loaded, rounds, staggered }
}

/**
 * CONCURRENT clients, STAGGER_MS apart, each running ROUNDS runs back to back (a session, then its
 * message): CONCURRENT streams at once, their runs starting one by one. Only the chunks sent while
 * every client was streaming are kept: from the last client's first chunk to the first client's
 * last (the ramp up and down have fewer streams), with the span they cover.
 */
async function stagger(
  sample: (sessionId: string) => Promise<Chunk[]>, session: () => Promise<string>
): Promise<Staggered> {
  const clients = await Promise.all(Array.from({ length: CONCURRENT }, async (_, client): Promise<Chunk[][]> => {
    await new Promise((resolve) => setTimeout(resolve, client * STAGGER_MS))
    const runs: Chunk[][] = []
    for (let i = 0; i < ROUNDS; i++) runs.push(await sample(await session()))
    return runs
  }))
  const firstSent = (runs: Chunk[][]) => ((runs[0] as Chunk[])[0] as Chunk).sentAt
  const lastSent = (runs: Chunk[][]) => ((runs.at(-1) as Chunk[]).at(-1) as Chunk).sentAt
  const from = Math.max(...clients.map(firstSent))
  const to = Math.min(...clients.map(lastSent))
  const chunks = clients.flat(2).filter((chunk) => chunk.sentAt >= from && chunk.sentAt <= to)
  return Object.assign(chunks, { from, to })
}

/** The staggered phase's chunks sent while all CONCURRENT clients streamed, and that span (bench clock, ms). */
type Staggered = Chunk[] & { from: number; to: number }

/** The phases of a round, as times of the bench's clock: sessions created, then every run's stream open, then all done. */
interface Round {
  startedAt: number
  sessionsAt: number
  openedAt: number
  endedAt: number
}

/** A text chunk as the client saw it: its place in the run, when the model sent it and how long it took, in ms. */
interface Chunk {
  index: number
  sentAt: number
  delay: number
  /** Sent before the last run of its round had its first chunk: while sessions and runs were still being created. */
  whileStarting: boolean
}

function serviceRow(label: string, sample: ServiceSample): string[] {
  const { loopDelay, stalls, gc, groupCommits, checkpoints, restarts } = sample
  return [
    label,
    `${fmt(loopDelay.p50)} / ${fmt(loopDelay.p99)} / ${fmt(loopDelay.max)}`,
    `${stalls.count}, ${fmt(stalls.totalMs, 0)}, ${fmt(stalls.cpuMs, 0)}, ${fmt(stalls.queuedMs, 0)}`,
    `${gc.count}, ${fmt(gc.totalMs, 0)}, ${fmt(gc.maxMs, 1)}, ${gc.long}`,
    `${groupCommits.count}, ${groupCommits.statements}, ${fmt(groupCommits.totalMs, 0)}, ${fmt(groupCommits.maxMs, 1)}, ${groupCommits.long}`,
    `${checkpoints.count}, ${fmt(checkpoints.totalMs, 0)}, ${fmt(checkpoints.maxMs, 1)}`,
    `${restarts.count}, ${fmt(restarts.totalMs, 0)}, ${fmt(restarts.maxMs, 1)}, ${restarts.long}`
  ]
}

/**
 * For a chunk, the CPU time (ms) agentd's main thread spent between the chunk's send and its
 * arrival, from the watch's clock of main-thread CPU time (interpolated between its ticks). On a
 * machine where agentd had a core to itself, that is the work the chunk waited for; it does not
 * grow when other processes take the cores, as the wall time does.
 */
function cpuInFlight(clock: ServiceSample['cpuClock']): (chunk: Chunk) => number {
  const cpuAt = cpuClockAt(clock)
  return (chunk) => cpuAt(chunk.sentAt + chunk.delay) - cpuAt(chunk.sentAt)
}

/** agentd's main-thread CPU time (ms) at a moment (preciseNow), interpolated between the ticks of the watch's clock. */
function cpuClockAt(clock: ServiceSample['cpuClock']): (time: number) => number {
  const { at, cpuMs } = clock
  const cpuAt = (time: number): number => {
    let lo = 0
    let hi = at.length - 1
    if (hi < 0) return Number.NaN
    if (time <= (at[0] as number)) return cpuMs[0] as number
    if (time >= (at[hi] as number)) return cpuMs[hi] as number
    while (hi - lo > 1) {
      const mid = (lo + hi) >> 1
      if ((at[mid] as number) <= time) lo = mid
      else hi = mid
    }
    const share = (time - (at[lo] as number)) / ((at[hi] as number) - (at[lo] as number))
    return (cpuMs[lo] as number) + share * ((cpuMs[hi] as number) - (cpuMs[lo] as number))
  }
  return cpuAt
}

type During = (kind: Pause['kind'], also?: (pause: Pause) => boolean) => boolean

/** Why a chunk may have been late: something it was in flight during, in agentd or in the bench's client. */
const CAUSES: Array<{ label: string; hit: (chunk: Chunk, agentd: During, client: During) => boolean }> = [
  { label: 'runs of its round still starting', hit: (chunk) => chunk.whileStarting },
  { label: 'a WAL checkpoint or restart', hit: (_, agentd) => agentd('checkpoint') || agentd('wal restart') },
  { label: `a GC pause >= ${PAUSE_MS} ms`, hit: (_, agentd) => isGc(agentd) },
  { label: `another group commit >= ${PAUSE_MS} ms`, hit: (_, agentd) => agentd('group commit') },
  { label: `a stall >= ${PAUSE_MS} ms queued for a core`, hit: (_, agentd) => agentd('stall', (pause) => (pause.queuedMs ?? 0) >= PAUSE_MS) },
  { label: `a turn with >= ${PAUSE_MS} ms of agentd's own work`, hit: (_, agentd) => agentd('stall', (pause) => (pause.cpuMs ?? 0) >= PAUSE_MS) },
  { label: `a GC pause >= ${PAUSE_MS} ms of the bench client`, hit: (_, _agentd, client) => isGc(client) },
  { label: `a stall >= ${PAUSE_MS} ms of the bench client`, hit: (_, _agentd, client) => client('stall') }
]

const isGc = (during: During): boolean => during('gc minor') || during('gc major') || during('gc other')

/**
 * Where the tail comes from: the p99 of the chunks left once those in flight during each cause
 * (and the causes above it) are set aside, beside how many chunks each cause touched on its own.
 * Chunks set aside are not the only ones a pause delays (the backlog it leaves delays the next
 * ones), so the p99 left is an upper bound of what removing the cause would give.
 */
function attributeTail(label: string, chunks: Chunk[], agentdPauses: Pause[], clientPauses: Pause[], published: Map<number, number>): void {
  const duringOf = (pauses: Pause[], chunk: Chunk): During => (kind, also = () => true) =>
    pauses.some((pause) => pause.kind === kind && pause.endedAt > chunk.sentAt && pause.endedAt - pause.ms < chunk.sentAt + chunk.delay && also(pause))
  const causes = chunks.map((chunk) => {
    const agentd = duringOf(agentdPauses, chunk)
    const client = duringOf(clientPauses, chunk)
    return CAUSES.map((cause) => cause.hit(chunk, agentd, client))
  })
  const p99 = (kept: Chunk[]) => [fmt(percentile(kept.map((chunk) => chunk.delay), 99)),
    fmt(percentile(kept.map((chunk) => published.get(chunk.sentAt) ?? Number.NaN).filter(Number.isFinite), 99))]
  const rows = [['chunks in flight during …', 'share of chunks', 'p99 ms of the rest', 'published p99'], ['(all chunks)', '100 %', ...p99(chunks)]]
  CAUSES.forEach((cause, i) => {
    const alone = causes.filter((hits) => hits[i]).length
    const kept = chunks.filter((_, c) => !(causes[c] as boolean[]).slice(0, i + 1).some(Boolean))
    rows.push([`${i === 0 ? '' : '+ '}${cause.label}`, `${fmt((100 * alone) / chunks.length, 1)} %`, ...p99(kept)])
  })
  console.log(`\nwhere the tail comes from with ${label} (each row also sets aside the chunks of the rows above):`)
  printTable(rows)
}

/** How far the model process's clock is from the bench's, from the fastest of 20 round trips. */
async function clockOffset(modelOrigin: string): Promise<{ ms: number; uncertaintyMs: number }> {
  let best = { ms: 0, uncertaintyMs: Number.POSITIVE_INFINITY }
  for (let i = 0; i < 20; i++) {
    const before = preciseNow()
    const { now } = await callJson<{ now: number }>(`${modelOrigin}/__clock`)
    const after = preciseNow()
    if ((after - before) / 2 < best.uncertaintyMs) best = { ms: now - (before + after) / 2, uncertaintyMs: (after - before) / 2 }
  }
  return best
}

/** BENCH_LATENCY_STREAMS, checked: a whole number of streams from 1 to 1000 (100 when unset). */
function streamsOf(value: string | undefined): number {
  if (value === undefined || value === '') return 100
  const streams = Number(value)
  if (!Number.isInteger(streams) || streams < 1 || streams > 1000) {
    throw new Error(`BENCH_LATENCY_STREAMS must be a whole number from 1 to 1000, not ${JSON.stringify(value)}`)
  }
  return streams
}
