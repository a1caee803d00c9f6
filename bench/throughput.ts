import type { ChatCompletionCreateParamsStreaming } from 'openai/resources/chat/completions'
import {
  AgentdClient, assertClean, callJson, cpuMeter, createDirectClient, fsListIsWired, originOf, runPool, sqliteSetting,
  startServiceProcess, startStampingModelProcess, streamCompletion
} from './harness.ts'
import type { ChildServer } from './child.ts'
import { clusterSettings, startServiceCluster } from './cluster.ts'
import { fmt, percentile, printTable } from './report.ts'

const CONCURRENCY = 50
/**
 * Runs before the measured ones, as `e2e` warms each process with 500: the aim is about a running
 * service, and V8 optimises what a run passes only after hundreds of them. With 200, agentd gave
 * 447 and 404 runs/s against 492 and 540 with 1 200 (alternating, 2026-11-27), the floor 579/558
 * against 597/662. What the fresh process managed meanwhile is printed too.
 */
const WARMUP = 1000
const RUNS = 2000
const CHUNKS = 20
const TIME_LIMIT_MS = 180_000

/**
 * throughput: whole runs per second with CONCURRENCY clients. A run is: create a session, POST a
 * message with Accept: text/event-stream, the model calls fs_list (on the empty workspace), then
 * streams a CHUNKS-chunk answer; agentd persists every event; the client reads the stream to
 * `done`. For comparison, the same two model calls (the very bodies agentd sent) made directly
 * with the openai SDK, at the same concurrency.
 *
 * The model is the stamping model with its chunks written at once, as the dev model writes them:
 * the dev model's script queue is shared by all requests, so with 50 runs at once a run's second
 * call could take another run's first step; the stamping model answers each request from the
 * request alone.
 */
export async function run(): Promise<void> {
  const model = await startStampingModelProcess({ chunks: CHUNKS, intervalMs: 0, toolName: 'fs_list' })
  // BENCH_DATABASE_URL (and BENCH_PROCESSES): several processes on PostgreSQL (bench/cluster.ts).
  const settings = clusterSettings()
  // BENCH_SQLITE=memory: the single process on SQLite :memory: instead of a file.
  const sqlite = sqliteSetting()
  const cluster = settings ? await startServiceCluster(model.url, settings) : null
  const service = cluster ? null : await startServiceProcess(model.url, sqlite)
  const servers = cluster?.servers ?? [service as ChildServer]
  const agentd = cluster ? cluster.client(CONCURRENCY + 4) : new AgentdClient(servers[0]!.url, CONCURRENCY + 4)
  const direct = createDirectClient(model.url)
  try {
    const probe = new AgentdClient(servers[0]!.url, 1)
    const wired = await fsListIsWired(probe).finally(() => probe.close())
    // Until the fs_* tools are wired, a run is text only: one model call instead of two.
    const sessionBody = wired ? {} : { tools: [] }

    const throughAgentd = await measure(async () => {
      const sessionId = await agentd.createSession(sessionBody)
      const done = await agentd.streamMessage(sessionId, 'List the workspace, then answer.')
      if (done.reason !== 'completed') throw new Error(`a run ended ${done.reason}`)
      return done.lastSeq
    }, { ...Object.fromEntries(servers.map((s, i) => [servers.length > 1 ? `agentd ${i + 1}` : 'agentd', s.pid])), model: model.pid })

    const last = await callJson<{ toolCall: ChatCompletionCreateParamsStreaming | null; text: ChatCompletionCreateParamsStreaming }>(`${originOf(model.url)}/__last-requests`)
    const bodies = wired && last.toolCall ? [last.toolCall, last.text] : [last.text]
    const straightToModel = await measure(async () => {
      for (const body of bodies) await streamCompletion(direct.client, body)
      return 0
    }, { model: model.pid })

    console.log(`\nagentd: ${cluster?.label ?? `one process on SQLite ${sqlite === 'memory' ? ':memory:' : 'file'}`}`)
    console.log(`throughput: ${RUNS} runs (after ${WARMUP} to warm up), ${CONCURRENCY} at once; ` +
      (wired ? `a run = new session, fs_list call, ${CHUNKS}-chunk answer` : `a run = new session, ${CHUNKS}-chunk answer`))
    if (!wired) console.log('note: the fs_* tools are not wired into sessions yet, so runs are text only (tools: []), one model call each')
    printTable([
      ['path', 'runs', 'runs/s', 'p50 ms', 'p99 ms', 'events persisted/s'],
      [`openai SDK → model (${bodies.length} calls per run)`, ...straightToModel.row, '-'],
      ['HTTP → agentd → model (one run)', ...throughAgentd.row, fmt(throughAgentd.events / throughAgentd.seconds, 0)]
    ])
    console.log(`agentd persisted ${fmt(throughAgentd.events / throughAgentd.runs, 0)} events per run`)
    console.log(`a fresh process, its first ${WARMUP} runs (the warm-up): agentd ${fmt(throughAgentd.freshRunsPerSecond, 0)} runs/s, ` +
      `the openai SDK straight to the model ${fmt(straightToModel.freshRunsPerSecond, 0)}`)
    console.log(`through agentd: ${throughAgentd.cpu}`)
    console.log(`direct: ${straightToModel.cpu}`)
    console.log('reference, same 2-core machine class: direct ~1000 runs/s, Mastra ~140, LangGraph.js ~70; target for agentd >= 500')
  } finally {
    await agentd.close()
    await direct.close()
    await service?.close()
    await cluster?.close()
    await model.close()
  }
}

/** Warms up, then runs `oneRun` RUNS times, CONCURRENCY at once; `oneRun` returns the events it persisted. */
async function measure(oneRun: () => Promise<number>, processes: Record<string, number>) {
  const deadline = Date.now() + TIME_LIMIT_MS
  const warming = performance.now()
  const warmUp = await runPool(WARMUP, CONCURRENCY, deadline, async () => void (await oneRun()))
  assertClean('warm-up', warmUp, WARMUP)
  const freshRunsPerSecond = warmUp.finished / ((performance.now() - warming) / 1000)
  const latencies: number[] = []
  let events = 0
  const cpu = cpuMeter(processes)
  const started = performance.now()
  const outcome = await runPool(RUNS, CONCURRENCY, deadline, async () => {
    const begun = performance.now()
    const persisted = await oneRun()
    events += persisted
    latencies.push(performance.now() - begun)
  })
  const seconds = (performance.now() - started) / 1000
  const cpuUse = cpu.stop()
  assertClean('measured runs', outcome, RUNS)
  const runs = outcome.finished
  return {
    runs, seconds, events, cpu: cpuUse, freshRunsPerSecond,
    row: [String(runs), fmt(runs / seconds, 0), fmt(percentile(latencies, 50), 1), fmt(percentile(latencies, 99), 1)]
  }
}
