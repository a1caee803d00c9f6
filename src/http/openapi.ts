import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { ClassifiedErrorSchema, ErrorEnvelopeSchema, UsageSchema } from '../schemas/common.ts'

/** Schemas shared by many routes: registered once, referenced by $id, shown as OpenAPI components. */
export const sharedSchemas = [UsageSchema, ClassifiedErrorSchema, ErrorEnvelopeSchema]

/** The OpenAPI 3.1 document at /openapi.json and its UI at /docs. */
export const openApiPlugin = fp(
  async (app: FastifyInstance, opts: { version: string }) => {
    await app.register(swagger, {
      openapi: {
        openapi: '3.1.0',
        info: {
          title: 'agentd',
          version: opts.version,
          description:
            'A language-agnostic HTTP agent service: sessions, messages, runs, and their events as Server-Sent Events. ' +
            'Every non-2xx response is an ErrorEnvelope; every response carries X-Request-Id.'
        },
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
      }
    })
    await app.register(swaggerUi, { routePrefix: '/docs' })
    app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger())
  },
  { name: 'agentd-openapi' }
)
