import { Type } from '@sinclair/typebox'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { ApiError, sendApiError } from '../http/errors.ts'
import { answer, errorResponses } from '../schemas/common.ts'
import { McpServerStatusSchema } from '../schemas/tools.ts'

const ReadySchema = Type.Object({
  status: Type.Literal('ready'),
  store: Type.String({ description: 'sqlite or postgres' }),
  owner: Type.String({ description: "this process's id, as it appears on the runs it claims (several processes share a PostgreSQL store)" }),
  model: Type.String({ description: "'openai' for a configured provider, 'dev' for the built-in dev model" }),
  mcp: Type.Optional(Type.Array(McpServerStatusSchema, { description: 'the MCP servers, when there are any; one that is down is reported here but does not make agentd unready' }))
})

/** GET /healthz (the process answers) and GET /readyz (it can serve: store reachable, a model provider). */
export const healthRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get('/healthz', {
    schema: {
      tags: ['health'],
      operationId: 'checkLiveness',
      summary: 'Liveness: the process is up and its event loop answers',
      response: { 200: answer('The process is up', Type.Object({ status: Type.Literal('ok') })) }
    }
  }, async () => ({ status: 'ok' as const }))

  app.get('/readyz', {
    schema: {
      tags: ['health'],
      operationId: 'checkReadiness',
      summary: 'Readiness: the store answers and a model provider (or the dev model) is set up',
      response: { 200: answer('Ready to serve', ReadySchema), ...errorResponses(503) }
    }
  }, async (request, reply) => {
    const { store, model, state, coordinator } = app.agentd
    if (state.draining) return sendApiError(reply, new ApiError('UNAVAILABLE', 'The service is shutting down'))
    try {
      await store.ping()
    } catch (err) {
      request.log.warn({ err }, 'readiness: store unreachable')
      return sendApiError(reply, new ApiError('UNAVAILABLE', 'The store is unreachable', { store: (err as Error).message }))
    }
    if (state.storeFailure) {
      return sendApiError(reply, new ApiError('UNAVAILABLE', 'The store is failing', { store: state.storeFailure }))
    }
    const mcp = app.agentd.tools.mcpStatus()
    return { status: 'ready' as const, store: store.kind, owner: coordinator.ownerId, model: model.kind, ...(mcp.length > 0 ? { mcp } : {}) }
  })
}
