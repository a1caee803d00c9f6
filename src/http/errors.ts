import { STATUS_CODES } from 'node:http'
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { AgentError } from '../agent/agent-error.ts'
import type { ErrorEnvelope } from '../schemas/common.ts'
import { storeUnavailable } from '../store/store.ts'

/**
 * The catalogue of HTTP error codes (SPEC 5.2): each code's status, default message and
 * whether retrying the same request later can succeed. Callers throw `apiError(code)`;
 * clients branch on `code`, never on the message.
 */
export const API_ERRORS = {
  VALIDATION_ERROR: { status: 400, retryable: false, message: 'The request does not match the schema' },
  INVALID_JSON: { status: 400, retryable: false, message: 'The request body is not valid JSON' },
  UNAUTHORIZED: { status: 401, retryable: false, message: 'A valid API key is required (Authorization: Bearer <key>)' },
  SESSION_NOT_FOUND: { status: 404, retryable: false, message: 'No such session' },
  RUN_NOT_FOUND: { status: 404, retryable: false, message: 'No such run in this session' },
  ROUTE_NOT_FOUND: { status: 404, retryable: false, message: 'No such route' },
  SESSION_BUSY: { status: 409, retryable: true, message: 'The session has an active run' },
  NOT_AWAITING: { status: 409, retryable: false, message: 'That call is not waiting for this decision or result' },
  NO_ACTIVE_RUN: { status: 409, retryable: false, message: 'The session has no active run' },
  IDEMPOTENCY_IN_PROGRESS: { status: 409, retryable: true, message: 'A request with this Idempotency-Key is still being processed' },
  REQUEST_TIMEOUT: { status: 408, retryable: true, message: 'The request was not received in time' },
  PAYLOAD_TOO_LARGE: { status: 413, retryable: false, message: 'The request body is too large' },
  UNSUPPORTED_MEDIA_TYPE: { status: 415, retryable: false, message: 'Send the body as application/json' },
  IDEMPOTENCY_KEY_REUSED: { status: 422, retryable: false, message: 'This Idempotency-Key was used with a different request' },
  HEADERS_TOO_LARGE: { status: 431, retryable: false, message: 'The request headers are too large' },
  LIMIT_EXCEEDED: { status: 429, retryable: true, message: 'A limit of this tenant was reached' },
  RATE_LIMITED: { status: 429, retryable: true, message: 'Too many requests' },
  INTERNAL: { status: 500, retryable: true, message: 'Internal error' },
  UNAVAILABLE: { status: 503, retryable: true, message: 'The service is unavailable' }
} as const satisfies Record<string, { status: number; retryable: boolean; message: string }>

export type ApiErrorCode = keyof typeof API_ERRORS

/** An error that becomes the envelope of its catalogue entry. */
export class ApiError extends Error {
  readonly code: ApiErrorCode
  readonly statusCode: number
  readonly details: Record<string, unknown> | undefined
  readonly headers: Record<string, string>

  constructor(code: ApiErrorCode, message?: string, details?: Record<string, unknown>, headers: Record<string, string> = {}) {
    super(message ?? API_ERRORS[code].message)
    this.name = 'ApiError'
    this.code = code
    this.statusCode = API_ERRORS[code].status
    this.details = details
    this.headers = headers
  }
}

/** One failing field of a request, as `details.fields` of a VALIDATION_ERROR lists it. */
export interface FieldProblem {
  /** Where: `body.limits.maxSteps`, `querystring.cursor`, `headers.idempotency-key` … */
  field: string
  message: string
  /** The rule that failed (JSON Schema keyword, or the service's own: `maximum`, `tools` …). */
  keyword: string
}

/**
 * The most failing fields a VALIDATION_ERROR lists. A body of a few hundred kilobytes can fail on
 * every item of a long array, several times each: listed in full, 100 kB of input made a 20 MB
 * answer that took seconds of the event loop to build and send.
 */
const MAX_REPORTED_FIELDS = 50

/** A 400 VALIDATION_ERROR listing each failing field (the first MAX_REPORTED_FIELDS); the message names them unless given. */
export function validationError(fields: FieldProblem[], message?: string): ApiError {
  const shown = fields.slice(0, MAX_REPORTED_FIELDS)
  const more = fields.length - shown.length
  const named = `${shown.map((f) => `${f.field} ${f.message}`).join('; ')}${more > 0 ? `; and ${more} more` : ''}`
  return new ApiError('VALIDATION_ERROR', message ?? `Invalid request: ${named}`, { fields: shown, ...(more > 0 ? { moreFields: more } : {}) })
}

/**
 * The 400 for a resume point (`field`: Last-Event-ID or ?after) beyond the session's last event.
 * Events are numbered without gaps and stored before anyone sees them, so no client can have
 * seen that seq: resuming from it would silently skip the next events up to it.
 */
export function resumeBeyondLastEvent(field: string, after: number, lastSeq: number): ApiError {
  return new ApiError('VALIDATION_ERROR', `${field} ${after} is beyond the session's last event (${lastSeq}); resume from at most ${lastSeq}`, {
    fields: [{ field, message: `must be at most the session's lastSeq (${lastSeq})`, keyword: 'maximum' }],
    lastSeq
  })
}

/** Shorthand for `new ApiError(...)`. */
export const apiError = (code: ApiErrorCode, message?: string, details?: Record<string, unknown>) =>
  new ApiError(code, message, details)

/** Builds the SPEC 5.2 envelope. */
export function envelope(code: ApiErrorCode, message: string, requestId: string, details?: Record<string, unknown>): ErrorEnvelope {
  const body: ErrorEnvelope = {
    error: { code, message, retryable: API_ERRORS[code].retryable, requestId, timestamp: new Date().toISOString() }
  }
  if (details) body.error.details = details
  return body
}

/**
 * An error answer to write straight on a socket, for the answers given where Fastify has no reply to
 * send it with (a request Node could not read, a body too slow): the same envelope, its request ID in
 * X-Request-Id, and the connection closed after it. `headers` adds others (the security headers).
 */
export function rawErrorAnswer(error: ApiError, requestId: string, headers: Record<string, string> = {}): string {
  const body = JSON.stringify(envelope(error.code, error.message, requestId, error.details))
  const lines = [
    `HTTP/1.1 ${error.statusCode} ${STATUS_CODES[error.statusCode] ?? 'Error'}`,
    'Content-Type: application/json; charset=utf-8',
    `Content-Length: ${Buffer.byteLength(body)}`,
    `X-Request-Id: ${requestId}`,
    'Connection: close',
    ...Object.entries({ ...error.headers, ...headers }).map(([name, value]) => `${name}: ${value}`)
  ]
  return `${lines.join('\r\n')}\r\n\r\n${body}`
}

/** Fastify's own error codes, by what they mean to a client. */
const FASTIFY_CODES: Record<string, ApiErrorCode> = {
  FST_ERR_CTP_INVALID_MEDIA_TYPE: 'UNSUPPORTED_MEDIA_TYPE',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'VALIDATION_ERROR',
  FST_ERR_CTP_BODY_TOO_LARGE: 'PAYLOAD_TOO_LARGE',
  FST_ERR_CTP_INVALID_JSON_BODY: 'INVALID_JSON',
  FST_ERR_CTP_EMPTY_TYPE: 'UNSUPPORTED_MEDIA_TYPE',
  FST_ERR_CTP_INVALID_TYPE: 'UNSUPPORTED_MEDIA_TYPE',
  FST_ERR_VALIDATION: 'VALIDATION_ERROR'
}

function toApiError(err: FastifyError): ApiError {
  if (err instanceof ApiError) return err
  if (err instanceof AgentError) return new ApiError(err.code, err.message, err.details)
  if (err.validation) {
    const fields = err.validation.map((issue) => {
      const params = issue.params as { missingProperty?: string; additionalProperty?: string; allowedValues?: unknown[] }
      // ajv reports a missing or an unknown property at its parent; the field is the property itself
      // (a typo such as `modle` must be named, not "body must NOT have additional properties").
      const unknown = issue.keyword === 'additionalProperties' ? params.additionalProperty : undefined
      const property = issue.keyword === 'required' ? params.missingProperty : unknown
      const path = `${err.validationContext ?? 'body'}${issue.instancePath}${property === undefined ? '' : `/${property}`}`.replace(/\//g, '.')
      // ajv's enum message ("must be equal to one of the allowed values") does not say which ones.
      const allowed = issue.keyword === 'enum' ? params.allowedValues : undefined
      const message = allowed ? `must be one of: ${allowed.join(', ')}` : unknown !== undefined ? 'is not a known field' : (issue.message ?? 'is invalid')
      return { field: path, message, keyword: issue.keyword }
    })
    return validationError(fields)
  }
  // The store was closed under a request (shutdown), cannot be reached or cannot write: retry
  // elsewhere or later. Not the request's fault, and not a bug of agentd's either. An error Fastify
  // gives a 4xx is the request's own: a client that left mid-body is an ECONNRESET too, not the store's.
  const clientError = typeof err.statusCode === 'number' && err.statusCode < 500
  const unavailable = clientError ? null : storeUnavailable(err)
  if (unavailable) {
    return new ApiError('UNAVAILABLE', unavailable === 'unreachable' ? 'The store is unreachable' : 'The store cannot write now', undefined,
      { 'retry-after': '1' })
  }
  const mapped = err.code ? FASTIFY_CODES[err.code] : undefined
  if (mapped) return new ApiError(mapped, mapped === 'VALIDATION_ERROR' ? err.message : undefined)
  // secure-json-parse and JSON.parse report bad bodies as SyntaxError (prototype keys are refused before, in security.ts).
  if (err instanceof SyntaxError && err.statusCode === 400) return new ApiError('INVALID_JSON', `The request body is not valid JSON: ${err.message}`)
  if (err.statusCode === 429) return new ApiError('RATE_LIMITED', err.message)
  if (err.statusCode === 503) return new ApiError('UNAVAILABLE', err.message)
  if (err.statusCode && err.statusCode >= 400 && err.statusCode < 500) {
    return new ApiError(err.statusCode === 413 ? 'PAYLOAD_TOO_LARGE' : err.statusCode === 415 ? 'UNSUPPORTED_MEDIA_TYPE' : 'VALIDATION_ERROR', err.message)
  }
  return new ApiError('INTERNAL')
}

/** Seconds a 429 or 503 asks the client to wait when what refused it did not say (a limit that frees as runs and streams end). */
const DEFAULT_RETRY_AFTER_S = '5'

/** Sends the envelope; used by the error handler and by code that answers outside it (SSE, hooks). */
export function sendApiError(reply: FastifyReply, error: ApiError): FastifyReply {
  for (const [name, value] of Object.entries(error.headers)) reply.header(name, value)
  // Every 429 and 503 says when to come back (README, OpenAPI); LIMIT_EXCEEDED and some 503s did not.
  if ((error.statusCode === 429 || error.statusCode === 503) && !reply.hasHeader('retry-after')) reply.header('retry-after', DEFAULT_RETRY_AFTER_S)
  return reply
    .status(error.statusCode)
    .type('application/json; charset=utf-8')
    .send(envelope(error.code, error.message, reply.request.id, error.details))
}

/** Turns every error and unknown route into the SPEC 5.2 envelope. */
export const errorEnvelopePlugin = fp(
  async (app: FastifyInstance) => {
    app.setErrorHandler((err: FastifyError, request: FastifyRequest, reply: FastifyReply) => {
      const error = toApiError(err)
      if (error.statusCode >= 500 && error.code === 'INTERNAL') request.log.error({ err }, 'unhandled error')
      else if (error.code === 'UNAVAILABLE' && err !== error) request.log.warn({ err }, error.message)
      else request.log.info({ code: error.code, statusCode: error.statusCode, message: error.message }, 'request failed')
      // Rate limiting and others set their own headers (Retry-After) before throwing.
      return sendApiError(reply, error)
    })
    app.setNotFoundHandler((request, reply) =>
      sendApiError(reply, new ApiError('ROUTE_NOT_FOUND', `No route ${request.method} ${request.url.split('?')[0]}`))
    )
  },
  { name: 'agentd-error-envelope' }
)
