import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as delay } from 'node:timers/promises'

/**
 * The machine's monotonic clock (CLOCK_MONOTONIC) in ms, with sub-millisecond precision: one clock
 * for every process, so a time stamped by the model, agentd or the client compares with any other.
 * `performance.timeOrigin + performance.now()` did not: each process reads timeOrigin from the
 * wall clock once, when it starts, and a model started two minutes after the bench client
 * disagreed with it by 2.4 ms once the machine's wall clock had been slewed meanwhile.
 */
export const preciseNow = (): number => Number(process.hrtime.bigint()) / 1e6

/** preciseNow() at the moment performance.now() read `ms` (perf_hooks entries and timers are on that clock, from this process's start). */
const performanceOrigin = preciseNow() - performance.now()
export const fromPerformanceNow = (ms: number): number => performanceOrigin + ms

export interface StampingModelOptions {
  /** Text chunks per answer. */
  chunks: number
  /** Pause between two text chunks; 0 writes the whole answer at once, as the dev model does. */
  intervalMs: number
  /** Called, with `{}` arguments, when the request offers it and the last message is the user's. */
  toolName: string
}

export interface StampingModel {
  readonly url: string
  close(): Promise<void>
}

interface ChatBody {
  messages: Array<{ role: string }>
  tools?: Array<{ function?: { name?: string } }>
  stream?: boolean
  stream_options?: { include_usage?: boolean }
}

/**
 * A tiny OpenAI-compatible model for the benchmarks. Each text chunk's delta is the time it was
 * sent (`preciseNow()` as a number string), so a client can tell how long the chunk took to reach it.
 *
 * Unlike the dev model, whose script queue is shared by every request, it decides each answer
 * from the request alone (offered tool and user turn → call the tool; otherwise → text), so any
 * number of concurrent runs all get exactly the same shape.
 *
 * Besides POST /v1/chat/completions: GET /__clock (its clock, to check that both processes agree)
 * and GET /__last-requests (the last request of each shape, for replaying the same bodies directly).
 */
export async function startStampingModel(opts: StampingModelOptions): Promise<StampingModel> {
  const last: { toolCall: ChatBody | null; text: ChatBody | null } = { toolCall: null, text: null }
  let counter = 0

  const server = createServer((req, res) => {
    answer(req, res).catch(() => res.destroy())
  })

  async function answer(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.method === 'GET' && req.url === '/__clock') return json(res, 200, { now: preciseNow() })
    if (req.method === 'GET' && req.url === '/__last-requests') return json(res, 200, last)
    if (req.method !== 'POST' || req.url !== '/v1/chat/completions') return json(res, 404, { error: { message: 'not found', type: 'invalid_request_error', code: null } })

    const parts: Buffer[] = []
    for await (const part of req) parts.push(part as Buffer)
    const body = JSON.parse(Buffer.concat(parts).toString('utf8')) as ChatBody
    if (!body.stream) return json(res, 400, { error: { message: 'only stream: true is served', type: 'invalid_request_error', code: null } })

    const id = `chatcmpl-stamp-${++counter}`
    const chunk = (choices: unknown[], extra: Record<string, unknown> = {}) =>
      `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 0, model: 'stamping-model', choices, ...extra })}\n\n`
    const delta = (d: Record<string, unknown>, finish: string | null = null) => chunk([{ index: 0, delta: d, finish_reason: finish }])
    const usage = (completion: number) =>
      body.stream_options?.include_usage ? chunk([], { usage: { prompt_tokens: 10, completion_tokens: completion, total_tokens: 10 + completion } }) : ''

    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
    const offered = (body.tools ?? []).some((tool) => tool.function?.name === opts.toolName)
    if (offered && body.messages.at(-1)?.role === 'user') {
      last.toolCall = body
      const call = { index: 0, id: `call_stamp_${counter}`, type: 'function', function: { name: opts.toolName, arguments: '{}' } }
      res.end(delta({ role: 'assistant', content: null, tool_calls: [call] }) + delta({}, 'tool_calls') + usage(5) + 'data: [DONE]\n\n')
      return
    }

    last.text = body
    if (opts.intervalMs <= 0) {
      let text = ''
      for (let i = 0; i < opts.chunks; i++) text += delta({ ...(i === 0 ? { role: 'assistant' } : {}), content: preciseNow().toFixed(3) })
      res.end(text + delta({}, 'stop') + usage(opts.chunks) + 'data: [DONE]\n\n')
      return
    }
    const gone = new AbortController()
    res.on('close', () => gone.abort())
    for (let i = 0; i < opts.chunks; i++) {
      if (i > 0) await delay(opts.intervalMs, undefined, { signal: gone.signal })
      res.write(delta({ ...(i === 0 ? { role: 'assistant' } : {}), content: preciseNow().toFixed(3) }))
    }
    res.end(delta({}, 'stop') + usage(opts.chunks) + 'data: [DONE]\n\n')
  }

  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}/v1`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve())
        server.closeAllConnections()
      })
  }
}

function json(res: ServerResponse, status: number, body: unknown): void {
  const payload = JSON.stringify(body)
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) })
  res.end(payload)
}
