import type { IncomingHttpHeaders } from 'node:http'
import { interceptors, type Dispatcher } from 'undici'

/** The body of a response as undici's `request()` hands it over: a Node Readable. */
export type ResponseBody = Dispatcher.ResponseData['body']

export interface RequestFetch {
  /** What the openai SDK calls instead of fetch. */
  fetch: typeof globalThis.fetch
  /**
   * The body of a 2xx response `fetch` returned, once: the Response itself carries none, so that
   * it is read as the Node stream it arrives as instead of through a web ReadableStream.
   */
  takeBody(response: Response): ResponseBody | undefined
}

/**
 * A `fetch` for the openai SDK over `dispatcher.request()`: the SDK still builds the request
 * (URL, headers, auth, JSON body), sends it through this function and turns a non-2xx answer into
 * its APIError classes, but the bytes skip undici's WHATWG fetch (its request and response
 * objects, the body as a chunked web stream, a DOMException on every early cancel). A string body
 * goes out in one write with its Content-Length. The dispatcher's connect, headers and body
 * timeouts apply as they did under fetch, and so do redirects (up to 20, as fetch follows).
 *
 * Only a 2xx answer's body is kept back for `takeBody`; an error answer is read whole (it is
 * small) so that the SDK can read it with `text()`.
 */
export function createRequestFetch(dispatcher: Dispatcher): RequestFetch {
  const bodies = new WeakMap<Response, ResponseBody>()
  const redirecting = dispatcher.compose(interceptors.redirect({ maxRedirections: MAX_REDIRECTIONS }))

  async function requestFetch(input: string | URL | Request, init: RequestInit = {}): Promise<Response> {
    const url = typeof input === 'string' ? new URL(input) : input instanceof URL ? input : new URL(input.url)
    const { statusCode, statusText, headers, body } = await redirecting.request({
      origin: url.origin,
      path: url.pathname + url.search,
      method: (init.method ?? 'GET') as Dispatcher.HttpMethod,
      headers: requestHeaders(init.headers),
      body: (init.body ?? null) as string | Buffer | null,
      signal: init.signal ?? null
    })
    const responseInit = { status: statusCode, statusText, headers: responseHeaders(headers) }
    if (statusCode >= 200 && statusCode < 300) {
      const response = new Response(null, responseInit)
      bodies.set(response, body)
      return response
    }
    const text = await body.text()
    return new Response(nullBodyStatuses.has(statusCode) ? null : text, responseInit)
  }

  return {
    fetch: requestFetch as typeof globalThis.fetch,
    takeBody(response) {
      const body = bodies.get(response)
      bodies.delete(response)
      return body
    }
  }
}

const MAX_REDIRECTIONS = 20
const nullBodyStatuses = new Set([101, 204, 205, 304])

/** The SDK hands over a Headers object; undici's request() takes a flat name/value array. */
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
