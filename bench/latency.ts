import { AgentdClient, callJson, cpuMeter, originOf, startServiceProcess, startStampingModelProcess } from './harness.ts'
import { fmt, percentile, printTable } from './report.ts'
import { preciseNow } from './stamping-model.ts'

const CHUNKS = 20
/** About what a fast hosted model streams (50 chunks/s); spacing the chunks keeps each measure its own. */
const INTERVAL_MS = 20
const ALONE_RUNS = 50
const CONCURRENT = 100
const ROUNDS = 3
const WARMUP = 10

/**
 * latency: the time from a text chunk leaving the model to its SSE frame reaching a client. The
 * stamping model writes its send time into each chunk's text; the client, on the same machine and
 * clock, subtracts it from the time the frame's bytes arrived. Measured with one run at a time,
 * then with CONCURRENT runs streaming at once.
 */
export async function run(): Promise<void> {
  const model = await startStampingModelProcess({ chunks: CHUNKS, intervalMs: INTERVAL_MS, toolName: 'fs_list' })
  const service = await startServiceProcess(model.url)
  const agentd = new AgentdClient(service.url, CONCURRENT + 4)
  try {
    const offset = await clockOffset(originOf(model.url))

    /** One run's chunk delays, in ms. */
    const sample = async (sessionId: string): Promise<number[]> => {
      const delays: number[] = []
      const done = await agentd.streamMessage(sessionId, 'Stream me some timestamps.', (type, data, receivedAt) => {
        if (type === 'text_chunk') delays.push(receivedAt - Number((JSON.parse(data) as { data: { delta: string } }).data.delta))
      })
      if (done.reason !== 'completed' || delays.length !== CHUNKS) throw new Error(`a run ended ${done.reason} with ${delays.length} chunks`)
      return delays
    }
    // Text only: tool steps would not change how a chunk travels.
    const session = () => agentd.createSession({ tools: [] })

    for (let i = 0; i < WARMUP; i++) await sample(await session())
    const alone: number[] = []
    for (let i = 0; i < ALONE_RUNS; i++) alone.push(...(await sample(await session())))
    const loaded: number[] = []
    const cpu = cpuMeter({ agentd: service.pid, model: model.pid })
    for (let round = 0; round < ROUNDS; round++) {
      const sessions = await Promise.all(Array.from({ length: CONCURRENT }, session))
      for (const delays of await Promise.all(sessions.map(sample))) loaded.push(...delays)
    }
    const loadedCpu = cpu.stop()

    console.log(`\nlatency: model chunk sent → SSE frame received by the client, ${CHUNKS} chunks per run ${INTERVAL_MS} ms apart`)
    console.log(`clocks: model − bench = ${fmt(offset.ms, 3)} ms (± ${fmt(offset.uncertaintyMs, 3)}); figures are not adjusted for it`)
    const row = (label: string, values: number[]) => [label, String(values.length), fmt(percentile(values, 50)), fmt(percentile(values, 99)), fmt(Math.max(...values))]
    printTable([
      ['streams', 'chunks', 'p50 ms', 'p99 ms', 'max ms'],
      row('1 at a time', alone),
      row(`${CONCURRENT} at once`, loaded)
    ])
    console.log(`with ${CONCURRENT} at once (${CONCURRENT * (1000 / INTERVAL_MS)} text chunks/s for agentd to persist and send): ${loadedCpu}`)
  } finally {
    await agentd.close()
    await service.close()
    await model.close()
  }
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
