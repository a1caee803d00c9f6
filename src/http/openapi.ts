import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { ClassifiedErrorSchema, ErrorEnvelopeSchema, UsageSchema } from '../schemas/common.ts'
import { eventDocumentSchemas } from '../schemas/events.ts'

/** Schemas shared by many routes: registered once, referenced by $id, shown as OpenAPI components. */
export const sharedSchemas = [UsageSchema, ClassifiedErrorSchema, ErrorEnvelopeSchema]

export interface OpenApiOptions {
  version: string
  /** Paths that need no API key (probes, and metrics or docs when public): their operations declare no security. */
  publicPaths: readonly string[]
}

type JsonObject = Record<string, any>

const headerRef = (name: string) => ({ $ref: `#/components/headers/${name}` })

/** Headers the service sends or reads on every route; the route schemas do not validate them, so they are added here. */
const components = {
  parameters: {
    IdempotencyKey: {
      name: 'Idempotency-Key', in: 'header', required: false,
      description: 'Same key and same request within 24 h: the first answer again (Idempotent-Replayed: true). ' +
        'Same key, other request: 422 IDEMPOTENCY_KEY_REUSED. While the first is processed: 409 IDEMPOTENCY_IN_PROGRESS. Per tenant.',
      schema: { type: 'string', pattern: '^[\\x21-\\x7e]{1,255}$' }
    },
    RequestId: {
      name: 'X-Request-Id', in: 'header', required: false,
      description: 'Your ID for this request; kept when it matches the pattern, else replaced by a new one. Echoed on the response, ' +
        'the run it starts, its events and its log lines.',
      schema: { type: 'string', pattern: '^[A-Za-z0-9._:-]{1,128}$' }
    }
  },
  headers: {
    RequestId: { description: 'The request ID (yours, or a new req_… one)', schema: { type: 'string' } },
    RetryAfter: { description: 'Seconds to wait before retrying', schema: { type: 'integer', minimum: 0 } },
    RateLimitLimit: { description: 'Requests allowed per window (when rate limiting is on)', schema: { type: 'integer', minimum: 0 } },
    RateLimitRemaining: { description: 'Requests left in this window', schema: { type: 'integer', minimum: 0 } },
    RateLimitReset: { description: 'Seconds until the window resets', schema: { type: 'integer', minimum: 0 } },
    IdempotentReplayed: { description: '"true" when this is the kept answer to an earlier request with the same Idempotency-Key', schema: { type: 'string', enum: ['true'] } }
  }
}

const rateLimitHeaders = {
  'X-RateLimit-Limit': headerRef('RateLimitLimit'),
  'X-RateLimit-Remaining': headerRef('RateLimitRemaining'),
  'X-RateLimit-Reset': headerRef('RateLimitReset')
}

/** True when `{}` is a valid body: every property optional. */
function bodyIsOptional(schema: JsonObject | undefined, doc: JsonObject): boolean {
  const resolved = schema?.$ref ? doc.components.schemas[String(schema.$ref).split('/').pop() as string] : schema
  return resolved?.type === 'object' && !(resolved.required?.length > 0)
}

/**
 * What @fastify/swagger cannot say from route schemas alone: the Event union (the routes
 * serialise events with a lighter schema), the headers of every operation, which operations need
 * no key, and which bodies may be left out (it marks every body required; the routes with an
 * all-optional body treat a missing one as `{}`).
 */
export function finishDocument(doc: JsonObject, publicPaths: ReadonlySet<string>): JsonObject {
  doc.components.parameters = components.parameters
  doc.components.headers = components.headers
  Object.assign(doc.components.schemas, eventDocumentSchemas())
  for (const [path, methods] of Object.entries(doc.paths as Record<string, Record<string, JsonObject>>)) {
    const isPublic = publicPaths.has(path)
    for (const [method, op] of Object.entries(methods)) {
      if (isPublic) op.security = []
      op.parameters = [...(op.parameters ?? []), { $ref: '#/components/parameters/RequestId' }]
      if (method === 'post') op.parameters.push({ $ref: '#/components/parameters/IdempotencyKey' })
      const body = op.requestBody?.content?.['application/json']?.schema
      if (op.requestBody && bodyIsOptional(body, doc)) op.requestBody.required = false
      for (const [status, response] of Object.entries(op.responses as Record<string, JsonObject>)) {
        const code = Number(status)
        const headers: JsonObject = { 'X-Request-Id': headerRef('RequestId') }
        if (code === 429 || code === 503) headers['Retry-After'] = headerRef('RetryAfter')
        // Counted before the body is read: every answer but auth's 401 (which comes first) carries them.
        if (!isPublic && code !== 401) Object.assign(headers, rateLimitHeaders)
        if (method === 'post' && code < 300) headers['Idempotent-Replayed'] = headerRef('IdempotentReplayed')
        response.headers = { ...response.headers, ...headers }
      }
    }
  }
  return doc
}

/** The OpenAPI 3.1 document at /openapi.json and its UI at /docs. */
export const openApiPlugin = fp(
  async (app: FastifyInstance, opts: OpenApiOptions) => {
    const publicPaths = new Set(opts.publicPaths)
    await app.register(swagger, {
      openapi: {
        openapi: '3.1.0',
        info: {
          title: 'agentd',
          version: opts.version,
          description:
            'A language-agnostic HTTP agent service: sessions, messages, runs, and their events as Server-Sent Events. ' +
            'Every non-2xx response is an ErrorEnvelope; every response carries X-Request-Id. ' +
            'With API keys configured (AGENTD_API_KEYS) every /v1 operation needs `Authorization: Bearer <key>`; without them the header is ignored.',
          license: { name: 'MIT', identifier: 'MIT' }
        },
        servers: [{ url: 'http://127.0.0.1:3000', description: 'agentd on its default address (npm start)' }],
        security: [{ bearerAuth: [] }],
        tags: [
          { name: 'sessions', description: 'Conversations with the agent' },
          { name: 'messages', description: 'Messages and the runs they start' },
          { name: 'events', description: 'The persisted, numbered event stream of a session' },
          { name: 'tools', description: 'Tools the server offers' },
          { name: 'health', description: 'Liveness, readiness and metrics' }
        ],
        components: {
          securitySchemes: { bearerAuth: { type: 'http', scheme: 'bearer', description: 'An API key from AGENTD_API_KEYS' } }
        }
      },
      refResolver: {
        buildLocalReference: (json, _baseUri, _fragment, i) => (typeof json.$id === 'string' ? json.$id : `def-${i}`)
      },
      transformObject: (document) =>
        'openapiObject' in document ? finishDocument(document.openapiObject as JsonObject, publicPaths) : document.swaggerObject
    })
    await app.register(swaggerUi, { routePrefix: '/docs' })
    app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger())
  },
  { name: 'agentd-openapi' }
)
