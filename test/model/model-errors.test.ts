import t from 'tap'
import { APIConnectionError, APIConnectionTimeoutError, APIError, APIUserAbortError } from 'openai'
import { errors as undiciErrors } from 'undici'
import {
  classifyModelError,
  createModelError,
  modelErrorCatalogue,
  parseRetryAfter,
  type ModelErrorCode
} from '../../src/model/model-errors.ts'
import { ModelError } from '../../src/model/types.ts'

/** An SDK error exactly as the SDK builds one from an HTTP answer. */
function apiError(status: number, error: Record<string, unknown> | undefined, headers: Record<string, string> = {}) {
  return APIError.generate(status, error === undefined ? undefined : { error }, undefined, new Headers(headers))
}

t.test('every catalogue code builds a complete classified error, fatal exactly when not retryable', async (t) => {
  const expected: Record<ModelErrorCode, { errorType: string; retryable: boolean }> = {
    PROVIDER_NOT_CONFIGURED: { errorType: 'runtime', retryable: false },
    AUTHENTICATION_ERROR: { errorType: 'runtime', retryable: false },
    PERMISSION_DENIED: { errorType: 'runtime', retryable: false },
    RATE_LIMITED: { errorType: 'runtime', retryable: true },
    MODEL_NOT_FOUND: { errorType: 'runtime', retryable: false },
    CONTEXT_LENGTH_EXCEEDED: { errorType: 'runtime', retryable: false },
    NETWORK_ERROR: { errorType: 'runtime', retryable: true },
    TIMEOUT: { errorType: 'aborted', retryable: true },
    SERVER_ERROR: { errorType: 'runtime', retryable: true },
    INVALID_RESPONSE: { errorType: 'runtime', retryable: false },
    UNKNOWN: { errorType: 'exception', retryable: false }
  }
  t.same(Object.keys(modelErrorCatalogue).sort(), Object.keys(expected).sort(), 'the catalogue holds exactly the SPEC 5.1 model codes')
  for (const [code, want] of Object.entries(expected) as [ModelErrorCode, (typeof expected)[ModelErrorCode]][]) {
    const err = createModelError(code, `a ${code}`)
    t.ok(err instanceof ModelError)
    t.match(err.classified, { code, message: `a ${code}`, errorType: want.errorType, retryable: want.retryable, fatal: !want.retryable }, code)
    t.ok(err.classified.recommendations.length > 0 && err.classified.recommendations.every((r) => r.length > 10), `${code} has recommendations`)
  }
  t.match(modelErrorCatalogue.AUTHENTICATION_ERROR.recommendations, [/OPENAI_API_KEY/])
  t.match(modelErrorCatalogue.CONTEXT_LENGTH_EXCEEDED.recommendations, [/fork/])
})

t.test('HTTP answers map by status and error body', async (t) => {
  const cases: Array<[string, ReturnType<typeof apiError>, ModelErrorCode, string, boolean]> = [
    ['401', apiError(401, { message: 'bad key', type: 'invalid_request_error', code: 'invalid_api_key' }), 'AUTHENTICATION_ERROR', 'runtime', false],
    ['403', apiError(403, { message: 'no', type: 'permission_error' }), 'PERMISSION_DENIED', 'runtime', false],
    ['404 without a body (wrong base URL)', apiError(404, undefined), 'MODEL_NOT_FOUND', 'runtime', false],
    ['400 code model_not_found', apiError(400, { message: 'x', code: 'model_not_found' }), 'MODEL_NOT_FOUND', 'runtime', false],
    ['400 code context_length_exceeded', apiError(400, { message: 'x', code: 'context_length_exceeded' }), 'CONTEXT_LENGTH_EXCEEDED', 'runtime', false],
    [
      '400 vLLM-style context message',
      apiError(400, { message: "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.", type: 'BadRequestError' }),
      'CONTEXT_LENGTH_EXCEEDED',
      'runtime',
      false
    ],
    ['413', apiError(413, { message: 'too large' }), 'CONTEXT_LENGTH_EXCEEDED', 'runtime', false],
    ['400 anything else', apiError(400, { message: 'temperature must be <= 2', type: 'invalid_request_error' }), 'UNKNOWN', 'runtime', false],
    ['408', apiError(408, { message: 'timeout' }), 'TIMEOUT', 'aborted', true],
    ['429', apiError(429, { message: 'slow down', code: 'rate_limit_exceeded' }), 'RATE_LIMITED', 'runtime', true],
    ['429 insufficient_quota', apiError(429, { message: 'quota', type: 'insufficient_quota', code: 'insufficient_quota' }), 'RATE_LIMITED', 'runtime', false],
    ['500', apiError(500, { message: 'oops', type: 'server_error' }), 'SERVER_ERROR', 'runtime', true],
    ['502 without a body', apiError(502, undefined), 'SERVER_ERROR', 'runtime', true],
    ['an error event inside a stream', new APIError(undefined, { message: 'overloaded', type: 'server_error' }, undefined, undefined), 'SERVER_ERROR', 'runtime', true],
    ['an unknown error event inside a stream', new APIError(undefined, { message: '?', type: 'weird' }, undefined, undefined), 'UNKNOWN', 'runtime', false]
  ]
  for (const [name, err, code, errorType, retryable] of cases) {
    const classified = classifyModelError(err)
    t.match(classified.classified, { code, errorType, retryable, fatal: !retryable }, name)
    t.equal(classified.cause, err, `${name} keeps its cause`)
    t.equal(classified.status, err.status ?? null)
  }
  t.match(classifyModelError(apiError(429, { message: 'quota', code: 'insufficient_quota' })).classified.recommendations, [/quota/])
})

t.test('the provider message is kept in the message and detail', async (t) => {
  const err = classifyModelError(apiError(403, { message: 'Project lacks access', type: 'permission_error', code: 'no_access' }, { 'x-request-id': 'up-1' }))
  t.match(err.message, /403.*Project lacks access/)
  t.match(err.classified.detail, { status: 403, providerCode: 'no_access', providerType: 'permission_error', providerMessage: 'Project lacks access', providerRequestId: 'up-1' })
})

t.test('message keywords alone never decide the code', async (t) => {
  t.match(classifyModelError(new Error('context length exceeded')).classified, { code: 'UNKNOWN', errorType: 'exception' })
  t.match(classifyModelError(apiError(500, { message: 'maximum context length exceeded' })).classified, { code: 'SERVER_ERROR' })
})

t.test('Retry-After and retry-after-ms reach retryAfterMs', async (t) => {
  t.equal(classifyModelError(apiError(429, { message: 'x' }, { 'retry-after': '3' })).retryAfterMs, 3000)
  t.equal(classifyModelError(apiError(429, { message: 'x' }, { 'retry-after-ms': '250', 'retry-after': '3' })).retryAfterMs, 250)
  t.equal(classifyModelError(apiError(429, { message: 'x' })).retryAfterMs, null)
})

t.test('parseRetryAfter reads milliseconds, seconds and HTTP dates', async (t) => {
  const now = Date.parse('2026-01-01T00:00:00Z')
  t.equal(parseRetryAfter({ 'retry-after-ms': '50' }), 50)
  t.equal(parseRetryAfter({ 'retry-after': '1.5' }), 1500)
  t.equal(parseRetryAfter({ 'retry-after': 'Thu, 01 Jan 2026 00:00:07 GMT' }, now), 7000)
  t.equal(parseRetryAfter({ 'retry-after': 'Wed, 31 Dec 2025 23:00:00 GMT' }, now), 0, 'a date in the past means now')
  t.equal(parseRetryAfter({ 'retry-after-ms': 'soon', 'retry-after': '2' }), 2000, 'an unusable retry-after-ms falls back')
  t.equal(parseRetryAfter({ 'retry-after': 'later' }), null)
  t.equal(parseRetryAfter({ 'retry-after': '-1' }), null)
  t.equal(parseRetryAfter({}), null)
  t.equal(parseRetryAfter(new Headers({ 'Retry-After': '2' })), 2000)
})

t.test('connection failures, timeouts and aborts stay distinct', async (t) => {
  const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' })
  const cases: Array<[string, unknown, ModelErrorCode, string, boolean]> = [
    ['SDK connection error', new APIConnectionError({ cause: new TypeError('fetch failed', { cause: refused }) }), 'NETWORK_ERROR', 'runtime', true],
    ['SDK timeout', new APIConnectionTimeoutError(), 'TIMEOUT', 'aborted', true],
    ['SDK connection error caused by a connect timeout', new APIConnectionError({ cause: new TypeError('fetch failed', { cause: new undiciErrors.ConnectTimeoutError() }) }), 'TIMEOUT', 'aborted', true],
    ['undici body timeout mid-stream', new TypeError('terminated', { cause: new undiciErrors.BodyTimeoutError() }), 'TIMEOUT', 'aborted', true],
    ['undici socket closed mid-stream', new TypeError('terminated', { cause: new undiciErrors.SocketError('other side closed') }), 'NETWORK_ERROR', 'runtime', true],
    ['raw ECONNRESET', Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }), 'NETWORK_ERROR', 'runtime', true],
    ['a TimeoutError (AbortSignal.timeout)', new DOMException('timed out', 'TimeoutError'), 'TIMEOUT', 'aborted', true],
    ['SDK user abort', new APIUserAbortError(), 'UNKNOWN', 'aborted', false],
    ['an AbortError', new DOMException('aborted', 'AbortError'), 'UNKNOWN', 'aborted', false],
    ['malformed JSON', new SyntaxError('Unexpected token'), 'INVALID_RESPONSE', 'runtime', false],
    ['anything else', new RangeError('bug'), 'UNKNOWN', 'exception', false],
    ['a thrown string', 'boom', 'UNKNOWN', 'exception', false]
  ]
  for (const [name, err, code, errorType, retryable] of cases) {
    const classified = classifyModelError(err)
    t.match(classified.classified, { code, errorType, retryable, fatal: !retryable }, name)
    t.equal(classified.cause, err, `${name} keeps its cause`)
  }
})

t.test('the caller context wins: an interrupt is aborted, a deadline is TIMEOUT, whatever was thrown', async (t) => {
  const socketError = new TypeError('terminated', { cause: new undiciErrors.SocketError('other side closed') })
  t.match(classifyModelError(socketError, { aborted: true }).classified, { errorType: 'aborted', code: 'UNKNOWN', retryable: false, fatal: true })
  t.match(classifyModelError(socketError, { aborted: true, timedOut: true }).classified, { errorType: 'aborted', code: 'TIMEOUT', retryable: true })
  t.match(classifyModelError(socketError, { aborted: true }).classified.recommendations, [/interrupted/])
})

t.test('a ModelError passes through unchanged', async (t) => {
  const original = createModelError('SERVER_ERROR', 'x')
  t.equal(classifyModelError(original), original)
  t.equal(classifyModelError(original, { aborted: true }), original)
})
