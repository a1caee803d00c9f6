import { Type } from '@sinclair/typebox'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { answer, errorResponses, ref } from '../schemas/common.ts'
import { ToolSchema } from '../schemas/tools.ts'

/** GET /v1/tools: the tools this server offers. */
export const toolRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get('/v1/tools', {
    schema: {
      tags: ['tools'],
      operationId: 'listTools',
      summary: 'The tools this server offers, each with its JSON Schema',
      response: { 200: answer('The tools', Type.Object({ data: Type.Array(ref(ToolSchema)) })), ...errorResponses(401, 429, 500, 503) }
    }
  }, async () => ({ data: app.agentd.tools.list() }))
}
