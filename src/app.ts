import { AjvCompiler, type ValidatorFactory } from '@fastify/ajv-compiler'
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import type { Config } from './config.ts'
import { authPlugin } from './http/auth.ts'
import { ApiError, errorEnvelopePlugin } from './http/errors.ts'
import { openApiPlugin, sharedSchemas } from './http/openapi.ts'
import { requestIdFor, requestIdPlugin } from './http/request-id.ts'
import type { ModelProvider } from './model/types.ts'
import { healthRoutes } from './routes/health.ts'
import { sessionRoutes } from './routes/sessions.ts'
import { ClientToolSpecSchema, WebhookToolSpecSchema } from './schemas/tools.ts'
import { SessionSchema } from './schemas/sessions.ts'
import { openStore } from './store/index.ts'
import type { Store } from './store/store.ts'
import { ToolCatalog } from './tools/catalog.ts'
import { version } from './version.ts'

/** Mutable service state shared by routes and the process owner (server.ts). */
export interface ServiceState {
  /** Set on SIGTERM: new requests get 503 UNAVAILABLE, /readyz turns 503. */
  draining: boolean
  /** The last store write failure, reported by /readyz until a write succeeds again. */
  storeFailure: string | null
}

/** Everything the routes use, decorated on the app as `app.agentd`. */
export interface Services {
  config: Readonly<Config>
  store: Store
  model: ModelProvider
  tools: ToolCatalog
  state: ServiceState
  /** Cancels whatever runs in a session before it is deleted. */
  onSessionDelete(sessionId: string): Promise<void>
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
}

/** Paths that stay open while draining, so probes and orchestrators see the state. */
const DRAIN_OPEN = new Set(['/healthz', '/readyz'])

const ajvOptions = { allErrors: true, removeAdditional: false, useDefaults: true } as const
const coercingCompilers = AjvCompiler()
const strictCompilers = AjvCompiler()

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
  return (route) => (route.httpPart === 'body' ? strict(route) : coercing(route))
}

/** Builds the whole service as a Fastify instance that is ready but not listening. */
export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const { config } = options
  const app = Fastify({
    logger: options.logger ?? { level: config.logLevel },
    genReqId: requestIdFor,
    bodyLimit: config.bodyLimit,
    return503OnClosing: false,
    schemaController: { compilersFactory: { buildValidator: buildValidators as unknown as ValidatorFactory } },
    routerOptions: { maxParamLength: 200 }
  }).withTypeProvider<TypeBoxTypeProvider>()

  // JSON only: without this Fastify would parse text/plain bodies too.
  app.removeContentTypeParser('text/plain')

  const store = options.store ?? (await openStore(config))
  if (!options.store) app.addHook('onClose', async () => store.close())

  const state: ServiceState = { draining: false, storeFailure: null }
  app.decorate('agentd', {
    config,
    store,
    model: options.model,
    tools: new ToolCatalog(),
    state,
    onSessionDelete: async () => {},
    drain: async () => {
      state.draining = true
    }
  } satisfies Services)

  for (const schema of [...sharedSchemas, WebhookToolSpecSchema, ClientToolSpecSchema, SessionSchema]) app.addSchema(schema)

  await app.register(requestIdPlugin)
  await app.register(errorEnvelopePlugin)
  await app.register(openApiPlugin, { version })
  await app.register(authPlugin, { apiKeys: config.apiKeys, openPaths: ['/metrics', '/openapi.json', '/docs', '/docs/*'] })

  app.addHook('onRequest', async (request) => {
    if (state.draining && !DRAIN_OPEN.has(request.url.split('?')[0] ?? '')) {
      throw new ApiError('UNAVAILABLE', 'The service is shutting down', undefined, { 'retry-after': '5', connection: 'close' })
    }
  })

  await app.register(healthRoutes)
  await app.register(sessionRoutes)
  return app
}
