import OpenAI, { APIError } from 'openai'
import type { ChatCompletionChunk } from 'openai/resources/chat/completions'
import { Agent } from 'undici'
import { setImmediate as nextTurn } from 'node:timers/promises'
import type { Usage } from '../schemas/common.ts'
import { classifyModelError, createModelError } from './model-errors.ts'
import { createDispatcherFetch } from './dispatcher-fetch.ts'
import { chatRequestJson } from './request-json.ts'
import { ServerSentEventDecoder, type ServerSentEvent } from './sse.ts'
import { jsonDepth, MAX_JSON_DEPTH } from '../json-depth.ts'
import { REASONING, type ModelCallOptions, type ModelError, type ModelProvider, type ModelRequest, type ModelStreamPart } from './types.ts'

export interface OpenAIProviderOptions {
  apiKey?: string
  /** Any OpenAI-compatible server's base URL, ending in `/v1`; default OpenAI's. */
  baseURL?: string
  /** 'dev' when pointed at the built-in dev model; default 'openai'. */
  kind?: 'openai' | 'dev'
  connectTimeoutMs?: number
  /** Longest wait for the response headers (a model that never starts answering). */
  headersTimeoutMs?: number
  /** Longest silence between two body chunks (a stream that stalls). */
  bodyTimeoutMs?: number
}

/** Text of the model's answer read in one turn of the event loop before the reader lets other work in. */
const TURN_BYTES = 64 * 1024

/**
 * The most one model call may answer: characters of text, reasoning and tool-call arguments, and
 * stream chunks that carry any. Real answers stop at the model's output limit (tens of thousands
 * of tokens, one chunk a token); a server that never stops (a generation loop that ignores its
 * limit) would otherwise have every chunk stored, a gigabyte of events a minute, until the disk
 * is full. Both are several times what any model answers in one call.
 */
export const MAX_ANSWER_CHARS = 4 * 1024 * 1024
export const MAX_ANSWER_CHUNKS = 256 * 1024
/**
 * The most tool calls one answer may ask for. Models call a handful at once; a server that sends
 * thousands (each `{}` is a few characters, so 4 Mi characters hold 400 000) would have every one
 * run, stored with three events and sent back to it: 20 000 took 9 s and 500 MB, and the next
 * request carried all their answers.
 */
export const MAX_TOOL_CALLS = 128

const defaults = { connectTimeoutMs: 10_000, headersTimeoutMs: 120_000, bodyTimeoutMs: 300_000 }

/**
 * A ModelProvider over the openai SDK: SDK retries off (the run owns retries, SPEC 5.1), undici
 * owns the timeouts. The request's JSON is made here (request-json.ts: the tools' JSON once, not
 * at every call); the SDK adds its headers and auth, sends it and throws its APIError classes for
 * an error status, through a fetch straight over undici's dispatcher (dispatcher-fetch.ts); the
 * answer's event stream is read here, one JSON.parse per chunk (sse.ts).
 */
export function createOpenAIProvider(opts: OpenAIProviderOptions = {}): ModelProvider {
  const connectTimeoutMs = opts.connectTimeoutMs ?? defaults.connectTimeoutMs
  const headersTimeoutMs = opts.headersTimeoutMs ?? defaults.headersTimeoutMs
  const bodyTimeoutMs = opts.bodyTimeoutMs ?? defaults.bodyTimeoutMs
  const configured = opts.apiKey !== undefined || opts.baseURL !== undefined
  // What the server was found to refuse, once it refused it (adapted, below): stream_options, a
  // user message right after tool results, and max_tokens (per model: one server, a gateway or an
  // Azure resource, also serves models that take it).
  let askUsage = true
  let bridgeToolTurns = false
  const completionTokensModels = new Set<string>()
  // Per model too: DeepSeek's thinking models want their reasoning back with their tool calls.
  const reasoningBackModels = new Set<string>()
  const dispatcher = new Agent({
    connect: { timeout: connectTimeoutMs },
    headersTimeout: headersTimeoutMs,
    bodyTimeout: bodyTimeoutMs,
    keepAliveTimeout: 30_000
  })
  const http = createDispatcherFetch(dispatcher)
  const client = new OpenAI({
    // Servers such as Ollama or vLLM need no key, but the SDK insists on one; a wrong key still surfaces as a 401.
    apiKey: opts.apiKey ?? 'no-key',
    baseURL: opts.baseURL ?? 'https://api.openai.com/v1',
    maxRetries: 0,
    // What the SDK announces (X-Stainless-Timeout). Its own deadline is not passed to the fetch: undici's connect and headers timeouts end every wait before it.
    timeout: connectTimeoutMs + headersTimeoutMs + 1000,
    fetch: http.fetch,
    // The SDK would otherwise print to the console on a malformed stream; the error reaches the caller classified anyway.
    logLevel: 'off'
  })

  return {
    kind: opts.kind ?? 'openai',
    async *stream(request: ModelRequest, options: ModelCallOptions): AsyncIterable<ModelStreamPart> {
      if (!configured) {
        throw createModelError('PROVIDER_NOT_CONFIGURED', 'No model provider is configured: neither an API key nor a base URL was given.')
      }
      const { signal } = options
      const context = () => ({ aborted: signal.aborted, timedOut: signal.aborted && isTimeoutReason(signal.reason) })

      const answer = new Answer()
      // [DONE], or a whole completion: the server said the answer is complete.
      let complete = false
      try {
        const headers = {
          // A string body with its content type is sent by the SDK as it is (its own JSON encoding is skipped).
          'Content-Type': 'application/json',
          'X-Request-Id': options.requestId,
          ...(options.traceparent ? { traceparent: options.traceparent } : {})
        }
        // The SDK sends the request (its headers, auth, base URL) and throws its APIError classes
        // for an error status; the stream is read here. The request's JSON is made here
        // (request-json.ts) and handed to the SDK as it is sent.
        const adaptedRequest = () => {
          const bridged = bridgeToolTurns ? withToolTurnsBridged(request) : request
          return reasoningBackModels.has(request.model) ? withReasoningBack(bridged) : bridged
        }
        const send = () => client.post('/chat/completions', {
          body: chatRequestJson(adaptedRequest(), { askUsage, completionTokens: completionTokensModels.has(request.model) }),
          stream: true, headers, fetchOptions: http.withSignal(signal)
        }).asResponse()
        // A refusal of something the request can do without is adapted to, for this call and the
        // process's later ones; each once, so a call sends at most ADAPTATIONS + 1 requests.
        const adapted = (err: unknown): boolean => {
          // Mistral's API and Azure's "on your data" refuse stream_options (400 or 422, "extra
          // inputs are not permitted"), which failed every run. Their answers then carry no usage,
          // counted as zero tokens like any answer without it.
          if (askUsage && refusesStreamOptions(err)) {
            askUsage = false
            return true
          }
          // Mistral refuses a user message right after tool results, the history of a run that
          // ended before it answered them (its step limit, an interrupt, a failure): every later
          // run of the session failed.
          if (!bridgeToolTurns && refusesUserAfterTool(err)) {
            bridgeToolTurns = true
            return true
          }
          // A reasoning model under a name request-json.ts cannot tell (an Azure deployment, a
          // gateway's alias) refuses max_tokens, which only summaries send: each failed.
          if (!completionTokensModels.has(request.model) && request.maxTokens !== undefined && refusesMaxTokens(err)) {
            remember(completionTokensModels, request.model)
            return true
          }
          // DeepSeek's thinking mode refuses assistant messages with tool calls that lack their
          // reasoning_content ("Missing `reasoning_content` field"): every step after a call failed.
          if (!reasoningBackModels.has(request.model) && refusesWithoutReasoning(err)) {
            remember(reasoningBackModels, request.model)
            return true
          }
          return false
        }
        let response: Response
        for (let attempt = 0; ; attempt++) {
          try {
            response = await send()
            break
          } catch (err) {
            if (attempt === ADAPTATIONS || !adapted(err)) throw err
          }
        }
        const reader = http.takeBody(response)
        const decoder = new ServerSentEventDecoder()
        // The body's text while no stream event has come: a server that does not stream answers one JSON completion instead.
        let unstreamed: string[] | null = []
        let unstreamedChars = 0
        let finished = false
        let sinceTurn = 0
        let lastEventAt = Date.now()
        try {
          reading: for (;;) {
            // Text already held comes back without a turn of the event loop: a burst (a long
            // answer sent at once) would otherwise be parsed, stored and streamed in one turn,
            // with every other request waiting behind it.
            if (sinceTurn > TURN_BYTES) {
              sinceTurn = 0
              await nextTurn()
            }
            const text = await reader.read()
            if (text !== null) sinceTurn += text.length
            const events = text === null ? decoder.end() : decoder.decode(text)
            // undici's body timeout sees bytes; keep-alive comments alone must not hold the call open for good.
            if (events.length > 0) lastEventAt = Date.now()
            else if (Date.now() - lastEventAt > bodyTimeoutMs) throw onlyPings(bodyTimeoutMs)
            if (unstreamed !== null) {
              if (events.length > 0) unstreamed = null
              else if (text !== null && (unstreamedChars += text.length) <= MAX_ANSWER_CHARS) unstreamed.push(text)
            }
            for (const event of events) {
              if (event.data === '[DONE]') {
                complete = true
                break reading
              }
              for (const part of answer.take(parseChunk(event, response.headers))) yield part
            }
            if (text === null) break
          }
          finished = true
        } finally {
          // After [DONE] the rest of the body is read and dropped, so that the connection is kept; on a failure or an early stop it is aborted.
          reader.close(finished)
        }
        if (unstreamed !== null && unstreamedChars > 0) {
          for (const part of answer.take(completionAsChunk(unstreamed.join(''), unstreamedChars, response.headers))) yield part
          complete = true
        }
      } catch (err) {
        throw classifyModelError(err, context())
      }
      // A signal that fires after the last chunk was read: the caller must still learn the call was cut short.
      if (signal.aborted) throw classifyModelError(signal.reason, context())
      yield* answer.end(complete)
    },
    async close() {
      await dispatcher.close()
    }
  }
}

/** What one model call has answered so far: its tool calls, finish reason and usage, and its size against the bounds. */
class Answer {
  readonly #calls = new Map<number, { id: string; name: string; arguments: string }>()
  /** The index of the call each ID names. */
  readonly #indexOfId = new Map<string, number>()
  #lastIndex = 0
  #finishReason: string | null = null
  #usage: Usage | null = null
  /** A chunk with a choice has come: [DONE] then ends an answer, not a stream that never gave one. */
  #answered = false
  #chars = 0
  #chunks = 0

  /** The text and reasoning parts of one chunk; its tool-call fragments, finish reason and usage are kept for the end. */
  take(chunk: ChatCompletionChunk): ModelStreamPart[] {
    if (chunk.usage) this.#usage = toUsage(chunk.usage)
    const choice = chunk.choices?.[0]
    if (!choice) return NO_PARTS
    this.#answered = true
    const delta = readDelta(choice)
    const size = delta.reasoning.length + delta.content.length + delta.toolCallsLength
    if (size > 0) {
      this.#chars += size
      if (++this.#chunks > MAX_ANSWER_CHUNKS || this.#chars > MAX_ANSWER_CHARS) throw answerTooLong(this.#chars, this.#chunks)
    }
    for (const fragment of delta.toolCalls) {
      // Without an index (some servers leave it out), a fragment continues the last call.
      let index = fragment.index ?? this.#lastIndex
      // A call sent again whole, with its ID, under another index is that call: LocalAI sends each
      // call a second time at the next index, and each ran (a write or a command twice). Another
      // call that shares its ID (a server that gives every call the request's) is still a call.
      const namedAt = fragment.id ? this.#indexOfId.get(fragment.id) : undefined
      const named = namedAt === undefined ? undefined : this.#calls.get(namedAt)
      if (named && namedAt !== index && fragment.name === named.name && fragment.arguments === named.arguments) continue
      let call = this.#calls.get(index)
      if (fragment.id && call?.id && fragment.id !== call.id) {
        // An ID other than the one its call has starts the next call: servers without an index,
        // and Gemini's, which streams parallel calls whole, each at index 0 with its own ID.
        index = Math.max(...this.#calls.keys()) + 1
        call = undefined
      }
      if (call === undefined) {
        if (this.#calls.size === MAX_TOOL_CALLS) throw tooManyToolCalls()
        call = { id: '', name: '', arguments: '' }
      }
      if (fragment.id) {
        call.id = fragment.id
        this.#indexOfId.set(fragment.id, index)
      }
      // Some servers (Fireworks, MiniMax on NVIDIA NIM) send the whole name again in every
      // fragment of a call: the same name once more is that name, not the next part of it.
      if (fragment.name !== call.name) call.name += fragment.name
      call.arguments += fragment.arguments
      this.#calls.set(index, call)
      this.#lastIndex = index
    }
    if (delta.finishReason) this.#finishReason = delta.finishReason
    if (delta.reasoning) return delta.content ? [{ type: 'reasoning', delta: delta.reasoning }, { type: 'text', delta: delta.content }] : [{ type: 'reasoning', delta: delta.reasoning }]
    return delta.content ? [{ type: 'text', delta: delta.content }] : NO_PARTS
  }

  /**
   * The tool calls, in their order, and the finish. `complete`: the server ended the answer itself
   * ([DONE]), which stands for a finish_reason some servers leave out once they have answered; a
   * body that ends without either, or with [DONE] alone, was cut short: a NETWORK_ERROR (retried
   * before the first token).
   */
  *end(complete: boolean): Generator<ModelStreamPart> {
    const finishReason = this.#finishReason
    if (finishReason === null && !(complete && this.#answered)) {
      throw createModelError('NETWORK_ERROR', 'The model stream ended before its answer did: no finish_reason, and no [DONE] after a chunk.', {
        detail: { reason: 'stream_ended_early' }
      })
    }
    for (const [index, call] of [...this.#calls].sort(([a], [b]) => a - b)) {
      if (!call.name) throw createModelError('INVALID_RESPONSE', `The model streamed tool call ${index} without a name.`)
      yield { type: 'tool_call', id: call.id || `call_${index}`, name: call.name, arguments: call.arguments }
    }
    yield { type: 'finish', finishReason, usage: this.#usage }
  }
}

const NO_PARTS: ModelStreamPart[] = []

/**
 * A body without a single stream event, read as a whole completion (`{choices: [{message,
 * finish_reason}], usage}`) as a server that ignores `stream: true` answers: its message is taken
 * as one chunk's delta. Anything else is INVALID_RESPONSE quoting what the server sent.
 */
function completionAsChunk(text: string, chars: number, headers: Headers): ChatCompletionChunk {
  const notAnAnswer = () => createModelError('INVALID_RESPONSE',
    `The model server answered ${headers.get('content-type') ?? 'without a content type'}, neither an event stream nor a chat completion: ${text.trim().slice(0, 200)}`)
  if (chars > MAX_ANSWER_CHARS) throw answerTooLong(chars, 1)
  if (jsonDepth(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH) throw notAnAnswer()
  let completion: unknown
  try {
    completion = JSON.parse(text)
  } catch {
    throw notAnAnswer()
  }
  if (typeof completion !== 'object' || completion === null) throw notAnAnswer()
  const { error, choices, usage } = completion as { error?: object; choices?: unknown; usage?: ChatCompletionChunk['usage'] }
  if (error) throw new APIError(undefined, error, undefined, headers)
  if (!Array.isArray(choices)) throw notAnAnswer()
  const choice = choices[0] as { message?: unknown; finish_reason?: unknown } | undefined
  return {
    id: '', object: 'chat.completion.chunk', created: 0, model: '', usage: usage ?? null,
    choices: choice ? [{ index: 0, delta: wholeCalls(choice.message) as ChatCompletionChunk.Choice.Delta, finish_reason: choice.finish_reason as ChatCompletionChunk.Choice['finish_reason'] }] : []
  }
}

/**
 * A whole message with each tool call given its place as its index: each is a whole call, while
 * stream fragments without an index or an ID continue the call before them, which joined the
 * calls of a server that gives neither into one ("fs_listfs_glob").
 */
function wholeCalls(message: unknown): unknown {
  if (typeof message !== 'object' || message === null) return message
  const calls = (message as { tool_calls?: unknown }).tool_calls
  if (!Array.isArray(calls)) return message
  return {
    ...message,
    tool_calls: calls.map((call: unknown, i) => (typeof call === 'object' && call !== null && (call as { index?: unknown }).index == null ? { ...call, index: i } : call))
  }
}

/**
 * One event's chunk. An error sent inside the stream (an `error` event, or a chunk with an `error`
 * object) is thrown as the SDK's APIError, as the SDK's own stream reader throws it.
 */
function parseChunk(event: ServerSentEvent, headers: Headers): ChatCompletionChunk {
  let chunk: (ChatCompletionChunk & { error?: unknown }) | null
  try {
    chunk = JSON.parse(event.data) as (ChatCompletionChunk & { error?: unknown }) | null
  } catch (err) {
    throw createModelError('INVALID_RESPONSE', `The model sent a stream event that is not JSON: ${(err as Error).message}`, { cause: err })
  }
  if (event.event === 'error') throw new APIError(undefined, (chunk?.error ?? chunk ?? undefined) as object | undefined, undefined, headers)
  if (chunk?.error) throw new APIError(undefined, chunk.error, undefined, headers)
  if (typeof chunk !== 'object' || chunk === null) {
    throw createModelError('INVALID_RESPONSE', `The model sent a stream event that is not a chunk object: ${event.data.slice(0, 200)}`)
  }
  return chunk
}

/**
 * The usage a chunk reports. A count that is not a whole number of zero or more (a string, a
 * negative number, null) is taken as absent: accounting is not worth failing an answer for, and
 * a count stored as "10" would be summed as text and break every later read of the run.
 */
function toUsage(u: unknown): Usage {
  const { prompt_tokens, completion_tokens, total_tokens } = (typeof u === 'object' && u !== null ? u : {}) as Record<string, unknown>
  const inputTokens = tokenCount(prompt_tokens) ?? 0
  const outputTokens = tokenCount(completion_tokens) ?? 0
  return { inputTokens, outputTokens, totalTokens: tokenCount(total_tokens) ?? inputTokens + outputTokens }
}

function tokenCount(value: unknown): number | null {
  return Number.isSafeInteger(value) && (value as number) >= 0 ? value as number : null
}

/** One delta's parts, checked: every field agentd reads has the type the API gives it. */
interface Delta {
  content: string
  reasoning: string
  toolCalls: Array<{ index: number | undefined; id: string; name: string; arguments: string }>
  /** Characters of the tool calls' names and arguments, counted toward the answer's limit. */
  toolCallsLength: number
  finishReason: string | null
}

/**
 * The delta of a chunk's first choice. A missing or null delta (a final chunk that carries only
 * its finish_reason) is empty; a field of the wrong type (text that is an object, tool calls that
 * are not a list) is a server that does not speak the API: INVALID_RESPONSE, naming the field.
 */
function readDelta(choice: ChatCompletionChunk.Choice): Delta {
  const raw: Record<string, unknown> = typeof choice.delta === 'object' && choice.delta !== null ? choice.delta as unknown as Record<string, unknown> : {}
  // reasoning_content (DeepSeek, vLLM) and reasoning (Ollama, OpenRouter) are not in the SDK's types.
  const reasoning = raw['reasoning_content'] ?? raw['reasoning']
  const chunks = Array.isArray(raw['content']) ? contentChunks(raw['content'] as unknown[]) : null
  const delta: Delta = {
    // A refusal (OpenAI's `refusal`, sent with content null) is what the model answered: it is read as its text.
    content: (chunks ? chunks.text : stringField(raw['content'], 'delta.content')) + stringField(raw['refusal'], 'delta.refusal'),
    reasoning: stringField(reasoning, raw['reasoning_content'] == null ? 'delta.reasoning' : 'delta.reasoning_content') + (chunks?.thinking ?? ''),
    toolCalls: [],
    toolCallsLength: 0,
    finishReason: choice.finish_reason == null ? null : stringField(choice.finish_reason, 'finish_reason')
  }
  const toolCalls = raw['tool_calls']
  if (toolCalls == null) return delta
  if (!Array.isArray(toolCalls)) throw wrongType('delta.tool_calls', 'a list', toolCalls)
  for (const [i, fragment] of (toolCalls as unknown[]).entries()) {
    if (typeof fragment !== 'object' || fragment === null) throw wrongType(`delta.tool_calls[${i}]`, 'an object', fragment)
    const { index, id } = fragment as Record<string, unknown>
    const fn = (fragment as Record<string, unknown>)['function'] ?? {}
    if (typeof fn !== 'object' || fn === null) throw wrongType(`delta.tool_calls[${i}].function`, 'an object', fn)
    if (index != null && !Number.isSafeInteger(index)) throw wrongType(`delta.tool_calls[${i}].index`, 'a whole number', index)
    const name = stringField((fn as Record<string, unknown>)['name'], `delta.tool_calls[${i}].function.name`)
    const args = stringField((fn as Record<string, unknown>)['arguments'], `delta.tool_calls[${i}].function.arguments`)
    delta.toolCalls.push({ index: index == null ? undefined : index as number, id: stringField(id, `delta.tool_calls[${i}].id`), name, arguments: args })
    delta.toolCallsLength += name.length + args.length
  }
  return delta
}

/**
 * Content sent as a list of chunks, as Mistral's reasoning models (magistral-*) send it:
 * `{type: 'text', text}` is the answer's text, `{type: 'thinking', thinking: [{type: 'text', text}]}`
 * its reasoning. A chunk of another form is INVALID_RESPONSE naming it.
 */
function contentChunks(list: unknown[]): { text: string; thinking: string } {
  let text = ''
  let thinking = ''
  for (const [i, chunk] of list.entries()) {
    const { type } = (typeof chunk === 'object' && chunk !== null ? chunk : {}) as Record<string, unknown>
    if (type === 'text') {
      text += stringField((chunk as Record<string, unknown>)['text'], `delta.content[${i}].text`)
    } else if (type === 'thinking') {
      const parts = (chunk as Record<string, unknown>)['thinking']
      if (typeof parts === 'string') thinking += parts
      else if (Array.isArray(parts)) thinking += contentChunks(parts).text
      else if (parts != null) throw wrongType(`delta.content[${i}].thinking`, 'a list or a string', parts)
    } else {
      throw wrongType(`delta.content[${i}]`, 'a text or thinking chunk', chunk)
    }
  }
  return { text, thinking }
}

/** A string field of a delta; absent or null is ''. */
function stringField(value: unknown, field: string): string {
  if (value == null) return ''
  if (typeof value !== 'string') throw wrongType(field, 'a string', value)
  return value
}

function wrongType(field: string, expected: string, value: unknown): ModelError {
  const got = Array.isArray(value) ? 'a list' : value === null ? 'null' : typeof value === 'object' ? 'an object' : `${typeof value} ${String(value).slice(0, 40)}`
  return createModelError('INVALID_RESPONSE', `The model sent a stream chunk whose ${field} is ${got}, not ${expected}: the server does not follow the Chat Completions API.`)
}

const MAX_REMEMBERED_MODELS = 1000

/** Adds a model to a set of those found to need an adaptation: names come from sessions, so the memory is bounded. */
function remember(models: Set<string>, model: string): void {
  if (models.size >= MAX_REMEMBERED_MODELS) models.clear()
  models.add(model)
}

/**
 * The error body of a refusal with one of `statuses` (the server refused the request as sent),
 * as text to look for what it refused in; null for any other failure.
 */
function refusalText(err: unknown, statuses: readonly number[] = [400]): string | null {
  return err instanceof APIError && err.status !== undefined && statuses.includes(err.status) ? JSON.stringify(err.error ?? err.message ?? '') : null
}
/** The refusals a call adapts to (stream_options, a user message after tool results, max_tokens, reasoning). */
const ADAPTATIONS = 4

/** DeepSeek's 400 for an assistant message with tool calls sent without its reasoning_content. */
function refusesWithoutReasoning(err: unknown): boolean {
  return refusalText(err)?.includes('reasoning_content') ?? false
}

/**
 * The request with each assistant message carrying its reasoning as reasoning_content: the run's
 * own (REASONING), else '' for an answer read back from the store, which does not keep it.
 */
function withReasoningBack(request: ModelRequest): ModelRequest {
  return {
    ...request,
    messages: request.messages.map((m) => (m.role === 'assistant'
      ? { ...m, reasoning_content: (m as { [REASONING]?: string })[REASONING] ?? '' } as ModelRequest['messages'][number]
      : m))
  }
}

/** OpenAI's 400 for max_tokens sent to a model that takes only max_completion_tokens. */
function refusesMaxTokens(err: unknown): boolean {
  const text = refusalText(err)
  return text !== null && ((err as APIError).param === 'max_tokens' || text.includes('max_completion_tokens'))
}

/** Mistral's 400 for a user message right after a tool message. */
function refusesUserAfterTool(err: unknown): boolean {
  return /unexpected role '?user'? after role '?tool'?/i.test(refusalText(err) ?? '')
}

/**
 * The request with an assistant turn between each tool message and a user message right after
 * it, on the wire only (the stored conversation stays as it is). Its words are true, and the
 * model reads them as its own.
 */
function withToolTurnsBridged(request: ModelRequest): ModelRequest {
  const { messages } = request
  if (!messages.some((m, i) => m.role === 'user' && messages[i - 1]?.role === 'tool')) return request
  const bridged: ModelRequest['messages'] = []
  for (const [i, message] of messages.entries()) {
    if (message.role === 'user' && messages[i - 1]?.role === 'tool') bridged.push({ role: 'assistant', content: TOOL_TURN_BRIDGE })
    bridged.push(message)
  }
  return { ...request, messages: bridged }
}

const TOOL_TURN_BRIDGE = '(The run ended after these tool results, before I answered them.)'

/** A 400 or 422 whose error names stream_options: a server that does not take the field. */
function refusesStreamOptions(err: unknown): boolean {
  return refusalText(err, [400, 422])?.includes('stream_options') ?? false
}

function isTimeoutReason(reason: unknown): boolean {
  return typeof reason === 'object' && reason !== null && (reason as { name?: unknown }).name === 'TimeoutError'
}

function onlyPings(timeoutMs: number): ModelError {
  return createModelError('TIMEOUT', `The model stream sent no event for ${timeoutMs / 1000} s, only keep-alive comments: the model stopped answering.`)
}

function answerTooLong(chars: number, chunks: number): ModelError {
  return createModelError('INVALID_RESPONSE',
    `The model's answer went past ${chunks > MAX_ANSWER_CHUNKS ? `${MAX_ANSWER_CHUNKS} chunks` : `${MAX_ANSWER_CHARS / 1024 / 1024} Mi characters`} ` +
    `(${chars} characters in ${chunks} chunks) without finishing: the server does not stop at its output limit`)
}

/**
 * An answer that asks for more tool calls than one answer may (MAX_TOOL_CALLS). The server spoke
 * the API; the model asked for too much at once (or repeated a call in a generation loop), so the
 * advice is about the request, not the catalogue's about the streaming format. None of the calls
 * is run; the call fails as soon as the one past the limit starts, so the total is not known.
 */
function tooManyToolCalls(): ModelError {
  return createModelError('INVALID_RESPONSE',
    `The model asked for more than ${MAX_TOOL_CALLS} tool calls in one answer (a call number ${MAX_TOOL_CALLS + 1} began); ` +
    `agentd accepts at most ${MAX_TOOL_CALLS} per answer, so none of them was run`, {
      errorType: 'logical',
      detail: { reason: 'too_many_tool_calls', maxToolCalls: MAX_TOOL_CALLS },
      recommendations: [
        `Ask for the work in smaller batches: tell the model (in the message or the session's instructions) to make at most ${MAX_TOOL_CALLS} tool calls in one answer and to go on in the next step.`,
        'If the model repeated one call over and over (a generation loop), send the message again, or use another model or a lower temperature.',
        `The limit of ${MAX_TOOL_CALLS} calls per answer is fixed in agentd (MAX_TOOL_CALLS); the model server is not at fault, and neither is its configuration.`
      ]
    })
}
