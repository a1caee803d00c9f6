import rateLimit from '@fastify/rate-limit'
import type { Redis } from 'ioredis'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { ApiError } from './errors.ts'

export interface RateLimitOptions {
  /** Requests per window per caller; 0 turns rate limiting off. */
  max: number
  windowMs: number
  /** True when API keys are configured: /v1 callers are counted per tenant, not per IP. */
  perTenant: boolean
  /** Counts in Redis under this key prefix, shared by every process (AGENTD_REDIS_URL); null counts in this process. */
  redis: { client: Redis; namespace: string } | null
}

/** Probes must answer however busy the service is. */
const EXEMPT = new Set(['/healthz', '/readyz'])

const pathOf = (request: FastifyRequest) => request.url.split('?')[0] ?? ''

/**
 * Caps requests per window (AGENTD_RATE_LIMIT_MAX per AGENTD_RATE_LIMIT_WINDOW_MS), per tenant when
 * keys are configured and per client IP otherwise; over it, 429 RATE_LIMITED with Retry-After.
 * With Redis the counts are shared by every process; should Redis fail, requests pass uncounted
 * rather than fail. Register it after auth and before the routes it covers (it attaches itself to each new route).
 */
export const rateLimitPlugin = fp(
  async (app: FastifyInstance, opts: RateLimitOptions) => {
    if (opts.max === 0) return
    const seconds = Math.ceil(opts.windowMs / 1000)
    await app.register(rateLimit, {
      max: opts.max,
      timeWindow: opts.windowMs,
      // preParsing runs after the auth hook (onRequest), so request.tenant is known, and before
      // the body is read, so a caller over its limit costs no parsing.
      hook: 'preParsing',
      ...(opts.redis ? { redis: opts.redis.client, nameSpace: `${opts.redis.namespace}rate-limit:`, skipOnError: true } : {}),
      allowList: (request) => EXEMPT.has(pathOf(request)),
      // Paths outside /v1 (docs, OpenAPI, metrics) are open without a key, so their callers are
      // counted by IP and can never spend a tenant's budget.
      keyGenerator: (request) =>
        opts.perTenant && pathOf(request).startsWith('/v1/') ? `tenant:${request.tenant}` : `ip:${request.ip}`,
      errorResponseBuilder: (_request, context) =>
        new ApiError('RATE_LIMITED', `Too many requests: at most ${context.max} per ${seconds} s; retry in ${context.after}`, {
          limit: context.max,
          windowMs: opts.windowMs
        })
    })
  },
  { name: 'agentd-rate-limit', dependencies: ['agentd-auth', 'agentd-error-envelope'] }
)
