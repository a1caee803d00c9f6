import type { IncomingHttpHeaders } from 'node:http'
import { StringDecoder } from 'node:string_decoder'
import type OpenAI from 'openai'
import { interceptors, type Dispatcher } from 'undici'

type FetchOptions = NonNullable<OpenAI.RequestOptions['fetchOptions']>

export interface DispatcherFetch {
  /** What the openai SDK calls instead of fetch. */
  fetch: typeof globalThis.fetch
  /**
   * The SDK's per-request `fetchOptions` that hand the caller's signal to `fetch` untouched. Given
   * as the SDK's own `signal` option, it would be joined to the SDK's deadline with
   * AbortSignal.any() on every call; undici's connect and headers timeouts always end the wait
   * before that deadline would, so `fetch` follows the caller's signal alone.
   */
  withSignal(signal: AbortSignal): FetchOptions
  /**
   * The body of a 2xx response `fetch` returned, once: the Response itself carries none, so that
   * the body is read as it arrives instead of through a web ReadableStream.
   */
  takeBody(response: Response): StreamedBody
}

/**
 * A `fetch` for the openai SDK straight over `dispatcher.dispatch()`: the SDK still builds the
 * request (URL, headers, auth, JSON body), sends it through this function and turns a non-2xx
 * answer into its APIError classes, but the bytes skip undici's WHATWG fetch (its request and
 * response objects, the body as a chunked web stream, a DOMException on every early cancel) and
 * Node streams altogether. A string body goes out in one write with its Content-Length. The
 * dispatcher's connect, headers and body timeouts apply as they did under fetch, and so do
 * redirects (up to 20, as fetch follows them).
 *
 * A 2xx answer's body is kept back for `takeBody`; an error answer is read whole (it is small)
 * so that the SDK can read it with `text()`.
 */
export function createDispatcherFetch(dispatcher: Dispatcher): DispatcherFetch {
  const bodies = new WeakMap<Response, StreamedBody>()
  const redirecting = dispatcher.compose(interceptors.redirect({ maxRedirections: MAX_REDIRECTIONS }))

  function dispatchFetch(input: string | URL | Request, init: RequestInit = {}): Promise<Response> {
    const url = typeof input === 'string' ? new URL(input) : input instanceof URL ? input : new URL(input.url)
    const signal = (init as SignalledInit)[callerSignal]
    if (signal?.aborted) return Promise.reject(signal.reason)
    return new Promise<Response>((resolve, reject) => {
      const handler = new ResponseHandler(signal, (response, body) => {
        if (body) bodies.set(response, body)
        resolve(response)
      }, reject)
      try {
        redirecting.dispatch({
          origin: url.origin,
          path: url.pathname + url.search,
          method: (init.method ?? 'GET') as Dispatcher.HttpMethod,
          headers: requestHeaders(init.headers),
          body: (init.body ?? null) as string | Buffer | null
        }, handler)
      } catch (err) {
        handler.onResponseError(null, err as Error)
      }
    })
  }

  return {
    fetch: dispatchFetch as typeof globalThis.fetch,
    withSignal: (signal) => ({ [callerSignal]: signal }) as FetchOptions,
    takeBody(response) {
      const body = bodies.get(response)
      if (!body) throw new Error('takeBody: not a 2xx response of this fetch, or its body was taken already')
      bodies.delete(response)
      return body
    }
  }
}

/** The SDK copies per-request fetchOptions into what it hands `fetch`, symbol keys included. */
const callerSignal = Symbol('agentd.callerSignal')
type SignalledInit = RequestInit & { [callerSignal]?: AbortSignal }

const MAX_REDIRECTIONS = 20
const nullBodyStatuses = new Set([101, 204, 205, 304])
/** Text held for a reader that has not come back yet, beyond which the socket is paused. */
const HIGH_WATER_MARK = 64 * 1024
/** What is read and dropped after the reader is done before the request is aborted instead (undici's dump() limit). */
const DROP_LIMIT = 128 * 1024

/**
 * A 2xx response's body as it arrives: UTF-8 text (a character split between two reads is joined
 * first), taken one piece at a time with `read()`.
 */
export class StreamedBody {
  readonly #controller: Dispatcher.DispatchController
  readonly #decoder = new StringDecoder('utf8')
  #pieces: string[] = []
  #held = 0
  #ended = false
  #error: unknown = null
  #reader: { resolve(piece: string | null): void; reject(err: unknown): void } | null = null
  /** Bytes dropped since the reader was done, or -1 while it reads: what arrives then is dropped, so that the response can end and its connection be kept. */
  #dropped = -1

  constructor(controller: Dispatcher.DispatchController) {
    this.#controller = controller
  }

  /** The next piece of text, or null once the body has ended; rejects with the transport's error (a body timeout, a cut connection, the caller's abort). */
  read(): Promise<string | null> {
    if (this.#pieces.length > 0) {
      const piece = this.#pieces.length === 1 ? (this.#pieces.pop() as string) : this.#pieces.splice(0).join('')
      this.#held = 0
      if (this.#controller.paused) this.#controller.resume()
      return Promise.resolve(piece)
    }
    if (this.#error !== null) return Promise.reject(this.#error)
    if (this.#ended) return Promise.resolve(null)
    return new Promise((resolve, reject) => {
      this.#reader = { resolve, reject }
    })
  }

  /**
   * The reader is done with the body. Unless `keepConnection`, the request is aborted; with it, the
   * rest of the body (normally nothing but the end of the chunked encoding) is read and dropped.
   */
  close(keepConnection: boolean): void {
    if (this.#ended || this.#error !== null) return
    this.#pieces = []
    if (!keepConnection) {
      this.#controller.abort(new StreamClosedError())
      return
    }
    this.#dropped = 0
    if (this.#controller.paused) this.#controller.resume()
  }

  /** @internal The handler's side. */
  push(chunk: Buffer): void {
    if (this.#dropped < 0) this.#deliver(this.#decoder.write(chunk))
    else if ((this.#dropped += chunk.length) > DROP_LIMIT) this.#controller.abort(new StreamClosedError())
  }

  /** @internal */
  end(): void {
    if (this.#dropped < 0) this.#deliver(this.#decoder.end())
    this.#ended = true
    const reader = this.#reader
    this.#reader = null
    reader?.resolve(null)
  }

  /** @internal */
  fail(err: unknown): void {
    this.#error = err
    const reader = this.#reader
    this.#reader = null
    reader?.reject(err)
  }

  #deliver(text: string): void {
    if (text === '') return
    const reader = this.#reader
    if (reader) {
      this.#reader = null
      reader.resolve(text)
      return
    }
    this.#pieces.push(text)
    this.#held += text.length
    if (this.#held > HIGH_WATER_MARK) this.#controller.pause()
  }
}

/** The reason a request is aborted with when its reader stops early; nobody is left to see it. */
class StreamClosedError extends Error {
  override name = 'StreamClosedError'
}

/** undici's dispatch handler for one fetch: settles the fetch at the response's start (2xx) or end (any other status), then feeds the StreamedBody. */
class ResponseHandler implements Dispatcher.DispatchHandler {
  readonly #signal: AbortSignal | undefined
  readonly #respond: (response: Response, body: StreamedBody | null) => void
  readonly #reject: (err: unknown) => void
  #controller: Dispatcher.DispatchController | null = null
  #body: StreamedBody | null = null
  /** An error answer's body, read whole before the fetch settles. */
  #errorAnswer: { status: number; headers: IncomingHttpHeaders; decoder: StringDecoder; text: string } | null = null
  #settled = false

  constructor(signal: AbortSignal | undefined, respond: (response: Response, body: StreamedBody | null) => void, reject: (err: unknown) => void) {
    this.#signal = signal
    this.#respond = respond
    this.#reject = reject
    signal?.addEventListener('abort', this.#onAbort)
  }

  readonly #onAbort = (): void => {
    this.#controller?.abort(this.#signal?.reason as Error)
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller
    if (this.#signal?.aborted) controller.abort(this.#signal.reason as Error)
  }

  onResponseStart(controller: Dispatcher.DispatchController, statusCode: number, headers: IncomingHttpHeaders): void {
    // No statusText: the SDK never reads it, and a reason phrase the Response constructor rejects would fail the call.
    if (statusCode < 200) return
    if (statusCode < 300) {
      this.#body = new StreamedBody(controller)
      this.#settled = true
      this.#respond(new Response(null, { status: statusCode, headers: responseHeaders(headers) }), this.#body)
      return
    }
    this.#errorAnswer = { status: statusCode, headers, decoder: new StringDecoder('utf8'), text: '' }
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.#body) this.#body.push(chunk)
    else if (this.#errorAnswer) this.#errorAnswer.text += this.#errorAnswer.decoder.write(chunk)
  }

  onResponseEnd(): void {
    this.#signal?.removeEventListener('abort', this.#onAbort)
    if (this.#body) {
      this.#body.end()
      return
    }
    const answer = this.#errorAnswer
    if (!answer) return
    this.#settled = true
    const text = answer.text + answer.decoder.end()
    this.#respond(
      new Response(nullBodyStatuses.has(answer.status) ? null : text, { status: answer.status, headers: responseHeaders(answer.headers) }),
      null
    )
  }

  onResponseError(_controller: Dispatcher.DispatchController | null, err: Error): void {
    this.#signal?.removeEventListener('abort', this.#onAbort)
    if (this.#settled) this.#body?.fail(err)
    else this.#reject(err)
  }
}

/** The SDK hands over a Headers object; undici takes a flat name/value array. */
function requestHeaders(headers: RequestInit['headers']): string[] {
  const flat: string[] = []
  if (headers === undefined) return flat
  const pairs: Iterable<[string, string]> =
    Symbol.iterator in headers ? (headers as Iterable<[string, string]>) : Object.entries(headers as Record<string, string>)
  for (const [name, value] of pairs) flat.push(name, value)
  return flat
}

function responseHeaders(raw: IncomingHttpHeaders): Headers {
  const headers = new Headers()
  for (const name in raw) {
    const value = raw[name]
    if (typeof value === 'string') headers.append(name, value)
    else if (value !== undefined) for (const one of value) headers.append(name, one)
  }
  return headers
}
