import {
  APIConnectionError,
  APIConnectionTimeoutError,
  APIError,
  APIUserAbortError
} from 'openai'
import { classified } from '../errors/classified.ts'
import { causeChain, errnoFamily, errnoOf, tlsFailureOf } from '../errors/errno.ts'
import type { ErrorType } from '../schemas/common.ts'
import { ModelError } from './types.ts'
import { StreamEventTooLarge } from './sse.ts'
import { retryAfterMs } from '../retry-after.ts'

/** The model codes of SPEC 5.1. */
export type ModelErrorCode =
  | 'PROVIDER_NOT_CONFIGURED'
  | 'AUTHENTICATION_ERROR'
  | 'PERMISSION_DENIED'
  | 'RATE_LIMITED'
  | 'MODEL_NOT_FOUND'
  | 'CONTEXT_LENGTH_EXCEEDED'
  | 'NETWORK_ERROR'
  | 'TIMEOUT'
  | 'SERVER_ERROR'
  | 'INVALID_RESPONSE'
  | 'UNKNOWN'

interface CatalogueEntry {
  errorType: ErrorType
  retryable: boolean
  recommendations: string[]
}

/** The one place that says what each model code means for the run (STYLE habit 4). */
export const modelErrorCatalogue: Readonly<Record<ModelErrorCode, CatalogueEntry>> = Object.freeze({
  PROVIDER_NOT_CONFIGURED: {
    errorType: 'runtime',
    retryable: false,
    recommendations: [
      'Set OPENAI_API_KEY (and OPENAI_BASE_URL for a server other than OpenAI), or unset both to use the built-in dev model.'
    ]
  },
  AUTHENTICATION_ERROR: {
    errorType: 'runtime',
    retryable: false,
    recommendations: [
      'Check OPENAI_API_KEY: the model provider rejected it.',
      'If OPENAI_BASE_URL points at another server, use a key issued by that server.'
    ]
  },
  PERMISSION_DENIED: {
    errorType: 'runtime',
    retryable: false,
    recommendations: [
      "Check that the API key's project and organization may use this model and endpoint.",
      'Pick a model the key has access to (the session model or AGENTD_MODEL).'
    ]
  },
  RATE_LIMITED: {
    errorType: 'runtime',
    retryable: true,
    recommendations: [
      'Wait and retry: the service retries with backoff and honours Retry-After.',
      "Lower the request rate or ask the provider for a higher limit."
    ]
  },
  MODEL_NOT_FOUND: {
    errorType: 'runtime',
    retryable: false,
    recommendations: [
      'Check the model name of the session (or AGENTD_MODEL); the provider does not serve it.',
      'Check that OPENAI_BASE_URL points at the server that hosts this model (a wrong path also answers 404).'
    ]
  },
  CONTEXT_LENGTH_EXCEEDED: {
    errorType: 'runtime',
    retryable: false,
    recommendations: [
      'Shorten the message, or fork the session from an earlier event (POST /v1/sessions/{id}/fork with atSeq), or use a model with a larger context window.',
      "Set the session's limits.contextTokens (or AGENTD_CONTEXT_TOKENS) below the model's context window: the history is then compacted to fit it."
    ]
  },
  NETWORK_ERROR: {
    errorType: 'runtime',
    retryable: true,
    recommendations: [
      'Check that OPENAI_BASE_URL is reachable from the service (DNS, firewall, proxy).',
      'The call is retried with backoff; if it keeps failing, check that the model server is up.'
    ]
  },
  TIMEOUT: {
    errorType: 'aborted',
    retryable: true,
    recommendations: [
      'The model did not answer in time; the call is retried with backoff.',
      'If the model is slow to start answering, raise the model connect/headers/body timeouts.'
    ]
  },
  SERVER_ERROR: {
    errorType: 'runtime',
    retryable: true,
    recommendations: [
      'The model provider failed; the call is retried with backoff.',
      "If it persists, check the provider's status page."
    ]
  },
  INVALID_RESPONSE: {
    errorType: 'runtime',
    retryable: false,
    recommendations: [
      'The server did not answer in the OpenAI Chat Completions streaming format; check OPENAI_BASE_URL and that the server supports stream: true.'
    ]
  },
  UNKNOWN: {
    errorType: 'exception',
    retryable: false,
    recommendations: ['See detail and the service log lines with the same request id.']
  }
})

const interruptRecommendations = ['The run was interrupted; post a new message to continue.']

export interface CreateModelErrorOptions {
  status?: number | null
  retryAfterMs?: number | null
  cause?: unknown
  detail?: Record<string, unknown>
  /** Overrides the catalogue's errorType (an unmapped HTTP answer is 'runtime', an interrupt 'aborted'). */
  errorType?: ErrorType
  /** Overrides the catalogue's retryable (e.g. a 429 for an exhausted quota). */
  retryable?: boolean
  recommendations?: string[]
}

/** Builds a ModelError from the catalogue; `fatal` starts as `!retryable`, the retry loop sets it once retries run out. */
export function createModelError(code: ModelErrorCode, message: string, options: CreateModelErrorOptions = {}): ModelError {
  const entry = modelErrorCatalogue[code]
  const retryable = options.retryable ?? entry.retryable
  const error = classified({
    errorType: options.errorType ?? entry.errorType,
    code,
    message,
    retryable,
    fatal: !retryable,
    recommendations: [...(options.recommendations ?? entry.recommendations)],
    detail: options.detail
  })
  return new ModelError(error, {
    status: options.status ?? null,
    retryAfterMs: options.retryAfterMs ?? null,
    cause: options.cause
  })
}

export interface ClassifyContext {
  /** The caller's signal fired (interrupt): whatever the error, it is reported as aborted. */
  aborted?: boolean
  /** The caller's own deadline fired: reported as TIMEOUT. */
  timedOut?: boolean
}

/** Maps anything a model call can throw (openai SDK errors, undici/network errors, aborts) to a ModelError. */
export function classifyModelError(err: unknown, ctx: ClassifyContext = {}): ModelError {
  if (err instanceof ModelError) return err
  if (ctx.timedOut || isNamed(err, 'TimeoutError')) {
    return createModelError('TIMEOUT', 'The model call timed out.', { cause: err })
  }
  // Before the APIError branch: APIUserAbortError is itself an APIError.
  if (ctx.aborted || err instanceof APIUserAbortError || isNamed(err, 'AbortError')) {
    return createModelError('UNKNOWN', 'The model call was interrupted.', {
      cause: err,
      errorType: 'aborted',
      recommendations: interruptRecommendations
    })
  }
  if (err instanceof APIConnectionTimeoutError) {
    return createModelError('TIMEOUT', 'The model call timed out.', { cause: err, detail: transportDetail(err) })
  }
  if (err instanceof APIConnectionError) {
    return classifyTransportError(err) ?? createModelError('NETWORK_ERROR', `Could not reach the model provider: ${causeMessage(err)}`, { cause: err })
  }
  if (err instanceof APIError) return classifyApiError(err)
  const transport = classifyTransportError(err)
  if (transport) return transport
  if (err instanceof StreamEventTooLarge) return createModelError('INVALID_RESPONSE', err.message, { cause: err })
  if (err instanceof SyntaxError) {
    return createModelError('INVALID_RESPONSE', `The model sent a response that could not be parsed: ${err.message}`, { cause: err })
  }
  const message = err instanceof Error ? err.message : String(err)
  return createModelError('UNKNOWN', `The model call failed unexpectedly: ${message}`, { cause: err })
}

function classifyApiError(err: APIError): ModelError {
  const status = err.status ?? null
  const body = errorBody(err)
  const providerCode = typeof err.code === 'string' ? err.code : null
  const providerType = typeof err.type === 'string' ? err.type : null
  // Quoted in the run's error, stored and sent in events: a proxy's whole error page is not.
  const providerMessage = clip(typeof body?.['message'] === 'string' ? body['message'] : err.message, MAX_PROVIDER_MESSAGE)
  const detail: Record<string, unknown> = { status, providerCode, providerType, providerMessage }
  if (err.requestID) detail['providerRequestId'] = err.requestID
  const retryAfterMs = err.headers ? parseRetryAfter(err.headers) : null
  const opts = { status, retryAfterMs, cause: err, detail }
  const what = status === null ? 'The model stream reported an error' : `The model provider answered ${status}`
  const message = `${what}: ${providerMessage}`

  // The error body's code names the failure more precisely than the status, whatever the status.
  // llama.cpp's server types an oversized prompt `exceed_context_size_error` (code 400).
  if (providerCode === 'context_length_exceeded' || providerType === 'context_length_exceeded' || providerType === 'exceed_context_size_error') {
    return createModelError('CONTEXT_LENGTH_EXCEEDED', message, opts)
  }
  if (providerCode === 'model_not_found' || providerCode === 'DeploymentNotFound') {
    return createModelError('MODEL_NOT_FOUND', message, opts)
  }
  if (providerCode === 'insufficient_quota' || providerType === 'insufficient_quota') {
    // Retrying cannot refill a quota, so this 429 is not retryable.
    return createModelError('RATE_LIMITED', message, {
      ...opts,
      retryable: false,
      recommendations: ["The account's quota is used up; check billing and usage limits with the provider."]
    })
  }

  // In a stream (or a 200 JSON body) there is no HTTP status; vLLM, LiteLLM and OpenRouter give it as the error's code.
  const httpStatus = status ?? statusInCode(err.code)
  if (httpStatus === null) return classifyStreamedError(providerCode, providerType, message, opts)
  return classifyStatus(httpStatus, providerMessage, message, opts)
}

function classifyStatus(status: number, providerMessage: string, message: string, opts: CreateModelErrorOptions): ModelError {
  if (status === 401) return createModelError('AUTHENTICATION_ERROR', message, opts)
  if (status === 403) return createModelError('PERMISSION_DENIED', message, opts)
  if (status === 404) return createModelError('MODEL_NOT_FOUND', message, opts)
  if (status === 408) return createModelError('TIMEOUT', message, opts)
  if (status === 413) return createModelError('CONTEXT_LENGTH_EXCEEDED', message, opts)
  if (status === 429) return createModelError('RATE_LIMITED', message, opts)
  if (status >= 500) return createModelError('SERVER_ERROR', message, opts)
  // vLLM, older llama.cpp ("exceeds the available context size") and others report an oversized prompt only in the message of a 400.
  if ((status === 400 || status === 422) && contextLengthMessage.test(providerMessage)) {
    return createModelError('CONTEXT_LENGTH_EXCEEDED', message, opts)
  }
  return createModelError('UNKNOWN', message, { ...opts, errorType: 'runtime' })
}

const MAX_PROVIDER_MESSAGE = 1024

function clip(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max)}…` : text
}

/** An error body's `code` that is an HTTP error status (500 or "429"); null for a word such as "rate_limit_exceeded". */
function statusInCode(code: unknown): number | null {
  const status = typeof code === 'number' ? code : typeof code === 'string' && /^\d{3}$/.test(code) ? Number(code) : NaN
  return Number.isInteger(status) && status >= 400 && status <= 599 ? status : null
}

/** How providers word an oversized prompt in a 400 or 422 (xAI: "maximum prompt length is"; TGI: "`inputs` tokens + `max_new_tokens` must be <= N"). */
const contextLengthMessage = /context (length|window|size)|maximum (context|prompt length)|too many tokens|prompt is too long|exceeds? the (model'?s )?(max|context)|max_new_tokens`? must be <=/i

/** An error event inside a stream has no status; its body's type is all there is. */
function classifyStreamedError(
  providerCode: string | null,
  providerType: string | null,
  message: string,
  opts: CreateModelErrorOptions
): ModelError {
  const kind = providerType ?? providerCode
  if (kind === 'rate_limit_exceeded' || kind === 'rate_limit_error' || kind === 'requests' || kind === 'tokens') {
    return createModelError('RATE_LIMITED', message, opts)
  }
  if (kind === 'server_error' || kind === 'api_error' || kind === 'overloaded_error' || kind === 'service_unavailable') {
    return createModelError('SERVER_ERROR', message, opts)
  }
  return createModelError('UNKNOWN', message, { ...opts, errorType: 'runtime' })
}

/** Finds an undici or socket error code anywhere in the cause chain (fetch wraps them in `TypeError: fetch failed` / `terminated`). */
function classifyTransportError(err: unknown): ModelError | null {
  // A certificate the service does not trust (self-signed, expired, another host's, an unknown
  // CA), https to a port that speaks plain HTTP, or a server that refuses the handshake as Node
  // makes it (errno.ts tlsFailureOf): no retry can fix it, so the run fails at once instead of
  // after its retries.
  const tls = tlsFailureOf(err)
  if (tls !== undefined) {
    return createModelError('NETWORK_ERROR', `The TLS handshake with the model provider failed (${tls}): ${causeMessage(err)}`, {
      cause: err,
      retryable: false,
      detail: { transportCode: tls, reason: 'tls_error' },
      recommendations: [
        'Check that OPENAI_BASE_URL names the host its certificate is for, with https only where the server speaks TLS, and that the server accepts the TLS versions and ciphers Node offers.',
        'A provider behind a private CA needs that CA in NODE_EXTRA_CA_CERTS (a PEM file) when agentd starts.',
        'Retrying cannot help until the certificate or the configuration changes.'
      ]
    })
  }
  for (const e of causeChain(err)) {
    const code = errnoOf(e)
    if (code === undefined) continue
    const family = errnoFamily(code)
    if (family === 'timeout') {
      return createModelError('TIMEOUT', `The model call timed out (${code}).`, { cause: err, detail: { transportCode: code } })
    }
    if (family === 'network') {
      return createModelError('NETWORK_ERROR', `The connection to the model provider failed (${code}): ${(e as Error).message}`, {
        cause: err,
        detail: { transportCode: code }
      })
    }
  }
  return null
}

function transportDetail(err: unknown): Record<string, unknown> | undefined {
  for (const e of causeChain(err)) {
    const code = errnoOf(e)
    if (code !== undefined) return { transportCode: code }
  }
  return undefined
}

function causeMessage(err: unknown): string {
  const chain = causeChain(err)
  const deepest = chain[chain.length - 1] as Error
  return deepest.message || (err as Error).message
}

function isNamed(err: unknown, name: string): boolean {
  return typeof err === 'object' && err !== null && (err as { name?: unknown }).name === name
}

function errorBody(err: APIError): Record<string, unknown> | null {
  return typeof err.error === 'object' && err.error !== null ? (err.error as Record<string, unknown>) : null
}

interface HeaderLookup {
  get(name: string): string | null
}

/** Reads `retry-after-ms` (OpenAI's) or `Retry-After` (seconds or an HTTP date) into milliseconds; null when absent or unusable. The retry policy caps it. */
export function parseRetryAfter(headers: HeaderLookup | Record<string, string | undefined>, now = Date.now()): number | null {
  // Not `instanceof Headers`: undici's fetch hands back its own Headers class, not the global one.
  const get = (name: string): string | null =>
    typeof headers.get === 'function' ? (headers as HeaderLookup).get(name) : ((headers as Record<string, string | undefined>)[name] ?? null)
  const ms = get('retry-after-ms')
  if (ms !== null && ms.trim() !== '') {
    const value = Number(ms)
    if (Number.isFinite(value) && value >= 0) return Math.round(value)
  }
  return retryAfterMs(get('retry-after'), now)
}
