import { randomBytes } from 'node:crypto'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import type { Redis } from 'ioredis'
import { wantsEventStream } from './accept.ts'
import { ApiError } from './errors.ts'

export interface SharedStreamCapOptions {
  redis: Redis
  /** Prefix of the Redis keys, per deployment. */
  namespace: string
  /** Open SSE streams one API key may hold across every process (AGENTD_MAX_STREAMS_PER_KEY). */
  max: number
  /** How long a slot holds without a refresh; default SLOT_TTL_MS (tests shorten it). */
  slotTtlMs?: number
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
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]))
return 1`

/** The requests that open an event stream: GET …/events (unless JSON only) and POST …/messages with Accept: text/event-stream. */
function opensStream(request: FastifyRequest): boolean {
  const url = request.routeOptions.url
  if (request.method === 'GET' && url === '/v1/sessions/:id/events') return wantsEventStream(request.headers.accept, true)
  return request.method === 'POST' && url === '/v1/sessions/:id/messages' && wantsEventStream(request.headers.accept, false)
}

/**
 * The per-key cap on open SSE streams, counted in Redis across every process (AGENTD_REDIS_URL).
 * Each stream holds a slot (a sorted-set member whose score is its expiry), refreshed while it is
 * open (one timer for all of them, the set's expiry with them) and removed when its connection closes; a process that dies stops refreshing, and its
 * slots lapse. Each process's own cap still applies in front of this one. Should Redis fail, the
 * stream opens: the cap protects capacity, it is not worth an outage.
 */
export const sharedStreamCapPlugin = fp(
  async (app: FastifyInstance, opts: SharedStreamCapOptions) => {
    const ttlMs = opts.slotTtlMs ?? SLOT_TTL_MS
    /**
     * The slots this process holds (member → its key), refreshed together by one timer: one
     * ZADD per key every third of the TTL, however many streams are open.
     */
    const held = new Map<string, string>()
    const refresh = setInterval(() => {
      if (held.size === 0) return
      const expiry = String(Date.now() + ttlMs)
      const byKey = new Map<string, string[]>()
      for (const [member, key] of held) {
        let args = byKey.get(key)
        if (!args) byKey.set(key, (args = []))
        args.push(expiry, member)
      }
      const batch = opts.redis.pipeline()
      // The set's own expiry moves with its slots: without it the set would lapse a TTL after the
      // last stream opened, and every slot with it, while its streams are still open.
      for (const [key, args] of byKey) batch.zadd(key, 'XX', ...args).pexpire(key, ttlMs)
      batch.exec().catch(() => undefined)
    }, ttlMs / 3)
    refresh.unref()
    app.addHook('onClose', async () => clearInterval(refresh))

    app.addHook('preHandler', async (request, reply) => {
      if (!opensStream(request)) return
      const key = `${opts.namespace}streams:${request.keyId}`
      const member = `${request.id}:${randomBytes(6).toString('hex')}`
      const now = Date.now()
      let acquired: unknown
      try {
        acquired = await opts.redis.eval(ACQUIRE, 1, key, String(now), String(now + ttlMs), member, String(opts.max), String(ttlMs))
      } catch (err) {
        request.log.warn({ err }, 'shared stream cap unavailable (Redis); the stream opens uncounted')
        return
      }
      if (acquired !== 1) {
        throw new ApiError('LIMIT_EXCEEDED', `This API key has ${opts.max} event streams open, the most it may (AGENTD_MAX_STREAMS_PER_KEY)`, {
          limit: 'streamsPerKey', max: opts.max
        })
      }
      held.set(member, key)
      reply.raw.once('close', () => {
        held.delete(member)
        opts.redis.zrem(key, member).catch(() => undefined)
      })
    })
  },
  { name: 'agentd-shared-stream-cap', dependencies: ['agentd-auth'] }
)
