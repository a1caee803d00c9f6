import type { ChatCompletionCreateParamsStreaming } from 'openai/resources/chat/completions'
import {
  AgentdClient, callJson, createDirectClient, fsListIsWired, originOf, startDevModelProcess, startServiceProcess, streamCompletion
} from './harness.ts'
import { fmt, mean, percentile, printTable } from './report.ts'

const RUNS = 100
const WARMUP = 10
const STEPS = 10
const TIME_LIMIT_MS = 120_000

/**
 * overhead: what agentd adds to each step of an agent loop. A 10-step loop (9 calls of a cheap
 * tool, then a text answer) runs RUNS times through agentd, and RUNS times as the same 10
 * streaming chat completions (the very request bodies agentd sent) made straight to the dev model
 * with the openai SDK. The two alternate, one at a time, so both see the same machine state.
 */
export async function run(): Promise<void> {
  const model = await startDevModelProcess()
  const service = await startServiceProcess(model.url)
  const agentd = new AgentdClient(service.url, 2)
  const direct = createDirectClient(model.url)
  const dev = originOf(model.url)
  try {
    const wired = await fsListIsWired(agentd)
    const script = [
      ...Array.from({ length: STEPS - 1 }, () => ({ toolCalls: [{ name: 'fs_list', arguments: {} }] })),
      { text: 'The workspace was listed nine times and it is empty.' }
    ]
    const scriptModel = async () => {
      await callJson(`${dev}/__dev/reset`, 'POST')
      await callJson(`${dev}/__dev/script`, 'POST', script)
    }

    const throughAgentd = async () => {
      await scriptModel()
      // Until the fs_* tools are wired, the session has none and each call is answered TOOL_NOT_FOUND (still a full tool step).
      const sessionId = await agentd.createSession(wired ? {} : { tools: [] })
      let toolMs = 0
      const started = performance.now()
      const done = await agentd.streamMessage(sessionId, 'List the workspace nine times, then tell me what is in it.', (type, data) => {
        if (type === 'tool_executed') toolMs += (JSON.parse(data) as { data: { durationMs: number } }).data.durationMs
      })
      const ms = performance.now() - started
      if (done.reason !== 'completed') throw new Error(`an agentd run ended ${done.reason}`)
      return { ms, toolMs, events: done.lastSeq }
    }
    const bodiesOfLastRun = async () => {
      const { data } = await callJson<{ data: Array<{ body: ChatCompletionCreateParamsStreaming }> }>(`${dev}/__dev/requests`)
      if (data.length !== STEPS) throw new Error(`expected ${STEPS} model requests per run, saw ${data.length}`)
      return data.map((request) => request.body)
    }
    const straightToModel = async (bodies: ChatCompletionCreateParamsStreaming[]) => {
      await scriptModel()
      const started = performance.now()
      for (const body of bodies) await streamCompletion(direct.client, body)
      return performance.now() - started
    }

    for (let i = 0; i < WARMUP; i++) await throughAgentd()
    const bodies = await bodiesOfLastRun()
    for (let i = 0; i < WARMUP; i++) await straightToModel(bodies)

    const deadline = Date.now() + TIME_LIMIT_MS
    const viaAgentd: number[] = []
    const viaSdk: number[] = []
    const toolMs: number[] = []
    let events = 0
    while (viaAgentd.length < RUNS && Date.now() < deadline) {
      const run = await throughAgentd()
      viaAgentd.push(run.ms)
      toolMs.push(run.toolMs)
      events = run.events
      viaSdk.push(await straightToModel(bodies))
    }

    const perStep = (values: number[]) => mean(values) / STEPS
    console.log(`\noverhead: a ${STEPS}-step tool loop (${STEPS - 1} × fs_list, then a text answer), ${viaAgentd.length} runs one at a time`)
    if (!wired) console.log('note: the fs_* tools are not wired into sessions yet; sessions have tools: [] and every call is answered TOOL_NOT_FOUND')
    printTable([
      ['path', 'ms/run p50', 'ms/run mean', 'ms/step'],
      ['openai SDK → dev model (10 streaming calls)', fmt(percentile(viaSdk, 50)), fmt(mean(viaSdk)), fmt(perStep(viaSdk))],
      ['HTTP → agentd → dev model (one run)', fmt(percentile(viaAgentd, 50)), fmt(mean(viaAgentd)), fmt(perStep(viaAgentd))]
    ])
    console.log(`agentd overhead per step: ${fmt(perStep(viaAgentd) - perStep(viaSdk))} ms ` +
      `(${fmt(mean(toolMs) / STEPS)} ms of it is the tool calls as agentd times them: the tool plus its state writes); ${events} events persisted per run`)
  } finally {
    await agentd.close()
    await direct.close()
    await service.close()
    await model.close()
  }
}
