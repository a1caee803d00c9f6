import { createHmac, randomUUID } from 'node:crypto'
import { Agent, request, type Dispatcher } from 'undici'
import { classified } from '../errors/classified.ts'
import { tlsFailureOf } from '../errors/errno.ts'
import { jsonDepth, MAX_JSON_DEPTH } from '../json-depth.ts'
import type { ClassifiedError } from '../schemas/common.ts'
import { queuedLookup } from '../tools/net-guard.ts'
import { basicAuthorization, withoutCredentials } from '../tools/url-credentials.ts'
import type { HookDefinition } from './config.ts'

/** Largest hook answer read; a policy decision or a redacted output is far smaller. */
const MAX_ANSWER_BYTES = 1024 * 1024

/** How a delivery failed: the codes a monitor `warn` and the logs carry. */
export type HookFailureCode = 'HOOK_TIMEOUT' | 'HOOK_UNREACHABLE' | 'HOOK_HTTP_ERROR' | 'HOOK_INVALID_RESPONSE'

/** A delivery that did not produce a usable answer, classified like every other error. */
export class HookFailure extends Error {
  readonly code: HookFailureCode
  /** Worth another attempt (runEnd): the receiver may answer next time. */
  readonly retryable: boolean
  readonly detail: Record<string, unknown>
  constructor(code: HookFailureCode, message: string, retryable: boolean, detail: Record<string, unknown> = {}) {
    super(message)
    this.code = code
    this.retryable = retryable
    this.detail = detail
  }

  /** The ClassifiedError of SPEC 5.1 for the monitor event, naming the hook. */
  classify(hook: HookDefinition): ClassifiedError {
    return classified({
      errorType: this.code === 'HOOK_TIMEOUT' ? 'aborted' : 'runtime',
      code: this.code,
      message: `Hook ${hook.name} (${hook.on}) failed: ${this.message}`,
      retryable: this.retryable,
      recommendations: [`Check the hook server at ${shownUrl(hook.url)}; until it answers, calls go on by its onFailure setting (${hook.onFailure}).`],
      detail: { hook: hook.name, on: hook.on, url: shownUrl(hook.url), ...this.detail }
    })
  }
}

/** The signature header value of a body: `sha256=<hex HMAC-SHA256 of the exact bytes sent>`. */
export function signBody(secret: string, body: string): string {
  return `sha256=${createHmac('sha256', secret).update(body).digest('hex')}`
}

export interface Delivery {
  hook: HookDefinition
  payload: Record<string, unknown>
  requestId: string | null
  /** The same ID on every retry of one delivery, so a receiver can drop duplicates. */
  deliveryId?: string
  /** The run's signal: an interrupt stops waiting for the hook at once. */
  signal?: AbortSignal
  /** A notification (runEnd): any 2xx is success, whatever its body. */
  ignoreAnswer?: boolean
}

/** How long a hook's connection may take, its host lookup included (queued for a lookup slot too). */
const CONNECT_TIMEOUT_MS = 5000

/**
 * POSTs signed JSON to operator hooks over its own connection pool (a hung hook server cannot
 * take the model's connections), with a deadline per attempt and a cap on the answer. Its host
 * lookups take the tools' lookup slots (net-guard.ts): a hook host whose DNS never answers holds
 * no more of libuv's thread pool than a tool's would.
 */
export class HookClient {
  readonly #dispatcher: Dispatcher

  constructor(dispatcher?: Dispatcher) {
    this.#dispatcher = dispatcher ?? new Agent({ connect: { timeout: CONNECT_TIMEOUT_MS, lookup: queuedLookup(CONNECT_TIMEOUT_MS) } })
  }

  /**
   * Delivers once; resolves with the parsed JSON answer (null for an empty body) or throws
   * HookFailure. When `signal` fires first it rejects with the signal's reason instead.
   */
  async deliver(delivery: Delivery): Promise<unknown> {
    const { hook } = delivery
    const deliveryId = delivery.deliveryId ?? randomUUID()
    const body = JSON.stringify({ event: hook.on, hook: hook.name, deliveryId, sentAt: new Date().toISOString(), ...delivery.payload })
    const headers: Record<string, string> = {
      'content-type': 'application/json',
      accept: 'application/json',
      'x-agentd-event': hook.on,
      'x-agentd-delivery': deliveryId
    }
    if (delivery.requestId) headers['x-request-id'] = delivery.requestId
    if (hook.secret) headers['x-agentd-signature'] = signBody(hook.secret, body)
    const target = new URL(hook.url)
    const authorization = basicAuthorization(target)
    if (authorization) headers['authorization'] = authorization
    const deadline = AbortSignal.timeout(hook.timeoutMs)
    const signal = delivery.signal ? AbortSignal.any([delivery.signal, deadline]) : deadline
    const chunks: Buffer[] = []
    let size = 0
    let status: number
    try {
      const response = await request(withoutCredentials(target), { method: 'POST', headers, body, signal, dispatcher: this.#dispatcher })
      status = response.statusCode
      for await (const chunk of response.body as AsyncIterable<Buffer>) {
        size += chunk.length
        if (size > MAX_ANSWER_BYTES) {
          response.body.destroy()
          throw new HookFailure('HOOK_INVALID_RESPONSE', `it answered more than ${MAX_ANSWER_BYTES} bytes`, false)
        }
        chunks.push(chunk)
      }
    } catch (err) {
      if (err instanceof HookFailure) throw err
      if (delivery.signal?.aborted) throw delivery.signal.reason ?? err
      if (deadline.aborted) throw new HookFailure('HOOK_TIMEOUT', `it did not answer within ${hook.timeoutMs} ms`, true, { timeoutMs: hook.timeoutMs })
      // A certificate agentd does not trust, or a handshake the receiver refuses (errno.ts
      // tlsFailureOf): no retry fixes it, so runEnd does not wait out its retries.
      const tls = tlsFailureOf(err)
      if (tls !== undefined) {
        throw new HookFailure('HOOK_UNREACHABLE', `its TLS handshake failed (${tls})`, false, { errno: tls, reason: 'tls_error' })
      }
      const code = (err as { code?: unknown }).code
      throw new HookFailure('HOOK_UNREACHABLE', `it could not be reached (${typeof code === 'string' ? code : (err as Error).message})`, true,
        typeof code === 'string' ? { errno: code } : {})
    }
    const text = Buffer.concat(chunks).toString('utf8')
    if (status < 200 || status > 299) {
      throw new HookFailure('HOOK_HTTP_ERROR', `it answered HTTP ${status}`, status >= 500 || status === 408 || status === 429,
        { status, body: text.slice(0, 200) })
    }
    if (delivery.ignoreAnswer || text.trim() === '') return null
    if (jsonDepth(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH) {
      throw new HookFailure('HOOK_INVALID_RESPONSE', `it answered JSON nested deeper than ${MAX_JSON_DEPTH} levels`, false, { status, maxDepth: MAX_JSON_DEPTH })
    }
    try {
      return JSON.parse(text) as unknown
    } catch {
      throw new HookFailure('HOOK_INVALID_RESPONSE', 'it answered with a body that is not JSON', false, { status, body: text.slice(0, 200) })
    }
  }

  /** Drops every connection, also those a hung hook server still holds open. */
  async close(): Promise<void> {
    await this.#dispatcher.destroy()
  }
}

/** The URL as events and logs show it: no credentials, query string or fragment, which may carry a secret. */
export function shownUrl(url: string): string {
  const parsed = new URL(url)
  return `${parsed.protocol}//${parsed.host}${parsed.pathname}`
}
