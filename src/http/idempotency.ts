import { createHash } from 'node:crypto'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { isFinal } from '../agent/wait-for-run.ts'
import { RETRY_FRAME, SSE_HEADERS } from '../events/sse.ts'
import type { Store } from '../store/store.ts'
import { wantsEventStream } from './accept.ts'
import { ApiError, resumeBeyondLastEvent, validationError } from './errors.ts'

declare module 'fastify' {
  interface FastifyRequest {
    /** Set when this POST claimed an Idempotency-Key; routes that answer outside onSend (SSE) complete it. */
    idempotency: { key: string; complete(status: number, body: unknown): Promise<void> } | null
  }
}

/** How a stored SSE answer is kept: the run it streamed, so a replay can stream that run again. */
export interface StreamedAnswer {
  stream: { sessionId: string; runId: string }
  message: unknown
  run: unknown
}

const KEY = /^[\x21-\x7e]{1,255}$/
/** Answers that say "try again later" are not kept: the retry with the same key should really retry. */
const NOT_KEPT = (status: number) => status >= 500 || status === 409 || status === 429

/**
 * A JSON object's members have no order (RFC 8259): a retry that sends them in another order (a
 * client's hash map, a restarted client) is the same request, so the fingerprint sorts them.
 */
const sortedKeys = (_key: string, value: unknown) =>
  value && typeof value === 'object' && !Array.isArray(value)
    ? Object.fromEntries(Object.entries(value).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))
    : value

/** What identifies a request for its key: method, route, parameters and body, hashed. */
const fingerprintOf = (request: FastifyRequest, replacer?: (key: string, value: unknown) => unknown): string =>
  createHash('sha256')
    .update(JSON.stringify([request.method, request.routeOptions.url, request.params, request.query, request.body ?? null], replacer))
    .digest('hex')

/** How many `done` events doneSeen reads at a time (one per run of the session after the resume point). */
const DONE_PAGE = 500

/**
 * Whether the run's done is at or before seq `after`: the run has ended (a run the store holds as
 * ended has its done, they commit together) and no done of it comes after `after`. Other runs'
 * dones may (earlier runs' when `after` is before them, later runs'), so they are read past.
 */
async function doneSeen(store: Store, stream: StreamedAnswer['stream'], after: number): Promise<boolean> {
  const run = await store.getRun(stream.sessionId, stream.runId)
  if (!run || !isFinal(run.status)) return false
  for (let from = after; ;) {
    const dones = await store.listEvents(stream.sessionId, { after: from, types: ['done'], limit: DONE_PAGE })
    if (dones.some((event) => event.runId === stream.runId)) return false
    const last = dones.at(-1)
    if (!last || dones.length < DONE_PAGE) return true
    from = last.seq
  }
}

export const IDEMPOTENCY_RETENTION_MS = 24 * 60 * 60 * 1000
/**
 * How long an in-progress claim holds without renewal. Its holder renews it while it works, so a
 * claim outlives its holder (a crash, kill -9) by at most this long: then a retry may take it.
 */
export const IDEMPOTENCY_LEASE_MS = 30_000

export interface IdempotencyOptions {
  store: Store
  retentionMs?: number
  /** How long an in-progress claim holds without renewal (tests shorten it). */
  leaseMs?: number
  /** Streams a run's events again, those after seq `after`, for the replay of an SSE answer. */
  replayStream(request: FastifyRequest, reply: FastifyReply, answer: StreamedAnswer, after: number): void
}

/**
 * Idempotency-Key on every POST (SPEC 3): the first request with a key is processed and its
 * answer kept for 24 h per tenant; the same key and request again get that answer again; the
 * same key with another request is 422; while the first is still being processed, 409.
 */
export const idempotencyPlugin = fp(
  async (app: FastifyInstance, opts: IdempotencyOptions) => {
    const { store } = opts
    const retentionMs = opts.retentionMs ?? IDEMPOTENCY_RETENTION_MS
    const leaseMs = opts.leaseMs ?? IDEMPOTENCY_LEASE_MS
    const renewals = new WeakMap<FastifyRequest, NodeJS.Timeout>()
    // However the request ended, its claim stops being renewed (an unfinished one then lapses).
    app.addHook('onResponse', async (request) => clearInterval(renewals.get(request)))
    app.decorateRequest('idempotency', null)

    const purge = () =>
      store.purgeIdempotency(new Date(Date.now() - retentionMs)).catch((err: unknown) => app.log.warn({ err }, 'idempotency purge failed'))
    await purge()
    const timer = setInterval(purge, Math.min(retentionMs, 60 * 60 * 1000))
    timer.unref()
    app.addHook('onClose', async () => clearInterval(timer))

    app.addHook('preHandler', async (request, reply) => {
      if (request.method !== 'POST') return
      const key = request.headers['idempotency-key']
      if (key === undefined) return
      if (typeof key !== 'string' || !KEY.test(key)) {
        throw validationError([{ field: 'headers.idempotency-key', message: 'must be 1 to 255 visible ASCII characters', keyword: 'pattern' }],
          'Idempotency-Key must be 1 to 255 visible ASCII characters')
      }
      const fingerprint = fingerprintOf(request, sortedKeys)
      const tenant = request.tenant
      const claimedAt = Date.now()
      const claim = (print: string) => store.claimIdempotency({
        tenant, key, fingerprint: print, createdAt: new Date(claimedAt).toISOString(), leaseUntil: new Date(claimedAt + leaseMs).toISOString()
      })
      let outcome = await claim(fingerprint)
      if (outcome.state === 'mismatch') {
        // Keys claimed before fingerprints sorted members were hashed in the body's own order: a
        // client retrying across that upgrade (within the retention) is still sending the same request.
        const asSent = fingerprintOf(request)
        if (asSent !== fingerprint) outcome = await claim(asSent)
      }
      if (outcome.state === 'in_progress') throw new ApiError('IDEMPOTENCY_IN_PROGRESS')
      if (outcome.state === 'mismatch') throw new ApiError('IDEMPOTENCY_KEY_REUSED')
      if (outcome.state === 'completed') {
        const body = outcome.body as Partial<StreamedAnswer> | null
        if (body && typeof body === 'object' && body.stream) {
          const answer = body as StreamedAnswer
          if (wantsEventStream(request.headers.accept, false)) {
            // The run's events went with its session: their stream would wait for a `done` that never comes.
            const { sessionId } = answer.stream
            const session = await store.getSession(request.tenant, sessionId)
            if (!session) throw new ApiError('SESSION_NOT_FOUND', `No session ${sessionId}`)
            // A client that reconnects by sending the same POST again (fetch-event-source does) says
            // where it got to (the route's schema checked the header): it must not get that again.
            const after = Number(request.headers['last-event-id'] ?? 0)
            if (after > session.lastSeq) throw resumeBeyondLastEvent('headers.last-event-id', after, session.lastSeq)
            reply.header('idempotent-replayed', 'true')
            // One that got as far as the run's done has had the whole stream: a stream from there
            // would wait for a done that has passed, open until the client gives up.
            if (await doneSeen(store, answer.stream, after)) return reply.status(200).headers(SSE_HEADERS).send(RETRY_FRAME)
            opts.replayStream(request, reply, answer, after)
            return reply
          }
          reply.header('idempotent-replayed', 'true')
          return reply.status(202).send({ message: answer.message, run: answer.run })
        }
        reply.header('idempotent-replayed', 'true')
        return reply.status(outcome.status).send(body)
      }
      let settled = false
      const renewal = setInterval(() => {
        store.renewIdempotency(tenant, key, new Date(Date.now() + leaseMs).toISOString())
          .catch((err: unknown) => request.log.warn({ err }, 'could not renew an idempotency claim'))
      }, Math.max(10, Math.floor(leaseMs / 3)))
      renewal.unref()
      renewals.set(request, renewal)
      request.idempotency = {
        key,
        complete: async (status, body) => {
          if (settled) return
          settled = true
          clearInterval(renewal)
          if (NOT_KEPT(status)) await store.releaseIdempotency(tenant, key)
          else await store.completeIdempotency(tenant, key, { status, body })
        }
      }
    })

    app.addHook('onSend', async (request, reply, payload) => {
      if (!request.idempotency) return payload
      let body: unknown = null
      if (typeof payload === 'string' && payload.length > 0) {
        try {
          body = JSON.parse(payload)
        } catch {
          body = payload
        }
      }
      await request.idempotency.complete(reply.statusCode, body)
      return payload
    })
  },
  { name: 'agentd-idempotency', dependencies: ['agentd-auth'] }
)
