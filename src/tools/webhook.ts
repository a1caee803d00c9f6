import { request, type Dispatcher } from 'undici'
import { ToolFailure } from './tool-errors.ts'
import type { WebhookToolSpec } from '../schemas/tools.ts'
import { ToolSpecError, parametersFromJsonSchema } from './json-schema.ts'
import { hostAllowed } from './net-guard.ts'
import { CappedBuffer } from './output.ts'
import type { Tool } from './types.ts'

export interface WebhookOptions {
  /** Hosts (`host` or `host:port`) webhook tools may call; from server configuration (SPEC 7). */
  allowedHosts: readonly string[]
  /** Answer bytes accepted; default 1 MiB. */
  maxResponseBytes?: number
  /** Used when the spec has no timeoutMs; the call's own tool timeout still applies. */
  defaultTimeoutMs?: number
  dispatcher?: Dispatcher
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
      let response: Dispatcher.ResponseData
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
          throw new ToolFailure('TIMEOUT', `The webhook did not answer within ${timeoutMs} ms.`, { url: redacted(url), timeoutMs })
        }
        if (ctx.signal.aborted) throw err
        const code = (err as { code?: unknown }).code
        throw new ToolFailure('IO_ERROR', `The webhook at ${url.host} could not be reached: ${(err as Error).message}`, {
          url: redacted(url),
          ...(typeof code === 'string' ? { errno: code } : {})
        }, { cause: err })
      }
      if (response.statusCode < 200 || response.statusCode > 299) {
        throw new ToolFailure(
          response.statusCode === 429 ? 'RATE_LIMITED' : 'IO_ERROR',
          `The webhook answered HTTP ${response.statusCode}.`,
          { url: redacted(url), status: response.statusCode, body: buffer.text().slice(0, 500) },
          { errorType: 'runtime' }
        )
      }
      if (buffer.truncated) {
        throw new ToolFailure('OUTPUT_TOO_LARGE', `The webhook answered more than ${maxBytes} bytes.`, { url: redacted(url), maxBytes })
      }
      const text = buffer.text()
      if (text.trim() === '') return null
      try {
        return JSON.parse(text) as unknown
      } catch {
        throw new ToolFailure('IO_ERROR', 'The webhook answered with a body that is not JSON.', {
          url: redacted(url),
          status: response.statusCode,
          body: text.slice(0, 500)
        })
      }
    }
  }
}

/** The URL as errors and events show it: no query string or fragment, which may carry a secret. */
function redacted(url: URL): string {
  return `${url.origin}${url.pathname}`
}
