import type { IncomingMessage, ServerResponse } from 'node:http'
import type { FastifyBaseLogger, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import type { RequestTrace, Tracing } from '../telemetry/tracing.ts'

/** Each request's span, from its logger's creation (tracedRequestLogger) until traceRequest takes it up. */
const started = new WeakMap<IncomingMessage, RequestTrace>()

/** Marks a request's logger, whose lines have their request's trace ID bound. */
const CARRIES_TRACE = Symbol('agentd.carriesTrace')

/**
 * Fastify's childLoggerFactory: starts the request's span as its logger is made, so that every
 * line of the request has the trace ID. Started in onRequest, the span came after Fastify's
 * `incoming request` line, which had none.
 */
export function tracedRequestLogger(tracing: Tracing) {
  return (logger: FastifyBaseLogger, bindings: Record<string, unknown>, options: object, raw: IncomingMessage): FastifyBaseLogger => {
    const requestId = String(bindings['reqId'] ?? '')
    const span = tracing.startRequest(raw.headers, { method: raw.method ?? '', path: (raw.url ?? '').split('?')[0] ?? '', requestId })
    started.set(raw, span)
    const child = logger.child({ ...bindings, traceId: span.traceId }, options)
    // pino's children inherit from their parent, so the mark holds for the request's children too.
    Object.defineProperty(child, CARRIES_TRACE, { value: true })
    return child
  }
}

/**
 * The pino mixin of a traced app: the active span's IDs on each line, but a request's. A line of a
 * stream that a run of another trace ended (its `request completed`) had both trace IDs, two
 * `traceId` keys in one line, the run's last, which parsers kept.
 */
export function traceLogMixin(tracing: Tracing) {
  return (_merge: object, _level: number, logger: object): object => (CARRIES_TRACE in logger ? {} : tracing.logFields())
}

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
 * The status of responses written straight to the socket (the 408 of a body too slow): it went out
 * though Node's response sent no head, and the error handler may set another on it afterwards.
 */
const writtenOnSocket = new WeakMap<ServerResponse, number>()

/** Says that the reply's status, as set now, was written to the socket past Node's response. */
export function answeredOnSocket(reply: FastifyReply): void {
  writtenOnSocket.set(reply.raw, reply.statusCode)
}

/**
 * Takes up the request's span (started with its logger), which ends when its response closes. Also called by the router's
 * frameworkErrors handler: a URL the router refuses (bad percent-encoding, a path parameter too
 * long) is answered before any hook runs, and such requests had no span at all.
 */
export function traceRequest(tracing: Tracing, request: FastifyRequest, reply: FastifyReply): void {
  if (!tracing.enabled) return
  const span = started.get(request.raw)
  // Once per request: frameworkErrors answers before the hooks, which then do not run.
  if (!span) return
  started.delete(request.raw)
  request.traceparent = span.traceparent
  // A response closed before its head went out (the client left a ?wait=true request) sent no
  // status: res.statusCode is then Node's default 200, which made an abandoned request a success.
  reply.raw.once('close', () => span.end({
    route: request.routeOptions.url, statusCode: writtenOnSocket.get(reply.raw) ?? (reply.raw.headersSent ? reply.raw.statusCode : null)
  }))
}
