import { Agent, request, type Dispatcher } from 'undici'
import { tlsFailureOf } from '../errors/errno.ts'
import { jsonDepth, MAX_JSON_DEPTH } from '../json-depth.ts'
import { retryAfterMs } from '../retry-after.ts'
import { ToolFailure } from './tool-errors.ts'
import type { WebhookToolSpec } from '../schemas/tools.ts'
import { ToolSpecError, parametersFromJsonSchema } from './json-schema.ts'
import { brokenAnswer, hostAllowed, queuedLookup } from './net-guard.ts'
import { CappedBuffer } from './output.ts'
import type { Tool } from './types.ts'

export interface WebhookOptions {
  /** Hosts (`host` or `host:port`) webhook tools may call; from server configuration (SPEC 7). */
  allowedHosts: readonly string[]
  /** Answer bytes accepted; default 1 MiB. */
  maxResponseBytes?: number
  /** Used when the spec has no timeoutMs; the call's own tool timeout still applies. */
  defaultTimeoutMs?: number
  /**
   * The connection pool of the calls: the catalog's one (createWebhookDispatcher), whose host
   * lookups take the tools' lookup slots; undici's global dispatcher when none is given.
   */
  dispatcher?: Dispatcher
}

/** undici's default connect timeout: a connection still waiting for a lookup slot then gives up with it. */
const CONNECT_TIMEOUT_MS = 10_000

/** One pool for every webhook tool of a service (ToolCatalog owns it): its host lookups take the tools' lookup slots (net-guard.ts). */
export function createWebhookDispatcher(): Agent {
  return new Agent({ connect: { lookup: queuedLookup(CONNECT_TIMEOUT_MS), timeout: CONNECT_TIMEOUT_MS } })
}

/** A tool a client brings as a URL (SPEC 7), marked so the loop and GET endpoints can tell. */
export type WebhookTool = Tool & { kind: 'webhook'; url: string }

/**
 * Builds a webhook tool: each call POSTs `{callId, sessionId, name, input}` as JSON and takes the
 * JSON answer as the result. Throws ToolSpecError when the host is not allowed or the parameters
 * schema cannot be checked, so a session cannot be created with it.
 */
export function createWebhookTool(spec: Omit<WebhookToolSpec, 'type'>, opts: WebhookOptions): WebhookTool {
  let url: URL
  try {
    url = new URL(spec.url)
  } catch {
    throw new ToolSpecError('url', 'is not a valid URL')
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new ToolSpecError('url', 'must be an http or https URL')
  if (url.username || url.password) throw new ToolSpecError('url', 'must not contain credentials')
  if (!hostAllowed(url, opts.allowedHosts)) {
    throw new ToolSpecError(
      'url',
      opts.allowedHosts.length === 0
        ? 'this server allows no webhook hosts (AGENTD_WEBHOOK_HOSTS is empty)'
        : `the host ${url.host} is not allowed for webhook tools; allowed: ${opts.allowedHosts.join(', ')}`
    )
  }
  const parameters = parametersFromJsonSchema(spec.parameters)
  const maxBytes = opts.maxResponseBytes ?? 1024 * 1024
  const timeoutMs = spec.timeoutMs ?? opts.defaultTimeoutMs

  return {
    kind: 'webhook',
    url: url.href,
    name: spec.name,
    description: spec.description,
    parameters,
    async execute(input, ctx) {
      const deadline = timeoutMs === undefined ? undefined : AbortSignal.timeout(timeoutMs)
      const signal = deadline ? AbortSignal.any([ctx.signal, deadline]) : ctx.signal
      let response: Dispatcher.ResponseData | undefined
      const buffer = new CappedBuffer(maxBytes)
      try {
        response = await request(url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', accept: 'application/json' },
          body: JSON.stringify({ callId: ctx.callId, sessionId: ctx.sessionId, name: spec.name, input }),
          signal,
          ...(opts.dispatcher ? { dispatcher: opts.dispatcher } : {})
        })
        for await (const chunk of response.body as AsyncIterable<Buffer>) {
          buffer.push(chunk)
          if (buffer.truncated) break
        }
      } catch (err) {
        if (deadline?.aborted && !ctx.signal.aborted) {
          throw new ToolFailure('TIMEOUT', `The webhook did not answer within ${timeoutMs} ms.`, { url: redacted(url), timeoutMs, reason: 'webhook_timeout' })
        }
        if (ctx.signal.aborted) throw err
        const code = (err as { code?: unknown }).code
        if (brokenAnswer(err)) {
          throw new ToolFailure('IO_ERROR', `The webhook at ${url.host} answered with a broken HTTP response: ${(err as Error).message}`, {
            url: redacted(url),
            reason: 'bad_answer',
            ...(typeof code === 'string' ? { errno: code } : {})
          }, { retryable: false, cause: err })
        }
        if (response !== undefined) {
          // It answered, and its answer broke off: it was reached and may have done its work.
          throw new ToolFailure('IO_ERROR', `The webhook at ${url.host} answered HTTP ${response.statusCode}, but its answer was cut off: ${(err as Error).message}`, {
            url: redacted(url),
            status: response.statusCode,
            reason: 'answer_cut',
            ...(typeof code === 'string' ? { errno: code } : {})
          }, { cause: err })
        }
        const tls = tlsFailureOf(err)
        if (tls !== undefined) {
          throw new ToolFailure('IO_ERROR', `The webhook at ${url.host} failed the TLS handshake (${tls}): ${(err as Error).message}`, {
            url: redacted(url),
            reason: 'tls_error',
            errno: tls
          }, { retryable: false, cause: err })
        }
        throw new ToolFailure('IO_ERROR', `The webhook at ${url.host} could not be reached: ${(err as Error).message}`, {
          url: redacted(url),
          reason: 'unreachable',
          ...(typeof code === 'string' ? { errno: code } : {})
        }, { cause: err })
      }
      const status = response.statusCode
      if (status < 200 || status > 299) {
        const header = response.headers['retry-after']
        const retryAfter = retryAfterMs(Array.isArray(header) ? header[0] : header)
        // Only a server that is busy or failing may answer otherwise next time; a 3xx or 4xx answers the same call the same way.
        const transient = status === 408 || status === 429 || status >= 500
        throw new ToolFailure(
          status === 429 ? 'RATE_LIMITED' : 'IO_ERROR',
          `The webhook answered HTTP ${status}.`,
          {
            url: redacted(url), status, reason: 'webhook_status', body: buffer.text().slice(0, 500),
            ...(retryAfter !== null ? { retryAfterMs: retryAfter } : {})
          },
          { errorType: 'runtime', retryable: transient }
        )
      }
      if (buffer.truncated) {
        throw new ToolFailure('OUTPUT_TOO_LARGE', `The webhook answered more than ${maxBytes} bytes.`, { url: redacted(url), maxBytes })
      }
      // A UTF-8 byte order mark (which .NET's UTF-8 writers put first by default) is not text, as
      // WHATWG decoding has it; Buffer's decoding keeps it, and JSON.parse refused the answer.
      const text = buffer.text().replace(/^\uFEFF/, '')
      if (text.trim() === '') return null
      if (jsonDepth(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH) {
        throw new ToolFailure('IO_ERROR', `The webhook answered JSON nested deeper than ${MAX_JSON_DEPTH} levels.`, {
          url: redacted(url), status, reason: 'too_deep', maxDepth: MAX_JSON_DEPTH
        }, { retryable: false })
      }
      try {
        return JSON.parse(text) as unknown
      } catch {
        throw new ToolFailure('IO_ERROR', 'The webhook answered with a body that is not JSON.', {
          url: redacted(url),
          status,
          reason: 'not_json',
          body: text.slice(0, 500)
        }, { retryable: false })
      }
    },
    recommend({ code, reason, detail }) {
      const name = spec.name
      const wait = typeof detail?.['retryAfterMs'] === 'number' ? `wait ${Math.ceil(detail['retryAfterMs'] / 1000)} s (the webhook's Retry-After)` : 'wait a little'
      const status = detail?.['status']
      switch (code) {
        case 'RATE_LIMITED':
          return [`${name} is rate limited; ${wait} before calling it again, and make fewer calls.`]
        case 'TIMEOUT':
          return [`${name} did not answer in time; retry once later, and if it times out again go on without it.`]
        case 'OUTPUT_TOO_LARGE':
          return [`${name} answered more than ${maxBytes} bytes; call it with narrower arguments if its parameters allow, or go on without it.`]
        case 'IO_ERROR':
          if (reason === 'unreachable') return [`${name}'s server could not be reached; retry once, and if it fails again go on without it and tell the user.`]
          if (reason === 'answer_cut') {
            return [`${name} answered, but its answer was cut off, so ${name} may have done its work: check that before calling it again (a second call may repeat it), and tell the user if you cannot.`]
          }
          if (reason === 'bad_answer') return [`${name}'s server answered with a broken HTTP response, which is a fault of its server; do not retry, go on without it and tell the user.`]
          if (reason === 'tls_error') {
            return [`${name}'s server presented a certificate that is not trusted, or refused the TLS versions and ciphers agentd offers (${String(detail?.['errno'])}; a certificate may be self-signed, expired, from an unknown CA or for another host); a retry fails the same way: do not retry, go on without it and tell the user that the operator must fix the webhook's certificate or its TLS settings.`]
          }
          if (reason === 'too_deep') return [`${name} answered JSON nested deeper than ${MAX_JSON_DEPTH} levels, which is a fault of its server; do not retry, go on without it and tell the user.`]
          if (reason === 'not_json') return [`${name} answered something other than JSON, which is a fault of its server; do not retry, go on without it and tell the user.`]
          if (reason === 'webhook_status' && typeof status === 'number' && (status >= 500 || status === 408)) {
            return [`${name}'s server failed (HTTP ${status}); ${wait}, retry once, and if it fails again go on without it.`]
          }
          if (reason === 'webhook_status' && typeof status === 'number' && status < 400) {
            return [`${name} answered a redirect (HTTP ${status}), which webhook tools do not follow: its URL is out of date; do not retry, go on without it and tell the user.`]
          }
          if (reason === 'webhook_status') {
            return [`${name} refused this call (HTTP ${String(status)}); do not repeat it as is: check the arguments against its parameters, or go on without it.`]
          }
      }
      return undefined
    }
  }
}

/** The URL as errors and events show it: no query string or fragment, which may carry a secret. */
function redacted(url: URL): string {
  return `${url.origin}${url.pathname}`
}
