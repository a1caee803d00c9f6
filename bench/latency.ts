import { writeFileSync } from 'node:fs'
import { AgentdClient, callJson, cpuMeter, originOf, startServiceProcess, startStampingModelProcess } from './harness.ts'
import { printCpuProfile } from './cpu-profile.ts'
import { fmt, percentile, printTable } from './report.ts'
import type { Pause, ServiceSample } from './service-watch.ts'
import { preciseNow } from './stamping-model.ts'

const CHUNKS = 20
/** About what a fast hosted model streams (50 chunks/s); spacing the chunks keeps each measure its own. */
const INTERVAL_MS = 20
const ALONE_RUNS = 50
const CONCURRENT = 100
/** BENCH_LATENCY_ROUNDS: more rounds of CONCURRENT runs, for a steadier tail. */
const ROUNDS = Number(process.env['BENCH_LATENCY_ROUNDS'] ?? 3)
const WARMUP = 10

/**
 * latency: the time from a text chunk leaving the model to its SSE frame reaching a client. The
 * stamping model writes its send time into each chunk's text; the client, on the same machine and
 * clock, subtracts it from the time the frame's bytes arrived. Measured with one run at a time,
 * then with CONCURRENT runs streaming at once.
 */
export async function run(): Promise<void> {
  const model = await startStampingModelProcess({ chunks: CHUNKS, intervalMs: INTERVAL_MS, toolName: 'fs_list' })
  const service = await startServiceProcess(model.url, 'file', { watch: true })
  const agentd = new AgentdClient(service.url, CONCURRENT + 4)
  try {
    const offset = await clockOffset(originOf(model.url))

    /** One run's chunks, in order. */
    const sample = async (sessionId: string): Promise<Chunk[]> => {
      const chunks: Chunk[] = []
      const done = await agentd.streamMessage(sessionId, 'Stream me some timestamps.', (type, data, receivedAt) => {
        if (type !== 'text_chunk') return
        const sentAt = Number((JSON.parse(data) as { data: { delta: string } }).data.delta)
        chunks.push({ index: chunks.length, sentAt, delay: receivedAt - sentAt, whileStarting: false })
      })
      if (done.reason !== 'completed' || chunks.length !== CHUNKS) throw new Error(`a run ended ${done.reason} with ${chunks.length} chunks`)
      return chunks
    }
    // Text only: tool steps would not change how a chunk travels.
    const session = () => agentd.createSession({ tools: [] })

    for (let i = 0; i < WARMUP; i++) await sample(await session())
    await service.ask<ServiceSample>('sample')
    const alone: Chunk[] = []
    for (let i = 0; i < ALONE_RUNS; i++) alone.push(...(await sample(await session())))
    const aloneService = await service.ask<ServiceSample>('sample')
    const loaded: Chunk[] = []
    // BENCH_LATENCY_PROF=<file>: agentd profiled while the runs stream at once, and nothing else.
    const profile = process.env['BENCH_LATENCY_PROF']
    if (profile) await service.ask('profile')
    const cpu = cpuMeter({ agentd: service.pid, model: model.pid })
    for (let round = 0; round < ROUNDS; round++) {
      const sessions = await Promise.all(Array.from({ length: CONCURRENT }, session))
      const runs = await Promise.all(sessions.map(sample))
      // Until the last run's first chunk, runs of the round were still being started.
      const started = Math.max(...runs.map((chunks) => (chunks[0] as Chunk).sentAt))
      for (const chunks of runs) for (const chunk of chunks) loaded.push({ ...chunk, whileStarting: chunk.sentAt <= started })
    }
    const loadedCpu = cpu.stop()
    if (profile) await service.ask('profiled', profile)
    const loadedService = await service.ask<ServiceSample>('sample')

    console.log(`\nlatency: model chunk sent → SSE frame received by the client, ${CHUNKS} chunks per run ${INTERVAL_MS} ms apart`)
    console.log(`clocks: model − bench = ${fmt(offset.ms, 3)} ms (± ${fmt(offset.uncertaintyMs, 3)}); figures are not adjusted for it`)
    console.log('published: from the model\'s send to agentd handing the event to its SSE streams (the client\'s own delay left out);')
    console.log('CPU in flight: the CPU time agentd\'s main thread spent while the chunk travelled to the client (other processes do not count)')
    const published = new Map<number, number>()
    for (const { sentAt, delay } of [aloneService.published, loadedService.published]) sentAt.forEach((at, i) => published.set(at, delay[i] as number))
    const row = (label: string, chunks: Chunk[], service: ServiceSample) => {
      const values = chunks.map((chunk) => chunk.delay)
      const inAgentd = chunks.map((chunk) => published.get(chunk.sentAt) ?? Number.NaN).filter(Number.isFinite)
      const work = chunks.map(cpuInFlight(service.cpuClock))
      return [label, String(values.length), fmt(percentile(values, 50)), fmt(percentile(values, 99)), fmt(Math.max(...values)),
        fmt(percentile(inAgentd, 50)), fmt(percentile(inAgentd, 99)), fmt(percentile(work, 99))]
    }
    printTable([
      ['streams', 'chunks', 'p50 ms', 'p99 ms', 'max ms', 'published p50', 'p99', 'CPU in flight p99'],
      row('1 at a time', alone, aloneService),
      row(`${CONCURRENT} at once`, loaded, loadedService),
      row('  first chunk of a run', loaded.filter((chunk) => chunk.index === 0), loadedService),
      row(`  chunks 2..${CHUNKS}`, loaded.filter((chunk) => chunk.index > 0), loadedService),
      row('  sent while runs were starting', loaded.filter((chunk) => chunk.whileStarting), loadedService),
      row(`  sent once all ${CONCURRENT} streamed`, loaded.filter((chunk) => !chunk.whileStarting), loadedService)
    ])
    console.log(`with ${CONCURRENT} at once (${CONCURRENT * (1000 / INTERVAL_MS)} text chunks/s for agentd to persist and send): ${loadedCpu}`)
    const { cpuMs } = loadedService.cpuClock
    console.log(`agentd's main thread: ${fmt((1000 * ((cpuMs.at(-1) ?? 0) - (cpuMs[0] ?? 0))) / loaded.length, 0)} µs of CPU per chunk with ${CONCURRENT} at once (sessions and runs included)`)
    console.log('\nagentd meanwhile (its own event loop, GC and SQLite):')
    printTable([
      ['streams', 'loop delay p50 / p99 / max ms', 'stalls: n, total, on CPU, queued ms', 'GC pauses: n, total, max ms, >= 5 ms',
        'group commits: n, statements, total, max ms, >= 5 ms', 'WAL checkpoints: n, total, max ms'],
      serviceRow('1 at a time', aloneService),
      serviceRow(`${CONCURRENT} at once`, loadedService)
    ])
    const statements = Object.entries(loadedService.statements).sort((a, b) => b[1].totalMs - a[1].totalMs).slice(0, 4)
    console.log(`SQLite with ${CONCURRENT} at once: ${loadedService.commits.count} COMMITs ${fmt((1000 * loadedService.commits.totalMs) / loadedService.commits.count, 0)} µs each` +
      statements.map(([kind, { count, totalMs }]) => `, ${count} × ${kind} ${fmt((1000 * totalMs) / count, 0)} µs`).join(''))
    explainTail(loaded, loadedService.pauses)
    // BENCH_LATENCY_DUMP=<file>: every chunk and every pause, for a closer look.
    const dump = process.env['BENCH_LATENCY_DUMP']
    if (dump) writeFileSync(dump, JSON.stringify({ alone, loaded, aloneService, loadedService }))
    if (profile) printCpuProfile(profile, `agentd CPU profile while ${CONCURRENT} runs streamed at once`)
  } finally {
    await agentd.close()
    await service.close()
    await model.close()
  }
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
  const { loopDelay, stalls, gc, groupCommits, checkpoints } = sample
  return [
    label,
    `${fmt(loopDelay.p50)} / ${fmt(loopDelay.p99)} / ${fmt(loopDelay.max)}`,
    `${stalls.count}, ${fmt(stalls.totalMs, 0)}, ${fmt(stalls.cpuMs, 0)}, ${fmt(stalls.queuedMs, 0)}`,
    `${gc.count}, ${fmt(gc.totalMs, 0)}, ${fmt(gc.maxMs, 1)}, ${gc.long}`,
    `${groupCommits.count}, ${groupCommits.statements}, ${fmt(groupCommits.totalMs, 0)}, ${fmt(groupCommits.maxMs, 1)}, ${groupCommits.long}`,
    `${checkpoints.count}, ${fmt(checkpoints.totalMs, 0)}, ${fmt(checkpoints.maxMs, 1)}`
  ]
}

/**
 * For a chunk, the CPU time (ms) agentd's main thread spent between the chunk's send and its
 * arrival, from the watch's clock of main-thread CPU time (interpolated between its ticks). On a
 * machine where agentd had a core to itself, that is the work the chunk waited for; it does not
 * grow when other processes take the cores, as the wall time does.
 */
function cpuInFlight(clock: ServiceSample['cpuClock']): (chunk: Chunk) => number {
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
  return (chunk) => cpuAt(chunk.sentAt + chunk.delay) - cpuAt(chunk.sentAt)
}

/** Which of agentd's pauses of 5 ms or more the chunks slower than 10 ms travelled through. */
function explainTail(chunks: Chunk[], pauses: Pause[]): void {
  const slow = chunks.filter((chunk) => chunk.delay > 10)
  if (slow.length === 0) return
  const counts = new Map<string, number>()
  for (const chunk of slow) {
    const kinds = new Set(pauses
      .filter((pause) => pause.endedAt > chunk.sentAt && pause.endedAt - pause.ms < chunk.sentAt + chunk.delay)
      .map((pause) => pause.kind))
    const key = kinds.size === 0 ? 'none' : [...kinds].sort().join(' + ')
    counts.set(key, (counts.get(key) ?? 0) + 1)
  }
  console.log(`chunks slower than 10 ms: ${slow.length}; the agentd pauses of 5 ms or more they waited through: ` +
    [...counts].sort((a, b) => b[1] - a[1]).map(([key, n]) => `${key} ${n}`).join(', '))
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
