import { AjvCompiler, type ValidatorFactory } from '@fastify/ajv-compiler'
import type { Logger, LoggerOptions } from 'pino'
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest, type FastifyServerOptions } from 'fastify'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { defaultRetryPolicy, type RetryPolicy } from './agent/retry.ts'
import type { RunCoordinator } from './agent/run-coordinator.ts'
import { RunManager } from './agent/run-manager.ts'
import type { Config } from './config.ts'
import type { EventBus } from './events/event-bus.ts'
import { EventLog } from './events/event-log.ts'
import { HookRunner } from './hooks/hooks.ts'
import { newId } from './ids.ts'
import { authPlugin } from './http/auth.ts'
import { ApiError, errorEnvelopePlugin, rawErrorAnswer, sendApiError, validationError } from './http/errors.ts'
import { idempotencyPlugin } from './http/idempotency.ts'
import { metricsPlugin } from './http/metrics.ts'
import { openApiPlugin, sharedSchemas } from './http/openapi.ts'
import { rateLimitPlugin } from './http/rate-limit.ts'
import { requestIdFor, requestIdPlugin } from './http/request-id.ts'
import { corsHeaders, pathOf, securityHeaders, securityPlugin, setSecurityHeaders } from './http/security.ts'
import { strictQueryPlugin } from './http/strict-query.ts'
import { streamsPlugin } from './http/streams.ts'
import { answeredOnSocket, traceLogMixin, traceRequest, tracedRequestLogger, tracingPlugin } from './http/tracing.ts'
import { redactStreamToken, StreamTokens } from './http/stream-tokens.ts'
import type { ModelProvider } from './model/types.ts'
import { CONSOLE_PATHS, consoleRoutes } from './routes/console.ts'
import { sharedStreamCapPlugin } from './http/shared-stream-cap.ts'
import { openPorts } from './ports.ts'
import { eventRoutes } from './routes/events.ts'
import { healthRoutes } from './routes/health.ts'
import { messageRoutes } from './routes/messages.ts'
import { sessionRoutes } from './routes/sessions.ts'
import { toolCallRoutes } from './routes/tool-calls.ts'
import { streamTokenRoutes } from './routes/stream-tokens.ts'
import { toolRoutes } from './routes/tools.ts'
import { ClientToolSpecSchema, ToolSchema, WebhookToolSpecSchema } from './schemas/tools.ts'
import { EventSchema } from './schemas/events.ts'
import { MessageSchema, RunSchema } from './schemas/messages.ts'
import { SessionSchema } from './schemas/sessions.ts'
import { ToolCallSchema } from './schemas/tool-calls.ts'
import { openStore } from './store/index.ts'
import { observeStore } from './store/observed.ts'
import type { Store } from './store/store.ts'
import { createTracing } from './telemetry/tracing.ts'
import { ToolCatalog, type ToolCatalogOptions } from './tools/catalog.ts'
import { version } from './version.ts'

/** Mutable service state shared by routes and the process owner (server.ts). */
export interface ServiceState {
  /** Set on SIGTERM: new requests get 503 UNAVAILABLE, /readyz turns 503. */
  draining: boolean
  /** The newest store failure, reported by /readyz until the same call succeeds again or it is 30 s old (src/store/observed.ts). */
  storeFailure: string | null
}

/** Everything the routes use, decorated on the app as `app.agentd`. */
export interface Services {
  config: Readonly<Config>
  store: Store
  model: ModelProvider
  tools: ToolCatalog
  state: ServiceState
  /** Where units of work are committed and their events published. */
  events: EventLog
  /** Live fan-out of committed events (SSE, metrics, waiting for a run). */
  bus: EventBus
  /** Who runs what: queues, ownership and control signals of runs. */
  coordinator: RunCoordinator
  runs: RunManager
  /** Stops taking work (503), gives active runs up to graceMs to finish, then ends them and open streams. */
  drain(graceMs: number): Promise<void>
}

declare module 'fastify' {
  interface FastifyInstance {
    agentd: Services
  }
}

export interface AppOptions {
  config: Readonly<Config>
  /** A store to use instead of opening the configured one (tests); the app does not close it. */
  store?: Store
  model: ModelProvider
  /** Fastify's logger option: pino options, or false to log nothing. */
  logger?: FastifyServerOptions['logger']
  /** Overrides of the model retry policy (tests shorten the backoff). */
  retryPolicy?: Partial<RetryPolicy>
  /** Tool output and concurrency limits. */
  tools?: ToolCatalogOptions
  /** Backoff of runEnd hook retries (tests shorten it). */
  hookRetry?: Partial<RetryPolicy>
  /** SSE keep-alive interval; SPEC default 15 s. */
  ssePingMs?: number
  /** How far (bytes) an SSE reader may fall behind before it is dropped; default 4 MiB. */
  sseMaxBufferedBytes?: number
  /** How long a client may take to send a whole request, headers and body; default REQUEST_TIMEOUT_MS (tests shorten it). */
  requestTimeoutMs?: number
  /** How long a signal waits for the run's owner in another process to answer (PostgreSQL); default 5 s (tests shorten it). */
  signalTimeoutMs?: number
}

/**
 * How long a client may take to send a whole request (headers and body; not the answer, so an SSE
 * stream or ?wait=true may last as long as it must). Fastify's default is no limit: a client that
 * sends its body a byte every few seconds held its connection, and a file descriptor, for good,
 * and a few thousand such clients would take every descriptor the process has. A 1 MiB body
 * (AGENTD_BODY_LIMIT's default) needs ~35 KB/s to arrive in time. Node answers slow headers with
 * 408 and closes; a slow body gets the same from an onRequest hook (Node does not time bodies).
 */
export const REQUEST_TIMEOUT_MS = 30_000

/** Log paths that may hold secrets; pino replaces them before a line is written. */
export const REDACT_PATHS = [
  'req.headers.authorization',
  'req.headers["x-api-key"]',
  'req.headers.cookie',
  'headers.authorization',
  'config.openai.apiKey',
  'apiKey',
  'OPENAI_API_KEY'
]

/** Every pino logger the app builds redacts secrets, in production and in tests alike; with tracing, lines carry the trace ID. */
function withRedaction(logger: FastifyServerOptions['logger'], mixin?: LoggerOptions['mixin']): FastifyServerOptions['logger'] {
  if (!logger || typeof logger !== 'object') return logger
  return {
    ...logger,
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    ...(mixin ? { mixin } : {}),
    // Fastify's own request serializer, with stream tokens (?token=, a credential) taken out of the URL.
    serializers: {
      req: (req: FastifyRequest) => ({
        method: req.method, url: redactStreamToken(req.url), host: req.host, remoteAddress: req.ip, remotePort: req.socket?.remotePort
      })
    }
  }
}

/** Paths that stay open while draining, so probes, orchestrators and the last scrape see the state. */
const DRAIN_OPEN = new Set(['/healthz', '/readyz', '/metrics'])
/**
 * Routes that act on a run already going: the grace period is for such runs to finish, one paused
 * for an approval or a client tool can only finish if its answer gets through, and an interrupt
 * ends one sooner.
 */
const DRAIN_OPEN_ROUTES = new Set(['/v1/sessions/:id/approvals/:callId', '/v1/sessions/:id/tool-results/:callId', '/v1/sessions/:id/interrupt'])

const ajvOptions = { allErrors: true, removeAdditional: false, useDefaults: true } as const
const coercingCompilers = AjvCompiler()
const strictCompilers = AjvCompiler()
const firstErrorCompilers = AjvCompiler()

/**
 * A body with more values than this that fails its schema is answered with the first problem
 * found, not every one: ajv listing all of them took ~12 s of the event loop for a 1 MB body
 * failing on each of 500 000 array items (every session stalled meanwhile).
 */
const ALL_ERRORS_MAX_VALUES = 10_000

/** How many values (objects, arrays, scalars) a parsed body holds, counted up to just past `limit`. */
function countValues(value: unknown, limit: number): number {
  let count = 0
  const stack: unknown[] = [value]
  while (stack.length > 0 && count <= limit) {
    const next = stack.pop()
    count++
    if (next && typeof next === 'object') for (const child of Object.values(next)) stack.push(child)
  }
  return count
}

type Validate = ((data: unknown) => boolean) & { errors?: unknown }

/** Validates with the first-error validator, and lists every error with the full one only when the body is small enough for it. */
function boundedBodyValidator(first: Validate, all: Validate): Validate {
  const validate: Validate = (data) => {
    if (first(data)) return true
    if (countValues(data, ALL_ERRORS_MAX_VALUES) > ALL_ERRORS_MAX_VALUES) {
      validate.errors = first.errors
    } else {
      all(data)
      validate.errors = all.errors
    }
    return false
  }
  return validate
}

/**
 * Query strings, params and headers arrive as text, so their validator coerces ("20" → 20);
 * a JSON body is validated as sent, so `{"model": 42}` is a 400, not the model "42".
 */
// @fastify/ajv-compiler's published types do not match how Fastify calls the compiler (with a
// route definition), hence the local shapes and the casts below.
type RouteDefinition = { method: string; url: string; httpPart?: string; schema?: unknown }
type CompileRoute = (route: RouteDefinition) => unknown
type ExternalSchemas = Parameters<ReturnType<typeof AjvCompiler>>[0]

function buildValidators(externalSchemas: ExternalSchemas, options?: { customOptions?: object }): CompileRoute {
  const coercing = coercingCompilers(externalSchemas, {
    ...options, customOptions: { ...options?.customOptions, ...ajvOptions, coerceTypes: 'array' }
  }) as unknown as CompileRoute
  const strict = strictCompilers(externalSchemas, {
    ...options, customOptions: { ...options?.customOptions, ...ajvOptions, coerceTypes: false }
  }) as unknown as CompileRoute
  const firstError = firstErrorCompilers(externalSchemas, {
    ...options, customOptions: { ...options?.customOptions, ...ajvOptions, allErrors: false, coerceTypes: false }
  }) as unknown as CompileRoute
  return (route) => (route.httpPart === 'body'
    ? boundedBodyValidator(firstError(route) as Validate, strict(route) as Validate)
    : coercing(route))
}

/** Builds the whole service as a Fastify instance that is ready but not listening. */
export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const { config } = options
  const tracing = await createTracing({
    ...config.tracing,
    serviceVersion: version,
    onExportFailure: (err, failedExports) => app.log.warn({ err, failedExports }, 'trace export failed; runs go on without it')
  })
  const requestTimeoutMs = options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS
  const app = Fastify({
    requestTimeout: requestTimeoutMs,
    // How often Node looks for requests past their time (its default, 30 s, would double the limit).
    // Node would answer an HTTP/1.1 request without Host itself, a bare 400 outside the envelope:
    // the security plugin refuses it instead (RFC 9112 §3.2), with a request ID like every answer.
    http: { connectionsCheckingInterval: Math.max(100, Math.min(5000, Math.floor(requestTimeoutMs / 6))), requireHostHeader: false },
    logger: withRedaction(options.logger ?? { level: config.logLevel }, tracing.enabled ? traceLogMixin(tracing) : undefined),
    genReqId: requestIdFor,
    // Without tracing Fastify's own factory stays, which skips making loggers a route does not use.
    ...(tracing.enabled ? { childLoggerFactory: tracedRequestLogger(tracing) } : {}),
    bodyLimit: config.bodyLimit,
    return503OnClosing: false,
    schemaController: { compilersFactory: { buildValidator: buildValidators as unknown as ValidatorFactory } },
    routerOptions: { maxParamLength: 200 },
    // Node refuses some connections before there is a request (malformed HTTP, headers too large or
    // too slow): the error envelope (SPEC 5.2) like every other answer, 400 VALIDATION_ERROR, 431
    // HEADERS_TOO_LARGE or 408 REQUEST_TIMEOUT, with a request ID, the security headers and a log line.
    clientErrorHandler: (err, socket) => {
      if (err.code === 'ECONNRESET' || socket.destroyed) return
      const error = err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? new ApiError('REQUEST_TIMEOUT', 'The request headers were not received in time')
        : err.code === 'HPE_HEADER_OVERFLOW' ? new ApiError('HEADERS_TOO_LARGE')
        : validationError([{ field: 'request', message: `is not a valid HTTP/1.1 request${err.code ? ` (${err.code})` : ''}`, keyword: 'http' }],
          'The request could not be read as HTTP/1.1')
      const reqId = newId('req')
      app.log.info({ reqId, res: { statusCode: error.statusCode }, code: err.code }, 'request refused: it could not be read')
      // No request was read, so no Origin: only a '*' grant can be given (corsHeaders).
      if (socket.writable) socket.write(rawErrorAnswer(error, reqId, { ...securityHeaders('', config.hstsMaxAge), ...corsHeaders(config.corsOrigins, null) }))
      socket.destroy(err)
    },
    // The router refuses some URLs (bad percent-encoding, a path parameter over maxParamLength)
    // before any hook runs; they get the envelope, the request ID and the CORS headers like every other error.
    frameworkErrors: (err, request, reply) => {
      reply.header('x-request-id', request.id)
      setSecurityHeaders(request, reply, config.hstsMaxAge)
      // @fastify/cors runs as a hook too: without this a browser client could not read the envelope.
      reply.headers(corsHeaders(config.corsOrigins, request.headers.origin))
      traceRequest(tracing, request, reply)
      const started = performance.now()
      reply.raw.once('finish', () => answeredOutsideFastify(request, reply, performance.now() - started))
      const message = err.code === 'FST_ERR_MAX_PARAM_LENGTH' ? 'A path parameter is too long' : 'The URL is malformed'
      return sendApiError(reply, validationError([{ field: 'url', message, keyword: 'url' }], message))
    }
  }).withTypeProvider<TypeBoxTypeProvider>()

  /** Logs and counts an answer Fastify neither logs nor counts (its hooks did not run, or it was written to the socket). */
  const answeredOutsideFastify = (request: FastifyRequest, reply: FastifyReply, responseTime: number): void => {
    request.log.info({ res: reply, responseTime }, 'request completed')
    app.observeRequest(request, reply, responseTime / 1000)
  }

  // Node answers a request whose Expect is other than 100-continue itself, a bare 417 without the
  // envelope or a request ID. A server may ignore an expectation (RFC 9110 §10.1.1): it is served
  // like any other request.
  app.server.on('checkExpectation', (req, res) => app.server.emit('request', req, res))

  // JSON only: without this Fastify would parse text/plain bodies too.
  app.removeContentTypeParser('text/plain')

  // Node's requestTimeout ends a request whose headers come too slowly, not one whose body does:
  // a body gets the same time here, counted from its headers, and the same 408 REQUEST_TIMEOUT envelope.
  app.addHook('onRequest', async (request, reply) => {
    const raw = request.raw
    const length = raw.headers['content-length']
    if (raw.complete || ((length === undefined || length === '0') && raw.headers['transfer-encoding'] === undefined)) return
    const timer = setTimeout(() => {
      if (raw.complete || raw.socket.destroyed) return
      request.log.info({ requestTimeoutMs }, 'request body too slow: closing the connection')
      const error = new ApiError('REQUEST_TIMEOUT', `The request body was not received within ${requestTimeoutMs} ms`)
      const headers = { ...securityHeaders(pathOf(request), config.hstsMaxAge), ...corsHeaders(config.corsOrigins, request.headers.origin) }
      raw.socket.end(rawErrorAnswer(error, request.id, headers))
      raw.socket.destroySoon()
      answeredOnSocket(reply.code(408))
      answeredOutsideFastify(request, reply, reply.elapsedTime)
    }, requestTimeoutMs)
    timer.unref()
    raw.once('end', () => clearTimeout(timer))
    raw.once('close', () => clearTimeout(timer))
  })

  const state: ServiceState = { draining: false, storeFailure: null }
  // Fastify's logger is pino; its published type is a narrower view of the same object.
  const log = app.log as unknown as Logger
  const rawStore = options.store ?? (await openStore(config, {
    onIdleError: (err) => log.warn({ err }, 'an idle database connection failed'),
    onCheckpointFailure: (err) => log.warn({ err }, 'the WAL checkpoint thread failed; the store checkpoints on the event loop from now on'),
    onRemovalFailure: (err) => log.error({ err }, 'a session a stop left half deleted or half forked could not be removed; the next start tries again')
  }))
  if (!options.store) app.addHook('onClose', async () => rawStore.close())
  const store = observeStore(rawStore, state, (operation, err) => log.error({ err, operation }, 'store call failed'))
  // One process on SQLite: in-process ports; several on PostgreSQL: shared ones (src/ports.ts).
  const ports = await openPorts({ store: rawStore, readStore: store, redisUrl: config.redisUrl, runLeaseMs: config.runLeaseMs, log, signalTimeoutMs: options.signalTimeoutMs })
  const { bus, coordinator } = ports
  const events = new EventLog(store, bus)
  app.addHook('onClose', async () => ports.close())
  const tools = new ToolCatalog(config, { maxOutputBytes: config.toolMaxOutputBytes, logger: log, ...options.tools })
  const hooks = new HookRunner({
    hooks: config.hooks, events, logger: log, maxOutputBytes: config.toolMaxOutputBytes, ...(options.hookRetry ? { runEndRetry: options.hookRetry } : {})
  })
  const runs = new RunManager({
    store,
    events,
    coordinator,
    model: options.model,
    logger: log,
    retryPolicy: { ...defaultRetryPolicy, ...options.retryPolicy, maxRetries: options.retryPolicy?.maxRetries ?? config.modelMaxRetries },
    maxSteps: config.maxSteps,
    contextTokens: config.contextTokens,
    maxActiveRunsPerTenant: config.limits.activeRunsPerTenant,
    hooks,
    tracing,
    resolveTools: (session) => tools.resolve(session),
    toolExecutor: (session, sessionTools, requestId) =>
      tools.executor(session, sessionTools, log.child({ reqId: requestId, sessionId: session.id }))
  })
  app.decorate('agentd', {
    config,
    store,
    model: options.model,
    tools,
    state,
    events,
    bus,
    coordinator,
    runs,
    async drain(graceMs) {
      state.draining = true
      await runs.drain(graceMs)
      await hooks.drain(graceMs)
      app.streams.drain()
    }
  } satisfies Services)
  // Without a drain first (tests, embedders): runs are interrupted at once.
  // Then the spans, the drained runs' included, are sent (within a bounded time).
  app.addHook('onClose', async () => {
    await app.agentd.drain(0)
    await tracing.shutdown()
  })
  // MCP servers are tried once before the first request (one that fails is retried in the background) and stopped after the drain.
  await tools.start()
  app.addHook('onClose', async () => tools.close())
  try {

    for (const schema of [...sharedSchemas, WebhookToolSpecSchema, ClientToolSpecSchema, ToolSchema, SessionSchema, MessageSchema, RunSchema, EventSchema, ToolCallSchema]) app.addSchema(schema)

    await app.register(requestIdPlugin)
    await app.register(tracingPlugin, { tracing })
    await app.register(errorEnvelopePlugin)
    await app.register(strictQueryPlugin)
    const openPaths = [...CONSOLE_PATHS, ...(config.metricsPublic ? ['/metrics'] : []), ...(config.docsPublic ? ['/openapi.json', '/docs', '/docs/*'] : [])]
    await app.register(openApiPlugin, { version, publicPaths: ['/healthz', '/readyz', ...openPaths] })
    await app.register(securityPlugin, { corsOrigins: config.corsOrigins, hstsMaxAge: config.hstsMaxAge })
    const streamTokens = new StreamTokens(config.apiKeys)
    await app.register(authPlugin, { apiKeys: config.apiKeys, openPaths, streamTokens })

    await app.register(streamsPlugin, {
      store,
      feed: bus,
      maxStreams: config.limits.streams,
      maxStreamsPerKey: config.limits.streamsPerKey,
      maxBufferedBytes: options.sseMaxBufferedBytes ?? 4 * 1024 * 1024,
      maxTotalBufferedBytes: config.limits.streamBytes,
      ...(options.ssePingMs ? { pingIntervalMs: options.ssePingMs } : {})
    })
    // A deleted session's streams end on every process that serves one.
    bus.onSessionEnded((sessionId, reason) => app.streams.endSession(sessionId, reason))
    await app.register(idempotencyPlugin, {
      store,
      // A claim outlives a holder that died (kill -9) by as long as a run's claim does.
      leaseMs: config.runLeaseMs,
      replayStream: (request, reply, answer, after) => {
        app.streams.send(reply, request.keyId, { sessionId: answer.stream.sessionId, after, runId: answer.stream.runId, untilDone: true })
      }
    })

    app.addHook('onRequest', async (request) => {
      if (state.draining && !DRAIN_OPEN.has(request.url.split('?')[0] ?? '') &&
        !(request.method === 'POST' && DRAIN_OPEN_ROUTES.has(request.routeOptions.url ?? ''))) {
        throw new ApiError('UNAVAILABLE', 'The service is shutting down', undefined, { 'retry-after': '5', connection: 'close' })
      }
    })
    // A request that came before the drain keeps its keep-alive connection open after its answer,
    // and the server's close waits on that connection until the shutdown times out (exit 1).
    app.addHook('onSend', async (_request, reply) => {
      if (state.draining) reply.header('connection', 'close')
    })

    await app.register(metricsPlugin)
    await app.register(rateLimitPlugin, { ...config.rateLimit, perTenant: config.apiKeys.size > 0, redis: ports.redis })
    if (ports.redis) await app.register(sharedStreamCapPlugin, { redis: ports.redis.client, namespace: ports.redis.namespace, max: config.limits.streamsPerKey })
    await app.register(healthRoutes)
    await app.register(sessionRoutes)
    await app.register(messageRoutes)
    await app.register(eventRoutes)
    await app.register(streamTokenRoutes, { tokens: streamTokens })
    await app.register(toolRoutes)
    await app.register(toolCallRoutes)
    await app.register(consoleRoutes)

    // Runs a previous process left unfinished are ended or queued again before any request.
    await runs.recover()
    ports.startRecovery(() => runs.recover())
  } catch (err) {
    // The caller gets no app to close, and stdio MCP servers run in process groups of their own:
    // they would outlive this process (server.ts exits on a failed start).
    await tools.close().catch(() => undefined)
    throw err
  }
  return app
}
