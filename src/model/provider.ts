import OpenAI, { APIError } from 'openai'
import type { ChatCompletionChunk } from 'openai/resources/chat/completions'
import { Agent } from 'undici'
import { setImmediate as nextTurn } from 'node:timers/promises'
import type { Usage } from '../schemas/common.ts'
import { classifyModelError, createModelError } from './model-errors.ts'
import { createDispatcherFetch } from './dispatcher-fetch.ts'
import { chatRequestJson } from './request-json.ts'
import { ServerSentEventDecoder, type ServerSentEvent } from './sse.ts'
import type { ModelCallOptions, ModelError, ModelProvider, ModelRequest, ModelStreamPart } from './types.ts'

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
      // The request's JSON is made here (request-json.ts) and handed to the SDK as it is sent.
      const body = chatRequestJson(request)

      const calls = new Map<number, { id: string; name: string; arguments: string }>()
      let finishReason: string | null = null
      let usage: Usage | null = null
      try {
        const headers = {
          // A string body with its content type is sent by the SDK as it is (its own JSON encoding is skipped).
          'Content-Type': 'application/json',
          'X-Request-Id': options.requestId,
          ...(options.traceparent ? { traceparent: options.traceparent } : {})
        }
        // The SDK sends the request (its headers, auth, base URL) and throws its APIError classes for an error status; the stream is read here.
        const response = await client.post('/chat/completions', { body, stream: true, headers, fetchOptions: http.withSignal(signal) }).asResponse()
        const reader = http.takeBody(response)
        const decoder = new ServerSentEventDecoder()
        let answerChars = 0
        let answerChunks = 0
        let finished = false
        let sinceTurn = 0
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
            for (const event of events) {
              if (event.data === '[DONE]') break reading
              const chunk = parseChunk(event, response.headers)
              if (chunk.usage) usage = toUsage(chunk.usage)
              const choice = chunk.choices?.[0]
              if (!choice) continue
              // reasoning_content (DeepSeek, vLLM) and reasoning (Ollama, OpenRouter) are not in the SDK's types.
              const delta = choice.delta as ChatCompletionChunk.Choice.Delta & { reasoning_content?: string | null; reasoning?: string | null }
              const reasoning = delta.reasoning_content ?? delta.reasoning
              const size = (reasoning?.length ?? 0) + (delta.content?.length ?? 0) + argumentsLength(delta.tool_calls)
              if (size > 0) {
                answerChars += size
                if (++answerChunks > MAX_ANSWER_CHUNKS || answerChars > MAX_ANSWER_CHARS) throw answerTooLong(answerChars, answerChunks)
              }
              if (reasoning) yield { type: 'reasoning', delta: reasoning }
              if (delta.content) yield { type: 'text', delta: delta.content }
              for (const fragment of delta.tool_calls ?? []) {
                const call = calls.get(fragment.index) ?? { id: '', name: '', arguments: '' }
                if (fragment.id) call.id = fragment.id
                if (fragment.function?.name) call.name += fragment.function.name
                if (fragment.function?.arguments) call.arguments += fragment.function.arguments
                calls.set(fragment.index, call)
              }
              if (choice.finish_reason) finishReason = choice.finish_reason
            }
            if (text === null) break
          }
          finished = true
        } finally {
          // After [DONE] the rest of the body is read and dropped, so that the connection is kept; on a failure or an early stop it is aborted.
          reader.close(finished)
        }
      } catch (err) {
        throw classifyModelError(err, context())
      }
      // A signal that fires after the last chunk was read: the caller must still learn the call was cut short.
      if (signal.aborted) throw classifyModelError(signal.reason, context())
      if (finishReason === null) {
        throw createModelError('INVALID_RESPONSE', 'The model stream ended without a finish_reason.')
      }
      for (const [index, call] of [...calls].sort(([a], [b]) => a - b)) {
        if (!call.name) throw createModelError('INVALID_RESPONSE', `The model streamed tool call ${index} without a name.`)
        yield { type: 'tool_call', id: call.id || `call_${index}`, name: call.name, arguments: call.arguments }
      }
      yield { type: 'finish', finishReason, usage }
    },
    async close() {
      await dispatcher.close()
    }
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

function toUsage(u: { prompt_tokens?: number; completion_tokens?: number; total_tokens?: number }): Usage {
  const inputTokens = u.prompt_tokens ?? 0
  const outputTokens = u.completion_tokens ?? 0
  return { inputTokens, outputTokens, totalTokens: u.total_tokens ?? inputTokens + outputTokens }
}

function isTimeoutReason(reason: unknown): boolean {
  return typeof reason === 'object' && reason !== null && (reason as { name?: unknown }).name === 'TimeoutError'
}

/** The characters of tool-call argument fragments in one delta. */
function argumentsLength(calls: ChatCompletionChunk.Choice.Delta['tool_calls']): number {
  let length = 0
  for (const call of calls ?? []) length += call.function?.arguments?.length ?? 0
  return length
}

function answerTooLong(chars: number, chunks: number): ModelError {
  return createModelError('INVALID_RESPONSE',
    `The model's answer went past ${chunks > MAX_ANSWER_CHUNKS ? `${MAX_ANSWER_CHUNKS} chunks` : `${MAX_ANSWER_CHARS / 1024 / 1024} Mi characters`} ` +
    `(${chars} characters in ${chunks} chunks) without finishing: the server does not stop at its output limit`)
}
