import type { FastifyInstance, FastifyReply } from 'fastify'
import fp from 'fastify-plugin'
import { StreamHub, type StreamHubOptions, type StreamRequest } from '../events/stream-hub.ts'
import { ApiError } from './errors.ts'

/** The SSE streams of this process, as routes and the process owner use them. */
export interface EventStreams {
  /** Throws 429 LIMIT_EXCEEDED when the key holds all its streams, 503 UNAVAILABLE when the server does. */
  assertCapacity(keyId: string): void
  /** Checks capacity, hijacks the reply and streams a session's events over SSE to it. */
  send(reply: FastifyReply, keyId: string, request: Omit<StreamRequest, 'headers'>): void
  /** Ends the open streams of a session (it was deleted: no event will follow). */
  endSession(sessionId: string, reason: string): void
  /** Ends every open stream with a final comment (shutdown). */
  drain(): void
  /** How many streams are open now (metrics). */
  readonly count: number
  /** Bytes written to open streams that their sockets have not taken yet (metrics). */
  readonly heldBytes: number
  /** The most bytes open streams ever held at once (metrics). */
  readonly peakHeldBytes: number
}

declare module 'fastify' {
  interface FastifyInstance {
    streams: EventStreams
  }
}

/** The plugin takes what the hub takes. */
export type StreamsPluginOptions = StreamHubOptions

/** The stream hub as a Fastify plugin: `app.streams`, ended when the app closes. */
export const streamsPlugin = fp(
  async (app: FastifyInstance, opts: StreamsPluginOptions) => {
    const hub = new StreamHub({
      store: opts.store,
      feed: opts.feed,
      maxStreams: opts.maxStreams,
      maxStreamsPerKey: opts.maxStreamsPerKey,
      maxBufferedBytes: opts.maxBufferedBytes,
      maxTotalBufferedBytes: opts.maxTotalBufferedBytes,
      ...(opts.pingIntervalMs ? { pingIntervalMs: opts.pingIntervalMs } : {})
    })

    const streams: EventStreams = {
      assertCapacity(keyId) {
        const refusal = hub.refusal(keyId)
        if (refusal?.limit === 'streams') {
          throw new ApiError('UNAVAILABLE', `The server has ${refusal.open} event streams open, the most it may (AGENTD_MAX_STREAMS); retry later`,
            { limit: 'streams', max: refusal.max }, { 'retry-after': '5' })
        }
        if (refusal) {
          throw new ApiError('LIMIT_EXCEEDED', `This API key has ${refusal.open} event streams open, the most it may (AGENTD_MAX_STREAMS_PER_KEY)`,
            { limit: 'streamsPerKey', max: refusal.max })
        }
      },
      send(reply, keyId, request) {
        this.assertCapacity(keyId)
        // A hijacked reply writes its own head: carry over what hooks set (request ID, CORS, security).
        const headers = reply.getHeaders()
        reply.hijack()
        hub.open(reply.raw, keyId, { ...request, headers }, () => reply.log.debug({ sessionId: request.sessionId }, 'event stream closed'))
      },
      endSession: (sessionId, reason) => hub.endSession(sessionId, reason),
      drain: () => hub.endAll('server shutting down; reconnect with Last-Event-ID'),
      get count() {
        return hub.count
      },
      get heldBytes() {
        return hub.heldBytes
      },
      get peakHeldBytes() {
        return hub.peakHeldBytes
      }
    }
    app.decorate('streams', streams)
    app.addHook('onClose', async () => streams.drain())
  },
  { name: 'agentd-streams' }
)
