import OpenAI from 'openai'
import type { ChatCompletionChunk, ChatCompletionCreateParamsStreaming } from 'openai/resources/chat/completions'
import { Agent, fetch as undiciFetch } from 'undici'
import type { Usage } from '../schemas/common.ts'
import { classifyModelError, createModelError } from './model-errors.ts'
import type { ModelCallOptions, ModelProvider, ModelRequest, ModelStreamPart } from './types.ts'

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

const defaults = { connectTimeoutMs: 10_000, headersTimeoutMs: 120_000, bodyTimeoutMs: 300_000 }

/** A ModelProvider over the openai SDK: SDK retries off (the run owns retries, SPEC 5.1), undici owns the timeouts. */
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
  const client = new OpenAI({
    // Servers such as Ollama or vLLM need no key, but the SDK insists on one; a wrong key still surfaces as a 401.
    apiKey: opts.apiKey ?? 'no-key',
    baseURL: opts.baseURL ?? 'https://api.openai.com/v1',
    maxRetries: 0,
    // The SDK's own deadline only guards the wait for headers; it sits behind undici's so that undici's more precise error wins.
    timeout: connectTimeoutMs + headersTimeoutMs + 1000,
    fetch: undiciFetch as unknown as typeof globalThis.fetch,
    fetchOptions: { dispatcher },
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
      const params: ChatCompletionCreateParamsStreaming = {
        model: request.model,
        messages: request.messages,
        stream: true,
        stream_options: { include_usage: true }
      }
      if (request.tools && request.tools.length > 0) params.tools = request.tools
      // max_tokens rather than max_completion_tokens: every OpenAI-compatible server (Ollama, vLLM, llama.cpp) reads it.
      if (request.maxTokens !== undefined) params.max_tokens = request.maxTokens

      const calls = new Map<number, { id: string; name: string; arguments: string }>()
      let finishReason: string | null = null
      let usage: Usage | null = null
      try {
        const headers = { 'X-Request-Id': options.requestId, ...(options.traceparent ? { traceparent: options.traceparent } : {}) }
        const chunks = await client.chat.completions.create(params, { signal, headers })
        for await (const chunk of chunks) {
          if (chunk.usage) usage = toUsage(chunk.usage)
          const choice = chunk.choices[0]
          if (!choice) continue
          // reasoning_content (DeepSeek, vLLM) and reasoning (Ollama, OpenRouter) are not in the SDK's types.
          const delta = choice.delta as ChatCompletionChunk.Choice.Delta & { reasoning_content?: string | null; reasoning?: string | null }
          const reasoning = delta.reasoning_content ?? delta.reasoning
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
      } catch (err) {
        throw classifyModelError(err, context())
      }
      // The SDK ends a stream quietly when its signal fires; the caller must still learn it was cut short.
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

function toUsage(u: { prompt_tokens?: number; completion_tokens?: number; total_tokens?: number }): Usage {
  const inputTokens = u.prompt_tokens ?? 0
  const outputTokens = u.completion_tokens ?? 0
  return { inputTokens, outputTokens, totalTokens: u.total_tokens ?? inputTokens + outputTokens }
}

function isTimeoutReason(reason: unknown): boolean {
  return typeof reason === 'object' && reason !== null && (reason as { name?: unknown }).name === 'TimeoutError'
}
