import { createServer, type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as delay } from 'node:timers/promises'
import type { ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions'

/** A tool call the dev model should make; `arguments` as an object is sent as its JSON text. */
export interface DevToolCall {
  name: string
  arguments: Record<string, unknown> | string
  id?: string
}

/**
 * One scripted answer (SPEC 9), consumed by one chat completion request.
 * `delayMs` may be added to any step, or stand alone to delay the default answer.
 */
export type DevModelStep =
  | ((
      /** Answer text, split into `chunks` pieces (default: one per word). */
      | { text: string; chunks?: number }
      /** Tool calls, streamed as OpenAI does (id and name first, argument fragments after), optionally after some text. */
      | { toolCalls: DevToolCall[]; text?: string }
      /** Fail with this status; `body` is sent verbatim, else an OpenAI-style `{error: {message, type, code}}`. */
      | { status: number; body?: object; headers?: Record<string, string> }
      /** Never answer (until the client disconnects or close()); a streaming request gets the headers and `afterChunks` chunks first. */
      | { hang: true; afterChunks?: number }
      /** Send this many SSE chunks of the answer, then destroy the socket. */
      | { cutAfterChunks: number; text?: string }
      /** `reasoning_content` deltas (DeepSeek/vLLM style) before the text. */
      | { reasoning: string; text: string }
    ) & { delayMs?: number })
  | { delayMs: number }

/** A chat completion request as the dev model received it. */
export interface DevChatRequest {
  model?: string
  messages: ChatCompletionMessageParam[]
  tools?: ChatCompletionTool[]
  stream?: boolean
  stream_options?: { include_usage?: boolean }
  [key: string]: unknown
}

export interface DevModelRequest {
  body: DevChatRequest
  /** Lower-cased, as node:http gives them. */
  headers: IncomingHttpHeaders
}

export interface DevModel {
  /** Base URL for an OpenAI client, ending in `/v1`. */
  readonly url: string
  readonly port: number
  /** The latest valid chat completion requests (at most `requestLog` of them), oldest first. */
  readonly requests: DevModelRequest[]
  /** Queues steps; each request takes the oldest one, and an empty queue means the default behaviour. */
  script(...steps: DevModelStep[]): void
  /**
   * Gives the model a context window: a request whose prompt (counted as in `usage`, four
   * characters a token) is longer is refused with a 400 `context_length_exceeded`, as OpenAI does,
   * without taking a scripted step. null removes the limit.
   */
  setContextLimit(tokens: number | null): void
  /** Empties the script queue and the request log. */
  reset(): void
  close(): Promise<void>
}

type Answer =
  | { kind: 'text'; text: string; chunks?: number; reasoning?: string }
  | { kind: 'tool_calls'; calls: DevToolCall[]; text?: string }

/**
 * How many requests the dev model keeps for `requests` and `GET /__dev/requests`, the oldest
 * dropped first: `npm start` without a model runs it inside agentd, where keeping every request
 * (each with the history it sent) grew the heap ~60 KB a run for as long as the process lived.
 */
const REQUEST_LOG = 1000

/** Starts the dev model on `port` (0 = any free port) and resolves once it listens. */
export async function startDevModel(opts: { port?: number; host?: string; contextLimit?: number; requestLog?: number } = {}): Promise<DevModel> {
  const host = opts.host ?? '127.0.0.1'
  const requestLog = opts.requestLog ?? REQUEST_LOG
  const queue: DevModelStep[] = []
  const requests: DevModelRequest[] = []
  let counter = 0
  let contextLimit = opts.contextLimit ?? null

  const server = createServer((req, res) => {
    route(req, res).catch((err: unknown) => {
      if (!res.headersSent) sendError(res, 500, { message: `dev model failed: ${String(err)}`, type: 'server_error', code: null })
      else res.destroy()
    })
  })

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = new URL(req.url ?? '/', 'http://dev').pathname
    if (req.method === 'POST' && path === '/v1/chat/completions') return chatCompletion(req, res)
    if (req.method === 'GET' && path === '/v1/models') {
      return sendJson(res, 200, { object: 'list', data: [{ id: 'dev-model', object: 'model', created: 0, owned_by: 'agentd' }] })
    }
    if (req.method === 'POST' && path === '/__dev/script') {
      const body = await readJson(req).catch(() => null)
      const steps = Array.isArray(body) ? body : [body]
      if (!steps.every((s) => typeof s === 'object' && s !== null && !Array.isArray(s))) {
        return sendError(res, 400, { message: 'expected a JSON array of step objects', type: 'invalid_request_error', code: null })
      }
      queue.push(...(steps as DevModelStep[]))
      return sendJson(res, 200, { queued: queue.length })
    }
    if (req.method === 'GET' && path === '/__dev/requests') return sendJson(res, 200, { data: requests })
    if (req.method === 'POST' && path === '/__dev/reset') {
      reset()
      res.writeHead(204).end()
      return
    }
    sendError(res, 404, { message: `no route ${req.method} ${path}`, type: 'invalid_request_error', code: 'unknown_url' })
  }

  async function chatCompletion(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let body: unknown
    try {
      body = await readJson(req)
    } catch {
      return sendError(res, 400, { message: 'request body is not valid JSON', type: 'invalid_request_error', code: null })
    }
    if (!isChatRequest(body)) {
      return sendError(res, 400, { message: "'messages' must be an array", type: 'invalid_request_error', code: null })
    }
    requests.push({ body, headers: req.headers })
    if (requests.length > requestLog) requests.splice(0, requests.length - requestLog)
    const n = ++counter
    res.setHeader('x-request-id', headerValue(req.headers['x-request-id']) ?? `req_dev_${n}`)
    const prompt = contextLimit === null ? 0 : promptTokens(body)
    if (contextLimit !== null && prompt > contextLimit) {
      return sendError(res, 400, {
        message: `This model's maximum context length is ${contextLimit} tokens. However, your messages resulted in ${prompt} tokens. Please reduce the length of the messages.`,
        type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded'
      })
    }

    const step = queue.shift()
    const gone = new AbortController()
    res.on('close', () => gone.abort())
    if (step?.delayMs) {
      try {
        await delay(step.delayMs, undefined, { signal: gone.signal })
      } catch {
        return
      }
    }

    const ctx: Reply = { res, body, seq: n, created: Math.floor(Date.now() / 1000), model: body.model ?? 'dev-model' }
    if (step === undefined) return reply(ctx, defaultAnswer(body))
    if ('status' in step) {
      if (step.body) return sendJson(res, step.status, step.body, step.headers)
      return sendError(res, step.status, defaultError(step.status, ctx.model), step.headers)
    }
    if ('hang' in step) return hang(ctx, step.afterChunks ?? 0)
    if ('cutAfterChunks' in step) return cut(ctx, { kind: 'text', text: step.text ?? 'This answer is cut off before it ends.' }, step.cutAfterChunks)
    if ('toolCalls' in step) return reply(ctx, { kind: 'tool_calls', calls: step.toolCalls, text: step.text })
    if ('reasoning' in step) return reply(ctx, { kind: 'text', text: step.text, reasoning: step.reasoning })
    if ('text' in step) return reply(ctx, { kind: 'text', text: step.text, chunks: step.chunks })
    return reply(ctx, defaultAnswer(body))
  }

  function reset(): void {
    queue.length = 0
    requests.length = 0
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(opts.port ?? 0, host, () => {
      server.off('error', reject)
      resolve()
    })
  })
  const { port } = server.address() as AddressInfo
  const urlHost = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host.includes(':') ? `[${host}]` : host

  return {
    url: `http://${urlHost}:${port}/v1`,
    port,
    requests,
    script: (...steps) => {
      queue.push(...steps)
    },
    setContextLimit: (tokens) => {
      contextLimit = tokens
    },
    reset,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve())
        // Hanging and keep-alive connections would otherwise hold close() open.
        server.closeAllConnections()
      })
  }
}

interface Reply {
  res: ServerResponse
  body: DevChatRequest
  /** Numbers this answer's completion id and tool call ids. */
  seq: number
  created: number
  model: string
}

function reply(ctx: Reply, answer: Answer): void {
  if (ctx.body.stream) {
    writeStreamHead(ctx.res)
    ctx.res.end(streamEvents(ctx, answer).join('') + 'data: [DONE]\n\n')
  } else {
    sendJson(ctx.res, 200, completion(ctx, answer))
  }
}

function hang(ctx: Reply, afterChunks: number): void {
  if (afterChunks <= 0 || !ctx.body.stream) return
  const events = streamEvents(ctx, { kind: 'text', text: 'This answer stops half way and never ends.' })
  writeStreamHead(ctx.res)
  ctx.res.write(events.slice(0, afterChunks).join(''))
}

function cut(ctx: Reply, answer: Answer, afterChunks: number): void {
  const { res } = ctx
  const full = ctx.body.stream ? streamEvents(ctx, answer) : null
  if (full) writeStreamHead(res)
  else res.writeHead(200, { 'content-type': 'application/json' })
  // An SSE comment stands in for "no chunk yet", so the headers still go out before the socket dies.
  const sent = full ? full.slice(0, afterChunks).join('') || ': cut\n\n' : JSON.stringify(completion(ctx, answer)).slice(0, 20)
  res.write(sent, () => res.socket?.destroy())
}

function writeStreamHead(res: ServerResponse): void {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' })
}

/** The SSE events of an answer: deltas, the finish chunk and, when asked for, a usage chunk (as OpenAI sends them). */
function streamEvents(ctx: Reply, answer: Answer): string[] {
  const chunk = (choices: unknown[], extra: Record<string, unknown> = {}): string =>
    `data: ${JSON.stringify({ id: `chatcmpl-dev-${ctx.seq}`, object: 'chat.completion.chunk', created: ctx.created, model: ctx.model, choices, ...extra })}\n\n`
  const delta = (d: Record<string, unknown>): string => chunk([{ index: 0, delta: d, finish_reason: null, logprobs: null }])
  const deltas: Record<string, unknown>[] = []

  if (answer.kind === 'text' && answer.reasoning) {
    for (const piece of splitText(answer.reasoning)) deltas.push({ reasoning_content: piece })
  }
  const text = answer.text ?? ''
  for (const piece of splitText(text, answer.kind === 'text' ? answer.chunks : undefined)) deltas.push({ content: piece })
  if (answer.kind === 'tool_calls') {
    answer.calls.forEach((call, index) => {
      deltas.push({
        tool_calls: [{ index, id: toolCallId(ctx, call, index), type: 'function', function: { name: call.name, arguments: '' } }]
      })
      for (const fragment of fragments(argumentsText(call))) {
        deltas.push({ tool_calls: [{ index, function: { arguments: fragment } }] })
      }
    })
  }
  if (deltas[0]) deltas[0] = { role: 'assistant', ...deltas[0] }
  else deltas.push({ role: 'assistant', content: '' })

  const events = deltas.map(delta)
  events.push(chunk([{ index: 0, delta: {}, finish_reason: finishReason(answer), logprobs: null }]))
  if (ctx.body.stream_options?.include_usage) events.push(chunk([], { usage: usage(ctx.body, answer) }))
  return events
}

function completion(ctx: Reply, answer: Answer): Record<string, unknown> {
  const message: Record<string, unknown> = { role: 'assistant', content: answer.text ?? null, refusal: null }
  if (answer.kind === 'text' && answer.reasoning) message['reasoning_content'] = answer.reasoning
  if (answer.kind === 'tool_calls') {
    message['tool_calls'] = answer.calls.map((call, index) => ({
      id: toolCallId(ctx, call, index),
      type: 'function',
      function: { name: call.name, arguments: argumentsText(call) }
    }))
  }
  return {
    id: `chatcmpl-dev-${ctx.seq}`,
    object: 'chat.completion',
    created: ctx.created,
    model: ctx.model,
    choices: [{ index: 0, message, finish_reason: finishReason(answer), logprobs: null }],
    usage: usage(ctx.body, answer)
  }
}

function toolCallId(ctx: Reply, call: DevToolCall, index: number): string {
  return call.id ?? `call_dev${ctx.seq}_${index}`
}

function finishReason(answer: Answer): string {
  return answer.kind === 'tool_calls' ? 'tool_calls' : 'stop'
}

/** Plausible token counts: about four characters a token. */
function usage(body: DevChatRequest, answer: Answer): Record<string, number> {
  const prompt = promptTokens(body)
  const out = (answer.text ?? '') + (answer.kind === 'text' ? (answer.reasoning ?? '') : answer.calls.map(argumentsText).join(''))
  const completionTokens = Math.max(1, Math.ceil(out.length / 4))
  return { prompt_tokens: prompt, completion_tokens: completionTokens, total_tokens: prompt + completionTokens }
}

function promptTokens(body: DevChatRequest): number {
  return Math.ceil((JSON.stringify(body.messages).length + JSON.stringify(body.tools ?? []).length) / 4)
}

function argumentsText(call: DevToolCall): string {
  return typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments)
}

/** Splits text into `n` pieces, or one piece per word; the pieces always join back to the text. */
function splitText(text: string, n?: number): string[] {
  if (text === '') return []
  if (n === undefined) return text.match(/\s*\S+\s*|\s+/g) ?? [text]
  const chars = Array.from(text)
  const size = Math.ceil(chars.length / Math.max(1, Math.floor(n)))
  const pieces: string[] = []
  for (let i = 0; i < chars.length; i += size) pieces.push(chars.slice(i, i + size).join(''))
  return pieces
}

/** Argument fragments as a real provider streams them: a few pieces, cut anywhere. */
function fragments(args: string): string[] {
  return args === '' ? [] : splitText(args, Math.min(3, args.length))
}

/**
 * The unscripted answer, also the no-key demo: summarise tool results, make a tool call the user asked
 * for with `call <tool> {json}` (when the request offers that tool), else echo the user.
 */
function defaultAnswer(body: DevChatRequest): Answer {
  const { messages } = body
  if (isSummaryRequest(messages)) return { kind: 'text', text: summariseTranscript(textOf(messages.at(-1)?.content)) }
  if (messages.at(-1)?.role === 'tool') return { kind: 'text', text: summariseToolResults(messages) }
  const lastUser = messages.findLast((m) => m.role === 'user')
  const said = lastUser ? textOf(lastUser.content) : ''
  const offered = new Set((body.tools ?? []).map((tool) => (tool as { function?: { name?: string } }).function?.name))
  const calls = callInstructions(said).filter((call) => offered.has(call.name))
  if (calls.length > 0) return { kind: 'tool_calls', calls }
  if (said.trim() === '') return { kind: 'text', text: 'Hello from the agentd dev model. Write "call <tool> {json}" to make me call a tool.' }
  return { kind: 'text', text: `You said: ${said}` }
}

/** agentd's own summarising call (src/agent/context/summariser.ts) opens with these words. */
function isSummaryRequest(messages: ChatCompletionMessageParam[]): boolean {
  const first = messages[0]
  return first?.role === 'system' && /^You summarise/.test(textOf(first.content))
}

/** A short summary of a transcript: what the user said, each cut short, at most 600 characters in all. */
function summariseTranscript(transcript: string): string {
  const said = transcript.split('\n').filter((line) => line.startsWith('user: ')).map((line) => line.slice(6, 66))
  const text = `Summary: the user said ${said.length > 0 ? said.join('; ') : 'nothing yet'}.`
  return text.length > 600 ? `${text.slice(0, 599)}…` : text
}

function summariseToolResults(messages: ChatCompletionMessageParam[]): string {
  const names = new Map<string, string>()
  for (const m of messages) {
    if (m.role === 'assistant') for (const call of m.tool_calls ?? []) if (call.type === 'function') names.set(call.id, call.function.name)
  }
  const lines: string[] = []
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i]
    if (m?.role !== 'tool') break
    const result = textOf(m.content)
    const shown = result.length > 200 ? `${result.slice(0, 200)}…` : result
    lines.unshift(`Tool ${names.get(m.tool_call_id) ?? m.tool_call_id} returned: ${shown}`)
  }
  return lines.join('\n')
}

/** Finds every `call <name> [{json}]` in the text; arguments that are not valid JSON are passed on as raw text. */
function callInstructions(text: string): DevToolCall[] {
  const calls: DevToolCall[] = []
  const pattern = /\bcall\s+([A-Za-z0-9_.:-]+)/g
  for (let match = pattern.exec(text); match !== null; match = pattern.exec(text)) {
    const name = match[1] ?? ''
    const rest = text.slice(pattern.lastIndex)
    const start = rest.search(/\S/)
    const json = start >= 0 && rest[start] === '{' ? balancedObject(rest.slice(start)) : null
    if (json === null) {
      calls.push({ name, arguments: {} })
      continue
    }
    pattern.lastIndex += start + json.length
    try {
      calls.push({ name, arguments: JSON.parse(json) as Record<string, unknown> })
    } catch {
      calls.push({ name, arguments: json })
    }
  }
  return calls
}

/** The `{…}` at the start of `text`, braces balanced outside strings; null if it never closes. */
function balancedObject(text: string): string | null {
  let depth = 0
  let inString = false
  for (let i = 0; i < text.length; i++) {
    const c = text[i]
    if (inString) {
      if (c === '\\') i++
      else if (c === '"') inString = false
    } else if (c === '"') inString = true
    else if (c === '{') depth++
    else if (c === '}' && --depth === 0) return text.slice(0, i + 1)
  }
  return null
}

function textOf(content: unknown): string {
  if (typeof content === 'string') return content
  if (!Array.isArray(content)) return ''
  return content.map((part: { type?: string; text?: string }) => (part.type === 'text' ? (part.text ?? '') : '')).join('')
}

interface OpenAIErrorObject {
  message: string
  type: string
  code: string | null
  param?: string
}

function defaultError(status: number, model: string): OpenAIErrorObject {
  const errors: Record<number, OpenAIErrorObject> = {
    400: { message: 'Invalid request.', type: 'invalid_request_error', code: null },
    401: { message: 'Incorrect API key provided.', type: 'invalid_request_error', code: 'invalid_api_key' },
    403: { message: 'You are not allowed to use this model.', type: 'invalid_request_error', code: 'unsupported_country_region_territory' },
    404: { message: `The model \`${model}\` does not exist or you do not have access to it.`, type: 'invalid_request_error', code: 'model_not_found' },
    429: { message: 'Rate limit reached for requests.', type: 'requests', code: 'rate_limit_exceeded' },
    500: { message: 'The server had an error while processing your request.', type: 'server_error', code: null },
    503: { message: 'The engine is currently overloaded, please try again later.', type: 'server_error', code: null }
  }
  return errors[status] ?? { message: `Dev model scripted status ${status}.`, type: status >= 500 ? 'server_error' : 'invalid_request_error', code: null }
}

function sendError(res: ServerResponse, status: number, error: OpenAIErrorObject, headers: Record<string, string> = {}): void {
  sendJson(res, status, { error }, headers)
}

function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const payload = JSON.stringify(body)
  res.writeHead(status, { ...headers, 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) })
  res.end(payload)
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const parts: Buffer[] = []
  for await (const part of req) parts.push(part as Buffer)
  return JSON.parse(Buffer.concat(parts).toString('utf8'))
}

function isChatRequest(body: unknown): body is DevChatRequest {
  return typeof body === 'object' && body !== null && Array.isArray((body as { messages?: unknown }).messages)
}

function headerValue(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value
}

if (import.meta.main) {
  const port = Number(process.env['DEV_MODEL_PORT'] ?? 4010)
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error(`DEV_MODEL_PORT: expected a port number 0-65535, got "${process.env['DEV_MODEL_PORT']}"`)
    process.exit(1)
  }
  const limit = process.env['DEV_MODEL_CONTEXT_TOKENS']
  const contextLimit = limit === undefined ? undefined : Number(limit)
  if (contextLimit !== undefined && !(Number.isInteger(contextLimit) && contextLimit > 0)) {
    console.error(`DEV_MODEL_CONTEXT_TOKENS: expected a positive integer of tokens, got "${limit}"`)
    process.exit(1)
  }
  const devModel = await startDevModel({ port, host: process.env['DEV_MODEL_HOST'] ?? '127.0.0.1', ...(contextLimit === undefined ? {} : { contextLimit }) })
  console.log(`agentd dev model listening on ${devModel.url}`)
  for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, () => void devModel.close())
}
