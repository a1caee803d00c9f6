import { randomBytes } from 'node:crypto'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import type { Redis } from 'ioredis'
import { ApiError } from './errors.ts'

export interface SharedStreamCapOptions {
  redis: Redis
  /** Prefix of the Redis keys, per deployment. */
  namespace: string
  /** Open SSE streams one API key may hold across every process (AGENTD_MAX_STREAMS_PER_KEY). */
  max: number
}

/** How long a stream's slot holds without a refresh: a process that dies frees its slots after this. */
const SLOT_TTL_MS = 30_000

/**
 * Drops expired slots, then takes one if fewer than max are held: atomic in Redis, so processes
 * racing for the last slot get one each at most.
 */
const ACQUIRE = `
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ${SLOT_TTL_MS})
return 1`

/** The requests that open an event stream: GET …/events (unless JSON only) and POST …/messages with Accept: text/event-stream. */
function opensStream(request: FastifyRequest): boolean {
  const accept = (request.headers.accept ?? '').toLowerCase()
  const url = request.routeOptions.url
  if (request.method === 'GET' && url === '/v1/sessions/:id/events') return !(accept.includes('application/json') && !accept.includes('text/event-stream'))
  return request.method === 'POST' && url === '/v1/sessions/:id/messages' && accept.includes('text/event-stream')
}

/**
 * The per-key cap on open SSE streams, counted in Redis across every process (AGENTD_REDIS_URL).
 * Each stream holds a slot (a sorted-set member whose score is its expiry), refreshed while it is
 * open and removed when its connection closes; a process that dies stops refreshing, and its
 * slots lapse. Each process's own cap still applies in front of this one. Should Redis fail, the
 * stream opens: the cap protects capacity, it is not worth an outage.
 */
export const sharedStreamCapPlugin = fp(
  async (app: FastifyInstance, opts: SharedStreamCapOptions) => {
    app.addHook('preHandler', async (request, reply) => {
      if (!opensStream(request)) return
      const key = `${opts.namespace}streams:${request.keyId}`
      const member = `${request.id}:${randomBytes(6).toString('hex')}`
      const now = Date.now()
      let acquired: unknown
      try {
        acquired = await opts.redis.eval(ACQUIRE, 1, key, String(now), String(now + SLOT_TTL_MS), member, String(opts.max))
      } catch (err) {
        request.log.warn({ err }, 'shared stream cap unavailable (Redis); the stream opens uncounted')
        return
      }
      if (acquired !== 1) {
        throw new ApiError('LIMIT_EXCEEDED', `This API key has ${opts.max} event streams open, the most it may (AGENTD_MAX_STREAMS_PER_KEY)`, {
          limit: 'streamsPerKey', max: opts.max
        })
      }
      const refresh = setInterval(() => {
        opts.redis.zadd(key, 'XX', String(Date.now() + SLOT_TTL_MS), member).catch(() => undefined)
      }, SLOT_TTL_MS / 3)
      refresh.unref()
      reply.raw.once('close', () => {
        clearInterval(refresh)
        opts.redis.zrem(key, member).catch(() => undefined)
      })
    })
  },
  { name: 'agentd-shared-stream-cap', dependencies: ['agentd-auth'] }
)
