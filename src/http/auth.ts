import { createHash, timingSafeEqual } from 'node:crypto'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { ApiError } from './errors.ts'
import { keyIdOf, TOKEN_PATH, type StreamTokens } from './stream-tokens.ts'

declare module 'fastify' {
  interface FastifyRequest {
    /** The tenant the caller's API key belongs to; 'default' when auth is off. */
    tenant: string
    /** Which key the caller used (a short digest, never the key), for per-key limits; 'anonymous' when auth is off. */
    keyId: string
  }
}

export const DEFAULT_TENANT = 'default'

const digest = (text: string) => createHash('sha256').update(text).digest()

/** Paths anyone may call, keys or not. */
const OPEN_PATHS = new Set(['/healthz', '/readyz'])

/**
 * Bearer API keys (AGENTD_API_KEYS). Keys are compared as SHA-256 digests with timingSafeEqual,
 * against every configured key, so neither a key's length nor its position leaks through timing.
 */
export const authPlugin = fp(
  async (app: FastifyInstance, opts: { apiKeys: ReadonlyMap<string, string>; openPaths?: string[]; streamTokens?: StreamTokens }) => {
    const keys = [...opts.apiKeys].map(([key, tenant]) => ({ digest: digest(key), tenant, id: keyIdOf(key) }))
    const open = new Set([...OPEN_PATHS, ...(opts.openPaths ?? [])])
    app.decorateRequest('tenant', DEFAULT_TENANT)
    app.decorateRequest('keyId', 'anonymous')
    if (keys.length === 0) return

    app.addHook('onRequest', async (request: FastifyRequest) => {
      const path = request.url.split('?')[0] ?? ''
      if (open.has(path) || [...open].some((p) => p.endsWith('/*') && path.startsWith(p.slice(0, -1)))) return
      const header = request.headers.authorization
      if (header === undefined && opts.streamTokens && request.method === 'GET') {
        const grant = streamTokenGrant(request, path, opts.streamTokens)
        if (grant) {
          request.tenant = grant.tenant
          request.keyId = grant.keyId
          return
        }
      }
      const match = typeof header === 'string' ? /^Bearer\s+(\S+)\s*$/i.exec(header) : null
      if (!match) throw new ApiError('UNAUTHORIZED', undefined, undefined, { 'www-authenticate': 'Bearer' })
      const given = digest(match[1] as string)
      let matched: (typeof keys)[number] | undefined
      for (const key of keys) if (timingSafeEqual(key.digest, given)) matched = key
      if (matched === undefined) {
        throw new ApiError('UNAUTHORIZED', 'The API key is not valid', undefined, { 'www-authenticate': 'Bearer error="invalid_token"' })
      }
      request.tenant = matched.tenant
      request.keyId = matched.id
    })
  },
  { name: 'agentd-auth' }
)

/**
 * SPEC 14: the events route also takes `?token=` (a browser's EventSource cannot send
 * Authorization). A token that is there but not valid is a 401 of its own, not "no key".
 */
function streamTokenGrant(request: FastifyRequest, path: string, tokens: StreamTokens) {
  const sessionId = TOKEN_PATH.exec(path)?.[1]
  const token = (request.query as Record<string, unknown> | undefined)?.token
  if (sessionId === undefined || typeof token !== 'string') return null
  const grant = tokens.verify(token, sessionId)
  if (!grant) {
    throw new ApiError('UNAUTHORIZED', 'The stream token is not valid for this session or has expired; ask for a new one',
      undefined, { 'www-authenticate': 'Bearer error="invalid_token"' })
  }
  return grant
}
