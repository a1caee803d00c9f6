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
 * request (URL, headers, auth around the JSON body of request-json.ts), sends it through this
 * function and turns a non-2xx answer into its APIError classes, but the bytes skip undici's
 * WHATWG fetch (its request and response objects, the body as a chunked web stream, a
 * DOMException on every early cancel) and Node streams altogether. A string body goes out in one
 * write with its Content-Length. The dispatcher's connect, headers and body timeouts apply as
 * they did under fetch, and so do redirects (up to 20, as fetch follows them).
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
      const handler = new FetchHandler(signal, (response, body) => {
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
const BOM = 0xfeff
const nullBodyStatuses = new Set([101, 204, 205, 304])
/** Text held for a reader that has not come back yet, beyond which the socket is paused. */
const HIGH_WATER_MARK = 64 * 1024
/** What is read and dropped after the reader is done before the request is aborted instead (undici's dump() limit). */
const DROP_LIMIT = 128 * 1024
/**
 * The most of an error answer's text that is read; the request is aborted past it. A proxy's
 * error page is a few KiB, and a JSON error this long still parses (its message is cut later);
 * a body without end was held whole until it ended.
 */
const ERROR_BODY_LIMIT = 1024 * 1024

/** A 2xx response's body as it arrives: UTF-8 text, a character split between two reads joined first. */
export interface StreamedBody {
  /** The next piece of text, or null once the body has ended; rejects with the transport's error (a body timeout, a cut connection, the caller's abort). */
  read(): Promise<string | null>
  /**
   * The reader is done with the body. Unless `keepConnection`, the request is aborted; with it, the
   * rest of the body (normally nothing but the end of the chunked encoding) is read and dropped.
   */
  close(keepConnection: boolean): void
}

/** The reason a request is aborted with when its reader stops early; nobody is left to see it. */
class StreamClosedError extends Error {
  override name = 'StreamClosedError'
}

/**
 * undici's dispatch handler for one fetch, and the StreamedBody of its answer: settles the fetch
 * at the start of a 2xx answer and then holds its text for `read()`, or at the end of any other
 * answer, read whole.
 */
class FetchHandler implements Dispatcher.DispatchHandler, StreamedBody {
  readonly #signal: AbortSignal | undefined
  readonly #respond: (response: Response, body: StreamedBody | null) => void
  readonly #reject: (err: unknown) => void
  #controller: Dispatcher.DispatchController | null = null
  #status = 0
  #headers: IncomingHttpHeaders = {}
  readonly #decoder = new StringDecoder('utf8')
  /** An error answer's text so far, or the text of a 2xx answer that its reader has not taken yet. */
  #pieces: string[] = []
  #held = 0
  #ended = false
  #error: unknown = null
  #reader: { resolve(piece: string | null): void; reject(err: unknown): void } | null = null
  /** Bytes dropped since the reader was done, or -1 while it reads: what arrives then is dropped, so that the response can end and its connection be kept. */
  #dropped = -1
  /** No text of the body has been delivered yet: a byte order mark that opens it is dropped. */
  #atStart = true

  constructor(signal: AbortSignal | undefined, respond: (response: Response, body: StreamedBody | null) => void, reject: (err: unknown) => void) {
    this.#signal = signal
    this.#respond = respond
    this.#reject = reject
    signal?.addEventListener('abort', this.#onAbort)
  }

  readonly #onAbort = (): void => {
    this.#controller?.abort(this.#signal?.reason as Error)
  }

  get #streaming(): boolean {
    return this.#status >= 200 && this.#status < 300
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller
    if (this.#signal?.aborted) controller.abort(this.#signal.reason as Error)
  }

  onResponseStart(controller: Dispatcher.DispatchController, statusCode: number, headers: IncomingHttpHeaders): void {
    if (statusCode < 200) return
    // After a redirect, the controller of the request that answered.
    this.#controller = controller
    this.#status = statusCode
    this.#headers = headers
    // No statusText: the SDK never reads it, and a reason phrase the Response constructor rejects would fail the call.
    if (this.#streaming) this.#respond(new Response(null, { status: statusCode, headers: responseHeaders(headers) }), this)
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.#dropped < 0) this.#deliver(this.#decoder.write(chunk))
    else if ((this.#dropped += chunk.length) > DROP_LIMIT) this.#controller?.abort(new StreamClosedError())
  }

  onResponseEnd(): void {
    this.#signal?.removeEventListener('abort', this.#onAbort)
    if (this.#dropped < 0) this.#deliver(this.#decoder.end())
    this.#ended = true
    if (!this.#streaming) {
      this.#respondError()
      return
    }
    const reader = this.#reader
    this.#reader = null
    reader?.resolve(null)
  }

  onResponseError(_controller: Dispatcher.DispatchController | null, err: Error): void {
    this.#signal?.removeEventListener('abort', this.#onAbort)
    if (!this.#streaming) {
      this.#reject(err)
      return
    }
    this.#error = err
    const reader = this.#reader
    this.#reader = null
    reader?.reject(err)
  }

  read(): Promise<string | null> {
    if (this.#pieces.length > 0) {
      const piece = this.#pieces.length === 1 ? (this.#pieces.pop() as string) : this.#pieces.splice(0).join('')
      this.#held = 0
      if (this.#controller?.paused) this.#controller.resume()
      return Promise.resolve(piece)
    }
    if (this.#error !== null) return Promise.reject(this.#error)
    if (this.#ended) return Promise.resolve(null)
    return new Promise((resolve, reject) => {
      this.#reader = { resolve, reject }
    })
  }

  close(keepConnection: boolean): void {
    if (this.#ended || this.#error !== null) return
    this.#pieces = []
    if (!keepConnection) {
      this.#controller?.abort(new StreamClosedError())
      return
    }
    this.#dropped = 0
    if (this.#controller?.paused) this.#controller.resume()
  }

  #deliver(text: string): void {
    // Ended: an error answer cut at its limit, whose request is being aborted.
    if (text === '' || this.#ended) return
    // A UTF-8 byte order mark opening the body is not text, as WHATWG decoding (the openai SDK's,
    // fetch's) has it: kept, it made the stream's first line a field named "\uFEFFdata", and
    // the event dropped, or a whole completion text that is not JSON. The StringDecoder hands
    // the mark over whole, in the first text it returns.
    if (this.#atStart) {
      this.#atStart = false
      if (text.charCodeAt(0) === BOM) {
        text = text.slice(1)
        if (text === '') return
      }
    }
    const reader = this.#reader
    if (reader) {
      this.#reader = null
      reader.resolve(text)
      return
    }
    this.#pieces.push(text)
    this.#held += text.length
    // An error answer is read whole, up to its limit; only a stream waits for its reader.
    if (this.#streaming) {
      if (this.#held > HIGH_WATER_MARK) this.#controller?.pause()
    } else if (this.#held > ERROR_BODY_LIMIT) {
      this.#ended = true
      // Settled first: the abort calls onResponseError at once, which would reject the fetch.
      this.#respondError()
      this.#controller?.abort(new StreamClosedError())
    }
  }

  /** Settles the fetch with the error answer's text, its first ERROR_BODY_LIMIT characters. */
  #respondError(): void {
    const text = this.#pieces.join('').slice(0, ERROR_BODY_LIMIT)
    this.#pieces = []
    this.#respond(new Response(nullBodyStatuses.has(this.#status) ? null : text, { status: this.#status, headers: responseHeaders(this.#headers) }), null)
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
