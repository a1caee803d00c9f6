import { Type } from '@sinclair/typebox'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { apiError } from '../http/errors.ts'
import { STREAM_TOKEN_MAX_TTL_MS, STREAM_TOKEN_TTL_MS, type StreamTokens } from '../http/stream-tokens.ts'
import { answer, errorResponses } from '../schemas/common.ts'
import { SessionParamsSchema } from '../schemas/sessions.ts'
import { bodyDefaultsToEmpty, sessionOr404 } from './views.ts'

const StreamTokenBodySchema = Type.Object(
  {
    expiresInSeconds: Type.Optional(Type.Integer({
      minimum: 1, maximum: STREAM_TOKEN_MAX_TTL_MS / 1000, default: STREAM_TOKEN_TTL_MS / 1000, description: 'how long the token is good for'
    }))
  },
  { additionalProperties: false }
)

const StreamTokenSchema = Type.Object({
  token: Type.String({ description: 'pass as ?token= to GET /v1/sessions/{id}/events; a credential: keep it out of logs and history' }),
  sessionId: Type.String(),
  expiresAt: Type.String({ format: 'date-time' })
})

/** POST /v1/sessions/{id}/stream-tokens: a short-lived token to read one session's events without Authorization. */
export const streamTokenRoutes: FastifyPluginAsyncTypebox<{ tokens: StreamTokens }> = async (app, opts) => {
  const { store } = app.agentd

  app.post('/v1/sessions/:id/stream-tokens', {
    schema: {
      tags: ['events'],
      operationId: 'createStreamToken',
      summary: 'A short-lived token for this session\'s event stream, for clients that cannot send Authorization (browser EventSource)',
      description: 'The token is bound to the tenant and the session, accepted as `?token=` by GET /v1/sessions/{id}/events only, ' +
        'and good for 5 minutes unless asked otherwise. A stream opened with it stays open past the expiry; reconnecting needs a fresh one.',
      params: SessionParamsSchema,
      body: StreamTokenBodySchema,
      response: { 201: answer('The token', StreamTokenSchema), ...errorResponses(400, 401, 404, 409, 413, 415, 422, 429, 500, 503) }
    },
    preValidation: bodyDefaultsToEmpty
  }, async (request, reply) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    const ttlMs = (request.body?.expiresInSeconds ?? STREAM_TOKEN_TTL_MS / 1000) * 1000
    const issued = opts.tokens.issue({ tenant: request.tenant, keyId: request.keyId }, session.id, ttlMs)
    // Auth sets keyId to a configured key (or 'anonymous' without keys), which always has a secret.
    if (!issued) throw apiError('INTERNAL')
    return reply.status(201).send({ token: issued.token, sessionId: session.id, expiresAt: issued.expiresAt })
  })
}
