import { TextDecoder } from 'node:util'
import cors from '@fastify/cors'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { jsonDepth, MAX_JSON_DEPTH } from '../json-depth.ts'
import { loneSurrogateAt } from '../whole-chars.ts'
import { ApiError, validationError } from './errors.ts'

export interface SecurityOptions {
  /** Browser origins CORS allows ('*' for any); empty leaves CORS off. */
  corsOrigins: readonly string[]
  /** Strict-Transport-Security max-age in seconds; 0 sends no header. */
  hstsMaxAge: number
}

/**
 * Request headers a browser client may send cross-origin: the ones the API reads, and the W3C
 * trace context that browser tracing adds (a preflight that refused it would block the request).
 */
export const CORS_ALLOWED_HEADERS = ['Authorization', 'Content-Type', 'Idempotency-Key', 'Last-Event-ID', 'X-Request-Id', 'traceparent', 'tracestate']
/** Response headers a browser client may read cross-origin: every one the OpenAPI document declares. */
export const CORS_EXPOSED_HEADERS = ['X-Request-Id', 'Retry-After', 'Idempotent-Replayed', 'X-RateLimit-Limit', 'X-RateLimit-Remaining', 'X-RateLimit-Reset']

/** The `origin` option of @fastify/cors for AGENTD_CORS_ORIGINS: '*' grants any origin, a list echoes the listed ones. */
const corsOriginOption = (corsOrigins: readonly string[]): '*' | string[] => (corsOrigins.includes('*') ? '*' : [...corsOrigins])

/**
 * The CORS headers of an answer given outside Fastify's hooks (written on the socket, or a URL the
 * router refused), which securityPlugin's @fastify/cors never sees: the ones @fastify/cors, as
 * registered there, gives an answer to a request from `origin`, so a browser client can read the
 * error envelope. `null` when Node refused the connection before there was a request, so no Origin:
 * under '*' the grant needs none; under a list of origins there is none to echo, and the answer
 * stays unreadable to a browser (nothing is added).
 */
export function corsHeaders(corsOrigins: readonly string[], origin: string | null | undefined): Record<string, string> {
  if (corsOrigins.length === 0) return {}
  const option = corsOriginOption(corsOrigins)
  const exposed = { 'access-control-expose-headers': CORS_EXPOSED_HEADERS.join(', ') }
  if (option === '*') return { 'access-control-allow-origin': '*', ...exposed }
  if (origin === null) return {}
  // As @fastify/cors: Vary on every answer (it depends on the Origin), the grant only to a listed one.
  return { vary: 'Origin', ...(origin !== undefined && option.includes(origin) ? { 'access-control-allow-origin': origin } : {}), ...exposed }
}

/** Responses are JSON or SSE: nothing in them may load, run, frame or submit anything. */
const API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
/**
 * The Swagger UI at /docs loads its own scripts and styles, sets inline styles, shows data: images
 * and calls the API (Try it out); it still may not be framed or load anything from elsewhere.
 */
const DOCS_CSP =
  "default-src 'self'; script-src 'self'; script-src-attr 'none'; style-src 'self' 'unsafe-inline'; " +
  "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; object-src 'none'; " +
  "frame-ancestors 'none'; base-uri 'self'; form-action 'self'"

/**
 * Where a parsed body holds a key that could rewrite an object's prototype once merged or copied
 * (`__proto__`, or `constructor` holding `prototype`); null when it holds none.
 */
export function pollutionPath(value: unknown, path = 'body'): string | null {
  if (!value || typeof value !== 'object') return null
  for (const [key, child] of Object.entries(value)) {
    if (key === '__proto__') return `${path}.__proto__`
    if (key === 'constructor' && child && typeof child === 'object' && Object.hasOwn(child, 'prototype')) return `${path}.constructor.prototype`
    const found = pollutionPath(child, Array.isArray(value) ? `${path}[${key}]` : `${path}.${key}`)
    if (found) return found
  }
  return null
}

/** The decoder of nearly every body, made once (a decode without `stream` leaves it ready for the next). */
const UTF8 = new TextDecoder('utf-8', { fatal: true })

/**
 * A body's text in the charset its Content-Type names (UTF-8 when it names none). Bytes that are
 * not valid in it are refused: decoded leniently, they would be kept as U+FFFD, the client's text lost.
 */
function decodeBody(raw: Buffer, contentType: string | undefined): string {
  const charset = /;\s*charset\s*=\s*"?([^";\s]+)"?/i.exec(contentType ?? '')?.[1] ?? 'utf-8'
  let decoder = UTF8
  try {
    if (charset.toLowerCase() !== 'utf-8') decoder = new TextDecoder(charset, { fatal: true })
  } catch {
    throw new ApiError('UNSUPPORTED_MEDIA_TYPE', `charset=${charset} is not a character encoding agentd knows; send the body as application/json in UTF-8`)
  }
  try {
    return decoder.decode(raw)
  } catch {
    throw new ApiError('INVALID_JSON', `The request body is not valid ${charset === 'utf-8' ? 'UTF-8' : charset} text; send it as UTF-8`)
  }
}

/**
 * Refuses a body sent with a Content-Encoding other than identity (RFC 9110 §8.4.1: 415). agentd
 * decodes none: gzip bytes would be answered as "not valid UTF-8", and a mislabelled body that
 * parses as JSON would be taken for the one the client meant; inflating would also let a small
 * body grow past AGENTD_BODY_LIMIT.
 */
function refuseContentCoding(header: string | undefined): void {
  const codings = (header ?? '').split(',').map((coding) => coding.trim().toLowerCase()).filter((coding) => coding !== '' && coding !== 'identity')
  if (codings.length === 0) return
  throw new ApiError('UNSUPPORTED_MEDIA_TYPE', `Content-Encoding: ${codings.join(', ')} is not one agentd decodes; send the body uncompressed`)
}

const SURROGATE_ESCAPE = /\\u[dD][89a-fA-F]/
const wellFormed = (text: string) => loneSurrogateAt(text) < 0

/**
 * Where a parsed body holds a string (or key) with a lone surrogate; null when it holds none.
 * The stores keep text as UTF-8, which has no such code point: it would come back as U+FFFD.
 */
function loneSurrogatePath(value: unknown, path = 'body'): string | null {
  if (typeof value === 'string') return wellFormed(value) ? null : path
  if (!value || typeof value !== 'object') return null
  for (const [key, child] of Object.entries(value)) {
    const at = Array.isArray(value) ? `${path}[${key}]` : `${path}.${key}`
    if (!wellFormed(key)) return at
    const found = loneSurrogatePath(child, at)
    if (found) return found
  }
  return null
}

export const pathOf = (request: FastifyRequest) => request.url.split('?')[0] ?? ''
const isDocs = (path: string) => path === '/docs' || path.startsWith('/docs/')

/**
 * CORS for browser clients (AGENTD_CORS_ORIGINS), the response headers of a JSON/SSE API, and a
 * nesting limit on JSON bodies. Register it before auth: a preflight carries no Authorization
 * header, so CORS answers it first.
 */
export const securityPlugin = fp(
  async (app: FastifyInstance, opts: SecurityOptions) => {
    if (opts.corsOrigins.length > 0) {
      await app.register(cors, {
        origin: corsOriginOption(opts.corsOrigins),
        methods: ['GET', 'HEAD', 'POST', 'DELETE'],
        allowedHeaders: CORS_ALLOWED_HEADERS,
        exposedHeaders: CORS_EXPOSED_HEADERS,
        // Bearer keys, not cookies: the browser never needs to send credentials.
        credentials: false,
        maxAge: 600,
        // Otherwise an OPTIONS without Origin gets a text/plain 400 outside the error envelope.
        strictPreflight: false
      })
    }

    // Fastify's own JSON parser (secure-json-parse, __proto__ and constructor.prototype refused), behind a depth check.
    const parseJson = app.getDefaultJsonParser('error', 'error')
    app.removeContentTypeParser('application/json')
    app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, raw, done) => {
      // Zero bytes are no body, whatever the Content-Type says (clients that set it on every request).
      if ((raw as Buffer).length === 0) return done(null, undefined)
      let body: string
      try {
        refuseContentCoding(request.headers['content-encoding'])
        body = decodeBody(raw as Buffer, request.headers['content-type'])
      } catch (err) {
        return done(err as ApiError, undefined)
      }
      if (jsonDepth(body as string, MAX_JSON_DEPTH) > MAX_JSON_DEPTH) {
        const message = `nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels`
        done(validationError([{ field: 'body', message, keyword: 'maxDepth' }]), undefined)
        return
      }
      parseJson(request, body as string, (err, parsed) => {
        if (!err) {
          // Decoded text is well-formed; only a \uD800-\uDFFF escape can make a lone surrogate.
          const field = SURROGATE_ESCAPE.test(body) ? loneSurrogatePath(parsed) : null
          if (field === null) return done(null, parsed)
          return done(validationError([{ field, message: 'holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair), which no stored text can keep', keyword: 'wellFormed' }]), undefined)
        }
        // secure-json-parse refuses valid JSON that carries a prototype key; say so, not "not valid JSON".
        let plain: unknown
        try {
          plain = JSON.parse(body as string)
        } catch {
          return done(err, undefined)
        }
        const field = pollutionPath(plain) ?? 'body'
        done(validationError([{ field, message: 'is a key agentd refuses: it could change the prototype of objects that copy the body (prototype pollution); rename or remove it', keyword: 'forbiddenKey' }],
          `The body is valid JSON, but ${field} is a key agentd refuses because it could change object prototypes (prototype pollution); rename or remove it`), undefined)
      })
    })

    app.addHook('onRequest', async (request: FastifyRequest, reply: FastifyReply) => {
      setSecurityHeaders(request, reply, opts.hstsMaxAge)
      // RFC 9112 §3.2: a server must answer 400 to an HTTP/1.1 request without Host (Node no longer does, see app.ts).
      if (request.raw.httpVersion === '1.1' && request.headers.host === undefined) {
        throw new ApiError('VALIDATION_ERROR', 'An HTTP/1.1 request needs a Host header', {
          fields: [{ field: 'headers.host', message: 'is required in an HTTP/1.1 request', keyword: 'required' }]
        }, { connection: 'close' })
      }
    })
  },
  { name: 'agentd-security' }
)

/**
 * The headers every answer carries. The security plugin sets them as each request comes; an answer
 * the router gives before any hook (a malformed URL) gets them from here too.
 */
export function setSecurityHeaders(request: FastifyRequest, reply: FastifyReply, hstsMaxAge: number): void {
  for (const [name, value] of Object.entries(securityHeaders(pathOf(request), hstsMaxAge))) reply.header(name, value)
}

/**
 * The security headers of an answer to `path`, for answers written on the socket (a request Node
 * could not read has no path: '' gets the API's).
 */
export function securityHeaders(path: string, hstsMaxAge: number): Record<string, string> {
  const headers: Record<string, string> = {
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
    'x-frame-options': 'DENY',
    'content-security-policy': isDocs(path) ? DOCS_CSP : API_CSP
  }
  // Sessions, messages and events are private to a tenant: no cache may keep them.
  if (path.startsWith('/v1/')) headers['cache-control'] = 'no-store'
  if (hstsMaxAge > 0) headers['strict-transport-security'] = `max-age=${hstsMaxAge}`
  return headers
}
