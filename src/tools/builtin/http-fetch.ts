import { Type } from '@sinclair/typebox'
import type { Transform } from 'node:stream'
import { createBrotliDecompress, createGunzip, createInflate } from 'node:zlib'
import { Agent, request, type Dispatcher } from 'undici'
import { errnoFamily, errnoOf, tlsFailureOf } from '../../errors/errno.ts'
import { ToolFailure } from '../tool-errors.ts'
import { brokenAnswer, pinnedLookup, resolveChecked, type AddressPolicy, type CheckedAddress, type Resolve } from '../net-guard.ts'
import { jsonFittingPrefix, truncationNote, utf8Prefix } from '../output.ts'
import type { Tool } from '../types.ts'
import { basicAuthorization, withoutCredentials } from '../url-credentials.ts'

const Method = Type.Union(['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'].map((m) => Type.Literal(m)))

const Parameters = Type.Object(
  {
    url: Type.String({ minLength: 1, description: 'An http:// or https:// URL' }),
    method: Type.Optional(Method),
    headers: Type.Optional(Type.Record(Type.String(), Type.String(), { description: 'Request headers' })),
    body: Type.Optional(Type.String({ description: 'Request body (for POST, PUT, PATCH)' }))
  },
  { additionalProperties: false }
)

export interface HttpFetchOptions extends AddressPolicy {
  /**
   * Bytes of the whole result as JSON (the runtime's output cap): the body is cut to fit, so the
   * model gets an object with `truncated: true`, not cut JSON text. No more body than this is read.
   */
  maxBytes: number
  /** Connect, headers and body timeouts of each hop. */
  timeoutMs: number
  /** Redirects followed at most. */
  maxRedirects: number
  /** Resolves host names; default the tools' bounded getaddrinfo (net-guard.ts lookupHost); tests stub DNS with it. */
  resolve?: Resolve
}

const redirectStatuses = new Set([301, 302, 303, 307, 308])
const textTypes = /^text\/|[/+](json|xml|javascript|ecmascript|x-www-form-urlencoded|yaml|csv|html)\b/i
// Credentials meant for one origin must not follow a redirect to another.
const originBoundHeaders = new Set(['authorization', 'cookie', 'proxy-authorization'])

/**
 * http_fetch: an HTTP request from the service (SPEC 7). Every hop's host is resolved here and
 * refused when it is loopback, private, link-local or metadata (unless allowed); the socket then
 * connects to exactly the checked address. Redirects are followed by hand, each one checked again.
 */
export function createHttpFetchTool(opts: HttpFetchOptions): Tool<typeof Parameters> {
  return {
    name: 'http_fetch',
    description:
      'Fetch an http(s) URL. Returns status, headers and the body as text, the body cut so that ' +
      `the whole answer fits in ${opts.maxBytes} bytes (then truncated is true). Follows up to ${opts.maxRedirects} redirects. ` +
      'Loopback, private, link-local and cloud metadata addresses are refused.',
    parameters: Parameters,
    async execute(input, ctx) {
      let url = parseHttpUrl(input.url)
      let method = input.method ?? 'GET'
      let body = input.body
      let headers: Record<string, string> = checkedHeaders(input.headers ?? {})
      const pins = new Map<string, CheckedAddress[]>()
      const agent = new Agent({
        connect: { lookup: pinnedLookup(pins), timeout: opts.timeoutMs },
        headersTimeout: opts.timeoutMs,
        bodyTimeout: opts.timeoutMs
      })
      try {
        for (let redirects = 0; ; redirects++) {
          pins.set(url.hostname.toLowerCase(), await resolveChecked(withoutCredentials(url), opts, ctx.signal, opts.resolve))
          const response = await send(agent, url, method, withUrlCredentials(headers, url), body, ctx.signal)
          const location = header(response.headers, 'location')
          if (!redirectStatuses.has(response.statusCode) || location === undefined) {
            return await readResponse(response, withoutCredentials(url), redirects, opts.maxBytes)
          }
          await response.body.dump()
          if (redirects >= opts.maxRedirects) {
            throw new ToolFailure('IO_ERROR', `Stopped after ${opts.maxRedirects} redirects.`, { url: withoutCredentials(url).href, reason: 'too_many_redirects' })
          }
          const next = redirectTarget(location, url)
          if (response.statusCode === 303 || ((response.statusCode === 301 || response.statusCode === 302) && method === 'POST')) {
            method = 'GET'
            body = undefined
          }
          if (next.origin !== url.origin) {
            headers = Object.fromEntries(Object.entries(headers).filter(([k]) => !originBoundHeaders.has(k.toLowerCase())))
          }
          url = next
        }
      } finally {
        agent.destroy().catch(() => {})
      }
    },
    recommend({ code, reason, detail }) {
      switch (code) {
        case 'TIMEOUT':
          return ['The server did not answer in time; retry later or fetch a smaller resource.']
        case 'OUTPUT_TOO_LARGE':
          return ['Fetch a smaller resource, e.g. an API endpoint with paging or filters.']
        case 'PERMISSION_DENIED':
          return ['Loopback, private, link-local and metadata addresses are refused; fetch a public http(s) URL instead.']
        case 'VALIDATION_ERROR':
          if (reason === 'bad_header') {
            return ['Send only valid headers: names are plain tokens, values have no line breaks, and Host, Connection, Transfer-Encoding, Upgrade, Expect and Content-Length are set by the tool.']
          }
          return undefined
        case 'IO_ERROR':
          if (reason === 'bad_answer') return ['The server answered with a broken HTTP response (bad status line, headers too large); do not retry, try another URL.']
          if (reason === 'tls_error') {
            return [`The server's certificate is not trusted, or the server refuses the TLS versions and ciphers agentd offers (${String(detail?.['errno'])}; a certificate may be self-signed, expired, from an unknown CA or for another host name); a retry fails the same way: do not retry, tell the user, or fetch the information from another source.`]
          }
          if (reason === 'bad_encoding') return ['The server sent a body its Content-Encoding does not match; do not retry, try another URL.']
          if (reason === 'too_many_redirects') return ['The URL redirects too often; fetch the final URL directly.']
          if (reason === 'bad_redirect') return ['The server redirected to a location that is not a valid http(s) URL; do not retry, try another URL.']
          return ['Check the URL and that the host is reachable; retry once if the failure looks transient.']
      }
      return undefined
    }
  }
}

// RFC 9110 token characters; a value may hold anything but line breaks and NUL.
const headerName = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/
const badHeaderValue = /[\r\n\0]/
// Headers that frame the message or the connection: the tool sets them, a caller's value would break the request.
const managedHeaders = new Set(['host', 'connection', 'keep-alive', 'transfer-encoding', 'upgrade', 'expect', 'content-length', 'te', 'trailer'])

/** The caller's headers, or VALIDATION_ERROR naming the first that cannot be sent as given (a line break would inject headers). */
function checkedHeaders(given: Record<string, string>): Record<string, string> {
  for (const [name, value] of Object.entries(given)) {
    const problem = !headerName.test(name)
      ? 'is not a valid header name'
      : badHeaderValue.test(value)
        ? 'has a line break or NUL in its value'
        : managedHeaders.has(name.toLowerCase())
          ? 'is set by the tool and cannot be given'
          : null
    if (problem) throw new ToolFailure('VALIDATION_ERROR', `The header ${JSON.stringify(name)} ${problem}.`, { header: name, reason: 'bad_header' })
  }
  return { ...given }
}

/**
 * undici sends no credentials from a URL's user info: they become Basic authorization here, unless
 * the caller gave an Authorization header of its own. Each hop's URL decides (a redirect elsewhere carries none).
 */
function withUrlCredentials(headers: Record<string, string>, url: URL): Record<string, string> {
  const authorization = basicAuthorization(url)
  if (authorization === null || Object.keys(headers).some((k) => k.toLowerCase() === 'authorization')) return headers
  return { ...headers, authorization }
}

/** Where a redirect leads, or IO_ERROR (bad_redirect) when its Location is no http(s) URL: the server's fault, not the caller's. */
function redirectTarget(location: string, from: URL): URL {
  let next: URL
  try {
    next = new URL(location, from)
  } catch {
    throw new ToolFailure('IO_ERROR', `${from.host} redirected to ${JSON.stringify(location.slice(0, 200))}, which is not a valid URL.`,
      { url: withoutCredentials(from).href, location: location.slice(0, 200), reason: 'bad_redirect' }, { retryable: false })
  }
  if (next.protocol !== 'http:' && next.protocol !== 'https:') {
    throw new ToolFailure('IO_ERROR', `${from.host} redirected to a ${next.protocol} URL; only http and https are followed.`,
      { url: withoutCredentials(from).href, location: location.slice(0, 200), reason: 'bad_redirect' }, { retryable: false })
  }
  return next
}

function parseHttpUrl(raw: string): URL {
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    throw new ToolFailure('VALIDATION_ERROR', `"${raw}" is not a valid URL.`, { url: raw })
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new ToolFailure('VALIDATION_ERROR', `Only http and https URLs can be fetched, not ${url.protocol}`, { url: raw })
  }
  return url
}

async function send(
  agent: Agent,
  url: URL,
  method: string,
  headers: Record<string, string>,
  body: string | undefined,
  signal: AbortSignal
): Promise<Dispatcher.ResponseData> {
  try {
    return await request(url, { dispatcher: agent, method: method as Dispatcher.HttpMethod, headers, body, signal })
  } catch (err) {
    if (signal.aborted) throw err
    const code = errnoOf(err)
    if (brokenAnswer(err)) {
      throw new ToolFailure('IO_ERROR', `${url.host} answered with a broken HTTP response: ${(err as Error).message}`,
        { url: withoutCredentials(url).href, reason: 'bad_answer', ...(code !== undefined ? { errno: code } : {}) }, { retryable: false, cause: err })
    }
    const tls = tlsFailureOf(err)
    if (tls !== undefined) {
      throw new ToolFailure('IO_ERROR', `${url.host} failed the TLS handshake (${tls}): ${(err as Error).message}`,
        { url: withoutCredentials(url).href, reason: 'tls_error', errno: tls }, { retryable: false, cause: err })
    }
    throw new ToolFailure(
      errnoFamily(code) === 'timeout' ? 'TIMEOUT' : 'IO_ERROR',
      `The request to ${url.host} failed: ${(err as Error).message}`,
      { url: withoutCredentials(url).href, ...(code !== undefined ? { errno: code } : {}) },
      { errorType: 'runtime', cause: err }
    )
  }
}

async function readResponse(response: Dispatcher.ResponseData, url: URL, redirects: number, maxBytes: number) {
  const contentType = header(response.headers, 'content-type') ?? ''
  const encoding = (header(response.headers, 'content-encoding') ?? '').trim().toLowerCase()
  const decoder = encoding === '' || encoding === 'identity' ? null : Object.hasOwn(decoders, encoding) ? decoders[encoding]?.() : undefined
  const textual = decoder !== undefined && (contentType === '' || textTypes.test(contentType))
  if (!textual) {
    // Nothing of it is shown: not a byte more is read.
    await response.body.dump({ limit: 0 }).catch(() => {})
    const what = decoder === undefined ? `Content encoded as ${encoding}` : `Binary content (${contentType})`
    return { url: url.href, status: response.statusCode, headers: response.headers, body: null, note: `${what} is not shown.`, truncated: false, redirects }
  }
  const chunks: Buffer[] = []
  let kept = 0
  let seen = 0
  // Decoded as it arrives and read only up to the cap, so a small compressed body that expands to
  // gigabytes (a decompression bomb) costs no more than maxBytes and the bytes it took to reach them.
  const source: AsyncIterable<Buffer> = decoder ? response.body.pipe(decoder) : response.body
  response.body.once('error', (err) => decoder?.destroy(err))
  let received = 0
  if (decoder) response.body.on('data', (chunk: Buffer) => (received += chunk.length))
  try {
    for await (const chunk of source) {
      seen += chunk.length
      const part = chunk.subarray(0, Math.max(0, maxBytes - kept))
      chunks.push(part)
      kept += part.length
      if (seen > maxBytes) break
    }
  } catch (err) {
    if (!decoder || response.body.errored) throw err
    // Nothing received is an empty body, not a bad encoding: a HEAD, 204 or 304 answer names its encoding but has none.
    if (received > 0) {
      throw new ToolFailure('IO_ERROR', `The body from ${url.host} is not valid ${encoding}: ${(err as Error).message}`,
        { url: url.href, encoding, reason: 'bad_encoding' }, { retryable: false, cause: err })
    }
  } finally {
    response.body.destroy()
  }
  const cut = seen > kept
  const text = utf8Prefix(Buffer.concat(chunks), maxBytes)
  const result = { url: url.href, status: response.statusCode, headers: response.headers, body: text, truncated: cut, redirects }
  if (!cut && Buffer.byteLength(JSON.stringify(result)) <= maxBytes) return result
  // What is left for the body once the rest of the result and the note are written.
  const room = maxBytes - Buffer.byteLength(JSON.stringify({ ...result, body: '', truncated: true })) - NOTE_ROOM
  const shown = jsonFittingPrefix(text, room)
  // Reading stopped at the cap: the size is known only from an unencoded body's Content-Length.
  const length = Number(header(response.headers, 'content-length'))
  const total = !cut ? Buffer.byteLength(text) : decoder === null && Number.isSafeInteger(length) ? length : null
  return { ...result, body: shown + truncationNote(Buffer.byteLength(shown), total), truncated: true }
}

/** Bytes the truncation note takes in JSON, with room to spare. */
const NOTE_ROOM = 100

/** The content encodings http_fetch decodes (RFC 9110 8.4.1; x-gzip is gzip's old name). */
const decoders: Readonly<Record<string, () => Transform>> = {
  gzip: () => createGunzip(),
  'x-gzip': () => createGunzip(),
  deflate: () => createInflate(),
  br: () => createBrotliDecompress()
}

function header(headers: Dispatcher.ResponseData['headers'], name: string): string | undefined {
  const value = headers[name]
  return Array.isArray(value) ? value[0] : value
}
