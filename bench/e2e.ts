import type OpenAI from 'openai'
import type { ChatCompletionCreateParamsStreaming } from 'openai/resources/chat/completions'
import {
  AgentdClient, callJson, cpuTimeMs, createDirectClient, originOf, startBareAgentProcess, startServiceProcess, startStampingModelProcess
} from './harness.ts'
import type { ChildServer } from './child.ts'
import { fmt, percentile, printTable } from './report.ts'
import { preciseNow } from './stamping-model.ts'

export const CHUNKS = 20
/**
 * Fresh agentd processes per target; the figure is the median of their p50s. BENCH_E2E_PROCESSES
 * takes more (5, 7) where the host is noisy: one process in three often runs 10-30 % slower than
 * the others for reasons of the host alone.
 */
const PROCESSES = Math.max(1, Number(process.env['BENCH_E2E_PROCESSES'] ?? 3) || 3)
/**
 * Runs each process makes before it is measured. The figures are a running service's: V8
 * optimises a function only after hundreds of calls, and code a run passes once (a route, a run's
 * start) takes ~300 runs to get there. A fresh process's first runs are reported on their own
 * (FRESH_RUNS), beside the warm figures.
 */
const WARMUP = 500
/** The first runs of each fresh process (taken from its warm-up): what a just-started service costs. */
const FRESH_RUNS = 200
const RUNS = 200
const PHASE_TIME_LIMIT_MS = 60_000
const TARGETS: Array<{ label: string; agentd: boolean; start(modelUrl: string): Promise<ChildServer> }> = [
  { label: 'agentd, SQLite file', agentd: true, start: (url) => startServiceProcess(url, 'file') },
  { label: 'agentd, SQLite :memory:', agentd: true, start: (url) => startServiceProcess(url, 'memory') },
  // The yardstick: agentd's loop, provider and tools without the service around them (bench/bare-agent-process.ts).
  { label: 'bare agent: no store, no framework', agentd: false, start: startBareAgentProcess }
]

/** One run's times, in ms. */
interface Timing {
  e2e: number
  firstText: number
}

/** An agentd run's times, with POST /v1/sessions alone. */
interface AgentdTiming extends Timing {
  session: number
}

type WithClientCpu<T> = T & { clientCpu: number }

/** The model calls of one run, as agentd sent them: the fs_list call, then the text answer. */
type RunBodies = [ChatCompletionCreateParamsStreaming, ChatCompletionCreateParamsStreaming]

/**
 * e2e: the issue's own figures. One client, one run at a time: create a session (default tools,
 * so fs_list is offered), POST one message with Accept: text/event-stream; the model calls
 * fs_list, then streams a CHUNKS-chunk answer (the stamping model, chunks written at once).
 * e2e = from sending POST /v1/sessions (session creation included) to the `done` frame; first
 * text = from sending the message POST to the first `text_chunk` frame.
 *
 * The floor: the same two model calls (the very bodies agentd sent) made straight to the model
 * with the openai SDK; e2e = both calls, first text = from the start of the first call to the
 * second call's first content chunk: from the start to the first text the client sees.
 *
 * The bare agent (bench/bare-agent-process.ts) runs the same loop with agentd's provider and
 * tools, and nothing else: no store, no event log, no framework. Between it and the floor is
 * what any agent service in Node pays for the extra hops (client → service → model and back);
 * between agentd and it, what agentd's persistence and service machinery cost.
 *
 * Each target runs in PROCESSES fresh agentd processes, each warmed up, then RUNS runs that
 * alternate one by one with the floor so both see the same machine state; a target's figure is
 * the median of its processes' p50s, the floor's the median of the p50s of every phase.
 */
export async function run(): Promise<void> {
  const model = await startStampingModelProcess({ chunks: CHUNKS, intervalMs: 0, toolName: 'fs_list' })
  const direct = createDirectClient(model.url)
  let bodies: RunBodies | null = null
  let frame = ''
  const floor = { e2e: [] as number[], firstText: [] as number[], clientCpu: [] as number[] }
  const results = TARGETS.map((target) => ({
    ...target, e2e: [] as number[], firstText: [] as number[], session: [] as number[], clientCpu: [] as number[], cpuMs: [] as number[],
    freshE2e: [] as number[], freshFirstText: [] as number[]
  }))
  try {
    for (let round = 0; round < PROCESSES; round++) {
      for (const result of results) {
        const service = await result.start(model.url)
        const agentd = new AgentdClient(service.url, 2)
        try {
          const throughAgentd = () => withClientCpu(async () => {
            const run = await runThroughAgentd(agentd)
            if (result.agentd) frame = run.frame
            return run.timing
          })
          await throughAgentd()
          bodies ??= await bodiesOfLastRun(originOf(model.url))
          const runBodies: RunBodies = bodies
          const straightToModel = () => withClientCpu(() => runStraightToModel(direct.client, runBodies))
          const fresh: AgentdTiming[] = []
          for (let i = 0; i < WARMUP; i++) {
            const timing = await throughAgentd()
            if (fresh.length < FRESH_RUNS) fresh.push(timing)
            await straightToModel()
          }
          result.freshE2e.push(percentile(fresh.map((r) => r.e2e), 50))
          result.freshFirstText.push(percentile(fresh.map((r) => r.firstText), 50))

          const viaAgentd: Array<WithClientCpu<AgentdTiming>> = []
          const viaSdk: Array<WithClientCpu<Timing>> = []
          const deadline = Date.now() + PHASE_TIME_LIMIT_MS
          const cpuBefore = cpuTimeMs(service.pid)
          while (viaAgentd.length < RUNS && Date.now() < deadline) {
            viaAgentd.push(await throughAgentd())
            viaSdk.push(await straightToModel())
          }
          const cpuAfter = cpuTimeMs(service.pid)
          if (viaAgentd.length < RUNS) console.log(`note: ${result.label} process ${round + 1} hit its time limit after ${viaAgentd.length} runs`)

          const p50 = <T>(runs: T[], key: keyof T) => percentile(runs.map((r) => r[key] as number), 50)
          result.e2e.push(p50(viaAgentd, 'e2e'))
          result.firstText.push(p50(viaAgentd, 'firstText'))
          result.session.push(p50(viaAgentd, 'session'))
          result.clientCpu.push(p50(viaAgentd, 'clientCpu'))
          if (cpuBefore !== null && cpuAfter !== null) result.cpuMs.push((cpuAfter - cpuBefore) / viaAgentd.length)
          floor.e2e.push(p50(viaSdk, 'e2e'))
          floor.firstText.push(p50(viaSdk, 'firstText'))
          floor.clientCpu.push(p50(viaSdk, 'clientCpu'))
        } finally {
          await agentd.close()
          await service.close()
        }
      }
    }
  } finally {
    await direct.close()
    await model.close()
  }

  const median = (values: number[]) => percentile(values, 50)
  const floorE2e = median(floor.e2e)
  const floorFirstText = median(floor.firstText)
  console.log(`\ne2e: one client, one run at a time: new session (default tools), one message, the model calls fs_list, then streams a ${CHUNKS}-chunk answer`)
  console.log(`each agentd target: median of the p50s of ${PROCESSES} fresh processes, each warmed up (${WARMUP} runs, alternating with the floor), then ${RUNS} runs alternating with the floor`)
  console.log('e2e = POST /v1/sessions sent → `done` frame received (session creation included); first text = message POST sent → first `text_chunk` frame')
  console.log('floor: the same two model calls (the bodies agentd sent) with the openai SDK; e2e = both calls, first text = start → first content chunk of the second call')
  printTable([
    ['target', 'e2e p50 ms', '× floor', 'first text p50 ms', '× floor', 'session create p50 ms', 'agentd CPU ms/run', 'client CPU ms/run'],
    ['openai SDK straight to the model (the floor)', fmt(floorE2e), '1.00', fmt(floorFirstText), '1.00', '-', '-', fmt(median(floor.clientCpu))],
    ...results.map((r) => [
      r.label, fmt(median(r.e2e)), fmt(median(r.e2e) / floorE2e), fmt(median(r.firstText)), fmt(median(r.firstText) / floorFirstText),
      fmt(median(r.session)), fmt(median(r.cpuMs)), fmt(median(r.clientCpu))
    ])
  ])
  const each = (values: number[]) => values.map((v) => fmt(v)).join(' / ')
  for (const r of results) console.log(`${r.label}, each process's p50: e2e ${each(r.e2e)} ms, first text ${each(r.firstText)} ms; CPU ${each(r.cpuMs)} ms/run`)
  console.log(`a fresh process, its first ${FRESH_RUNS} runs (before V8 has optimised what a run passes once), median of the processes' p50s:`)
  for (const r of results) {
    console.log(`  ${r.label}: e2e ${fmt(median(r.freshE2e))} ms (${fmt(median(r.freshE2e) / floorE2e)} × floor), ` +
      `first text ${fmt(median(r.freshFirstText))} ms (${fmt(median(r.freshFirstText) / floorFirstText)} × floor)`)
  }
  console.log(`floor, each phase's p50: e2e ${each(floor.e2e)} ms, first text ${each(floor.firstText)} ms`)
  console.log('agentd CPU: the agentd process over the measured runs (/proc) ÷ runs; client CPU: the bench process during one run, p50')
  console.log('bare agent: agentd\'s loop, provider and tools with no store and no framework (bench/bare-agent-process.ts), the yardstick for agentd\'s own machinery')
  console.log(`aims: e2e p50 <= 2 × the floor (${fmt(2 * floorE2e)} ms in this run), first text p50 <= 3 ms`)
  printFrame(frame)
}

/** `run`'s result with the CPU the bench client itself used meanwhile (parsing SSE, the SDK's decoding), in ms. */
async function withClientCpu<T extends object>(run: () => Promise<T>): Promise<WithClientCpu<T>> {
  const before = process.cpuUsage()
  const result = await run()
  const used = process.cpuUsage(before)
  return { ...result, clientCpu: (used.user + used.system) / 1000 }
}

/** One run through agentd, with the first `text_chunk` frame as received (bench/ab.ts runs the same). */
export async function runThroughAgentd(agentd: AgentdClient): Promise<{ timing: AgentdTiming; frame: string }> {
  const started = preciseNow()
  const sessionId = await agentd.createSession({})
  const posted = preciseNow()
  let firstTextAt = 0
  let doneAt = 0
  let chunks = 0
  let toolsOk = 0
  let frame = ''
  const done = await agentd.streamMessage(sessionId, 'List the workspace, then answer.', (type, data, receivedAt, raw) => {
    if (type === 'text_chunk') {
      if (chunks++ === 0) {
        firstTextAt = receivedAt
        frame = raw
      }
    } else if (type === 'tool_executed') {
      if ((JSON.parse(data) as { data: { ok: boolean } }).data.ok) toolsOk++
    } else if (type === 'done') {
      doneAt = receivedAt
    }
  })
  if (done.reason !== 'completed' || chunks !== CHUNKS || toolsOk !== 1) {
    throw new Error(`an agentd run ended ${done.reason} with ${chunks} text chunks and ${toolsOk} successful tool calls (expected ${CHUNKS} and 1)`)
  }
  return { timing: { e2e: doneAt - started, firstText: firstTextAt - posted, session: posted - started }, frame }
}

/** The bodies of the run agentd just made, from the stamping model; fails when fs_list was not offered. */
async function bodiesOfLastRun(modelOrigin: string): Promise<RunBodies> {
  const last = await callJson<{ toolCall: ChatCompletionCreateParamsStreaming | null; text: ChatCompletionCreateParamsStreaming | null }>(`${modelOrigin}/__last-requests`)
  if (!last.toolCall || !last.text) throw new Error('agentd did not offer fs_list to the model in a session with default tools')
  return [last.toolCall, last.text]
}

/** The same two model calls straight to the model with the openai SDK. */
async function runStraightToModel(client: OpenAI, [toolCall, text]: RunBodies): Promise<Timing> {
  const started = preciseNow()
  for await (const _chunk of await client.chat.completions.create(toolCall)) {
    // Read to the end, as agentd does before it runs the tool.
  }
  let firstTextAt = 0
  let chunks = 0
  for await (const chunk of await client.chat.completions.create(text)) {
    if (chunk.choices[0]?.delta.content && chunks++ === 0) firstTextAt = preciseNow()
  }
  const ended = preciseNow()
  if (chunks !== CHUNKS) throw new Error(`a direct run streamed ${chunks} text chunks, expected ${CHUNKS}`)
  return { e2e: ended - started, firstText: firstTextAt - started }
}

/**
 * Prints one `text_chunk` frame as received and where its bytes go: the id and event lines, the
 * `data: ` prefix with the newlines, and each field of the event's JSON (the `data` object's too).
 */
function printFrame(frame: string): void {
  const bytes = (text: string) => Buffer.byteLength(text)
  const total = bytes(frame) + 2
  const [idLine = '', eventLine = '', dataLine = ''] = frame.split('\n')
  const event = JSON.parse(dataLine.slice('data: '.length)) as Record<string, unknown> & { data: Record<string, unknown> & { delta: string } }
  const field = (key: string, value: unknown) => bytes(`${JSON.stringify(key)}:${JSON.stringify(value)}`)
  const fields = Object.entries(event)
  const inner = Object.entries(event.data)

  const parts: Array<[string, number]> = [
    [`id line (${JSON.stringify(`${idLine}\n`)})`, bytes(idLine) + 1],
    [`event line (${JSON.stringify(`${eventLine}\n`)})`, bytes(eventLine) + 1],
    ['"data: " and the two newlines ending the frame', 8],
    ['JSON braces and commas of the event', 2 + fields.length - 1]
  ]
  for (const [key, value] of fields) {
    if (key === 'data') {
      parts.push(['"data": key, braces and commas', bytes('"data":') + 2 + inner.length - 1])
      for (const [innerKey, innerValue] of inner) parts.push([`  data.${innerKey}: ${JSON.stringify(innerValue)}`, field(innerKey, innerValue)])
    } else {
      parts.push([`${key}: ${JSON.stringify(value)}`, field(key, value)])
    }
  }
  const counted = parts.reduce((sum, [, n]) => sum + n, 0)
  const delta = bytes(event.data.delta)

  console.log(`\none text_chunk SSE frame as received: ${total} bytes to carry a ${delta}-byte delta (${fmt((100 * delta) / total, 1)} % of the frame)`)
  console.log(frame.split('\n').map((line) => `  ${line}`).join('\n'))
  printTable([
    ['part of the frame (a field counts its key, quotes, colon and value)', 'bytes', 'share'],
    ...parts.map(([name, n]) => [name, String(n), `${fmt((100 * n) / total, 1)} %`]),
    ['total', String(total), '100.0 %']
  ])
  if (counted !== total) console.log(`note: the parts add up to ${counted} bytes, not ${total}: the frame is not laid out as this breakdown assumes`)
}
