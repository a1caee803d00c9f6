import type { ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions'
import type { ClassifiedError, Usage } from '../schemas/common.ts'

/**
 * The reasoning a model wrote with an assistant message, kept beside it under this key: JSON
 * skips symbol keys, so it is sent (as reasoning_content) only to a server that asks for it back.
 */
export const REASONING = Symbol('agentd.reasoning')

/** One model call: the whole conversation so far and the tools the model may call. */
export interface ModelRequest {
  model: string
  messages: ChatCompletionMessageParam[]
  tools?: ChatCompletionTool[]
  maxTokens?: number
}

export interface ModelCallOptions {
  signal: AbortSignal
  /** Sent upstream as X-Request-Id (SPEC 6). */
  requestId: string
  /** The model call's W3C trace context, sent upstream beside X-Request-Id when tracing is on. */
  traceparent?: string | undefined
}

/** What a streaming model call yields, already normalised from the provider's chunks. */
export type ModelStreamPart =
  | { type: 'text'; delta: string }
  | { type: 'reasoning'; delta: string }
  /** A tool call, complete (id, name and the whole arguments string), yielded once the stream has finished it. */
  | { type: 'tool_call'; id: string; name: string; arguments: string }
  | { type: 'finish'; finishReason: string | null; usage: Usage | null }

/** An OpenAI-compatible Chat Completions endpoint. Errors are thrown as ModelError. */
export interface ModelProvider {
  /** 'openai' for a configured provider, 'dev' for the built-in dev model. */
  readonly kind: 'openai' | 'dev'
  stream(request: ModelRequest, options: ModelCallOptions): AsyncIterable<ModelStreamPart>
  close(): Promise<void>
}

/** A failed model call, classified per SPEC 5.1; `cause` keeps the original error. */
export class ModelError extends Error {
  readonly classified: ClassifiedError
  readonly status: number | null
  /** Delay the provider asked for (Retry-After / retry-after-ms), if any. */
  readonly retryAfterMs: number | null

  constructor(classified: ClassifiedError, options: { status?: number | null; retryAfterMs?: number | null; cause?: unknown } = {}) {
    super(classified.message, { cause: options.cause })
    this.name = 'ModelError'
    this.classified = classified
    this.status = options.status ?? null
    this.retryAfterMs = options.retryAfterMs ?? null
  }
}
