import { createHash, timingSafeEqual } from 'node:crypto'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { ApiError } from './errors.ts'

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
  async (app: FastifyInstance, opts: { apiKeys: ReadonlyMap<string, string>; openPaths?: string[] }) => {
    const keys = [...opts.apiKeys].map(([key, tenant]) => ({ digest: digest(key), tenant, id: digest(key).toString('hex').slice(0, 12) }))
    const open = new Set([...OPEN_PATHS, ...(opts.openPaths ?? [])])
    app.decorateRequest('tenant', DEFAULT_TENANT)
    app.decorateRequest('keyId', 'anonymous')
    if (keys.length === 0) return

    app.addHook('onRequest', async (request: FastifyRequest) => {
      const path = request.url.split('?')[0] ?? ''
      if (open.has(path) || [...open].some((p) => p.endsWith('/*') && path.startsWith(p.slice(0, -1)))) return
      const header = request.headers.authorization
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
