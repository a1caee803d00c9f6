import { Type } from '@sinclair/typebox'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { SSE_HEADERS } from '../events/sse.ts'
import { wantsEventStream } from '../http/accept.ts'
import { resumeBeyondLastEvent } from '../http/errors.ts'
import { errorResponses, ref } from '../schemas/common.ts'
import { EventSchema, EventsHeadersSchema, EventsQuerySchema } from '../schemas/events.ts'
import { SessionParamsSchema } from '../schemas/sessions.ts'
import type { EventChannel } from '../store/store.ts'
import { sessionOr404 } from './views.ts'

const EventPageSchema = Type.Object({
  data: Type.Array(ref(EventSchema)),
  nextAfter: Type.Integer({ minimum: 0, description: 'pass as ?after= to get the next page' })
})

/** GET /v1/sessions/{id}/events: the session's events as SSE (live, resumable) or as JSON pages. */
export const eventRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { store } = app.agentd

  app.get('/v1/sessions/:id/events', {
    schema: {
      tags: ['events'],
      operationId: 'streamEvents',
      summary: 'Stream the session events (SSE, resumable with Last-Event-ID or ?after), or page them as JSON',
      params: SessionParamsSchema,
      querystring: EventsQuerySchema,
      headers: EventsHeadersSchema,
      response: {
        200: {
          description: 'text/event-stream by default; a JSON page with Accept: application/json',
          content: {
            'text/event-stream': { schema: Type.String({ description: 'SSE frames: id, event, data (the Event as JSON)' }) },
            'application/json': { schema: EventPageSchema }
          }
        },
        ...errorResponses(400, 401, 404, 429, 500, 503)
      }
    }
  }, async (request, reply) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    const { query } = request
    // Last-Event-ID wins over ?after: an EventSource opened at `…?after=n` keeps that URL and sends
    // the last seq it received when it reconnects, so ?after there is where it started, the header
    // where it got to (taking ?after would replay everything in between a second time).
    const lastEventId = request.headers['last-event-id']
    const after = lastEventId === undefined ? query.after ?? 0 : Number(lastEventId)
    if (after > session.lastSeq) {
      throw resumeBeyondLastEvent(lastEventId === undefined ? 'querystring.after' : 'headers.last-event-id', after, session.lastSeq)
    }
    const channels = query.channels?.split(',') as EventChannel[] | undefined
    const types = query.types?.split(',')
    if (!wantsEventStream(request.headers.accept, true)) {
      const data = await store.listEvents(session.id, {
        after, limit: query.limit ?? 100, ...(channels ? { channels } : {}), ...(types ? { types } : {})
      })
      return reply.type('application/json').send({ data, nextAfter: data.at(-1)?.seq ?? after })
    }
    if (request.method === 'HEAD') {
      // A stream would never end, and a keep-alive connection's next request would wait behind
      // it: a HEAD gets the stream's head only (written as the stream writes it: no Content-Length).
      const headers: Record<string, string | number | string[] | undefined> = { ...reply.getHeaders(), ...SSE_HEADERS }
      reply.hijack()
      reply.raw.writeHead(200, headers).end()
      return reply
    }
    app.streams.send(reply, request.keyId, { sessionId: session.id, after, channels, types, untilDone: query.until === 'done' })
    return reply
  })
}
