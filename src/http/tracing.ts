import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import type { Tracing } from '../telemetry/tracing.ts'

declare module 'fastify' {
  interface FastifyRequest {
    /** The W3C traceparent of this request's span (a child of the caller's, if sent); undefined when tracing is off. */
    traceparent: string | undefined
  }
}

/**
 * A server span per HTTP request, continuing an incoming W3C `traceparent`. The span ends when
 * the response is closed, so hijacked SSE replies are covered too; request log lines get the trace ID.
 */
export const tracingPlugin = fp(
  async (app: FastifyInstance, options: { tracing: Tracing }) => {
    const { tracing } = options
    app.decorateRequest('traceparent', undefined)
    if (!tracing.enabled) return

    app.addHook('onRequest', async (request: FastifyRequest, reply) => {
      traceRequest(tracing, request, reply)
    })
  },
  { name: 'agentd-tracing' }
)

/**
 * Starts the request's span, which ends when its response closes. Also called by the router's
 * frameworkErrors handler: a URL the router refuses (bad percent-encoding, a path parameter too
 * long) is answered before any hook runs, and such requests had no span at all.
 */
export function traceRequest(tracing: Tracing, request: FastifyRequest, reply: FastifyReply): void {
  if (!tracing.enabled) return
  const span = tracing.startRequest(request.headers, { method: request.method, path: request.url.split('?')[0] ?? '', requestId: request.id })
  request.traceparent = span.traceparent
  request.log = request.log.child({ traceId: span.traceId })
  reply.log = request.log
  // A response closed before its head went out (the client left a ?wait=true request) sent no
  // status: res.statusCode is then Node's default 200, which made an abandoned request a success.
  reply.raw.once('close', () => span.end({ route: request.routeOptions.url, statusCode: reply.raw.headersSent ? reply.raw.statusCode : null }))
}
