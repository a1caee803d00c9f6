import OpenAI from 'openai'
import type { ChatCompletionCreateParamsStreaming, ChatCompletionTool } from 'openai/resources/chat/completions'
import { Agent, fetch as undiciFetch } from 'undici'
import { createOpenAIProvider } from '../src/model/provider.ts'
import type { ModelRequest } from '../src/model/types.ts'
import { startStampingModelProcess } from './harness.ts'
import { fmt, percentile, printTable } from './report.ts'

const CHUNKS = 20
const CALLS = 1500
const WARMUP = 300
/** Measured calls are made in this many slices, the paths taking turns, so that all see the same machine state. */
const SLICES = 10
const CONCURRENT = 16

const tools: ChatCompletionTool[] = ['fs_list', 'fs_read', 'fs_write'].map((name) => ({
  type: 'function',
  function: {
    name,
    description: `The ${name} tool of the bench.`,
    parameters: { type: 'object', properties: { path: { type: 'string', description: 'A path in the workspace.' } } }
  }
}))
const messages: ModelRequest['messages'] = [
  { role: 'system', content: 'You are a helpful agent. Use the tools when they help.' },
  { role: 'user', content: 'List the workspace, then answer.' }
]
/** The stamping model calls fs_list when it is offered and answers CHUNKS text chunks otherwise. */
const shapes: Array<{ name: string; request: ModelRequest }> = [
  { name: 'tool call', request: { model: 'stamping-model', messages, tools } },
  { name: `${CHUNKS}-chunk text`, request: { model: 'stamping-model', messages } }
]

interface Path {
  name: string
  /** One call, read to its end; returns how many parts (chunks, bytes) it read, to check that it did the work. */
  call(request: ModelRequest, requestId: string): Promise<number>
  /** Every answer of one shape gives the same count (chunks and parts do; bytes do not, the answers' ids grow). */
  steadyCount: boolean
  close(): Promise<void>
}

/**
 * model: the CPU one model call costs the process that makes it. Each path streams the same two
 * answers of the stamping model (in its own process): a tool call, and a CHUNKS-chunk text.
 * - undici.request: the floor; the same request, its raw bytes read and not parsed.
 * - openai SDK: `client.chat.completions.create` set up as agentd's provider used it before this
 *   bench existed (undici's fetch, SDK retries off, the run's signal and X-Request-Id), chunks iterated.
 * - provider: agentd's `createOpenAIProvider().stream()`, parts iterated.
 * CPU is this process's (process.cpuUsage) per call, first one call at a time, then CONCURRENT at once.
 */
export async function run(): Promise<void> {
  const model = await startStampingModelProcess({ chunks: CHUNKS, intervalMs: 0, toolName: 'fs_list' })
  const paths = [rawPath(model.url), sdkPath(model.url), providerPath(model.url)]
  try {
    for (const concurrency of [1, CONCURRENT]) {
      for (const { name, request } of shapes) {
        const rows: string[][] = [['path', 'calls', 'CPU µs/call', 'wall p50 ms', 'wall p99 ms']]
        const results = paths.map(() => ({ cpuMicros: 0, calls: 0, latencies: [] as number[] }))
        for (const path of paths) await measure(path, request, WARMUP, concurrency)
        for (let slice = 0; slice < SLICES; slice++) {
          for (const [i, path] of paths.entries()) {
            const result = results[i] as (typeof results)[number]
            const outcome = await measure(path, request, CALLS / SLICES, concurrency)
            result.cpuMicros += outcome.cpuMicros
            result.calls += outcome.latencies.length
            result.latencies.push(...outcome.latencies)
          }
        }
        for (const [i, path] of paths.entries()) {
          const { cpuMicros, calls, latencies } = results[i] as (typeof results)[number]
          rows.push([path.name, String(calls), fmt(cpuMicros / calls, 0), fmt(percentile(latencies, 50), 3), fmt(percentile(latencies, 99), 3)])
        }
        console.log(`\nmodel: one ${name} answer, ${concurrency === 1 ? 'one call at a time' : `${concurrency} calls at once`}; CPU of this process`)
        printTable(rows)
        const [floor, before, provider] = results.map((r) => r.cpuMicros / r.calls) as [number, number, number]
        console.log(`above the floor: provider.stream() ${fmt(provider - floor, 0)} µs/call, the SDK as agentd used it before ${fmt(before - floor, 0)} µs/call`)
      }
    }
  } finally {
    for (const path of paths) await path.close()
    await model.close()
  }
}

/** Makes `calls` calls of `path`, `concurrency` at once; returns this process's CPU time and each call's wall time. */
async function measure(path: Path, request: ModelRequest, calls: number, concurrency: number) {
  const latencies: number[] = []
  let next = 0
  let expected: number | null = null
  const worker = async () => {
    while (next < calls) {
      const i = next++
      const started = performance.now()
      const parts = await path.call(request, `req-bench-${i}`)
      latencies.push(performance.now() - started)
      expected ??= parts
      if (parts === 0 || (path.steadyCount && parts !== expected)) {
        throw new Error(`${path.name}: a call read ${parts} parts, another ${expected}`)
      }
    }
  }
  const cpu = process.cpuUsage()
  await Promise.all(Array.from({ length: concurrency }, worker))
  const used = process.cpuUsage(cpu)
  return { cpuMicros: used.user + used.system, latencies }
}

/** The request body agentd's provider sends for `request`. */
function bodyOf(request: ModelRequest): ChatCompletionCreateParamsStreaming {
  return {
    model: request.model,
    messages: request.messages,
    stream: true,
    stream_options: { include_usage: true },
    ...(request.tools ? { tools: request.tools } : {})
  }
}

function rawPath(baseURL: string): Path {
  const dispatcher = new Agent({ keepAliveTimeout: 30_000 })
  const url = `${baseURL}/chat/completions`
  return {
    name: 'undici.request (raw bytes)',
    steadyCount: false,
    async call(request, requestId) {
      const res = await dispatcher.request({
        origin: new URL(url).origin,
        path: new URL(url).pathname,
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: 'Bearer bench', 'x-request-id': requestId },
        body: JSON.stringify(bodyOf(request))
      })
      let bytes = 0
      for await (const chunk of res.body) bytes += (chunk as Buffer).length
      if (res.statusCode !== 200) throw new Error(`HTTP ${res.statusCode}`)
      return bytes
    },
    close: () => dispatcher.close()
  }
}

function sdkPath(baseURL: string): Path {
  const dispatcher = new Agent({ connect: { timeout: 10_000 }, headersTimeout: 120_000, bodyTimeout: 300_000, keepAliveTimeout: 30_000 })
  const client = new OpenAI({
    apiKey: 'bench',
    baseURL,
    maxRetries: 0,
    timeout: 131_000,
    fetch: undiciFetch as unknown as typeof globalThis.fetch,
    fetchOptions: { dispatcher },
    logLevel: 'off'
  })
  const signal = new AbortController().signal
  return {
    name: 'openai SDK create() (before)',
    steadyCount: true,
    async call(request, requestId) {
      let chunks = 0
      for await (const _chunk of await client.chat.completions.create(bodyOf(request), { signal, headers: { 'X-Request-Id': requestId } })) chunks++
      return chunks
    },
    close: () => dispatcher.close()
  }
}

function providerPath(baseURL: string): Path {
  const provider = createOpenAIProvider({ apiKey: 'bench', baseURL })
  const signal = new AbortController().signal
  return {
    name: 'provider.stream()',
    steadyCount: true,
    async call(request, requestId) {
      let parts = 0
      for await (const _part of provider.stream(request, { signal, requestId })) parts++
      return parts
    },
    close: () => provider.close()
  }
}
