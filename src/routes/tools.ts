import { Type } from '@sinclair/typebox'
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { answer, errorResponses, ref } from '../schemas/common.ts'
import { McpServerStatusSchema, ToolSchema } from '../schemas/tools.ts'

/** GET /v1/tools: the tools this server offers, and the state of the MCP servers that offer some of them. */
export const toolRoutes: FastifyPluginAsyncTypebox = async (app) => {
  app.get('/v1/tools', {
    schema: {
      tags: ['tools'],
      operationId: 'listTools',
      summary: 'The tools this server offers, each with its JSON Schema, and the state of its MCP servers',
      response: {
        200: answer('The tools and the MCP servers', Type.Object({
          data: Type.Array(ref(ToolSchema)),
          servers: Type.Array(McpServerStatusSchema, { description: 'the MCP servers of AGENTD_MCP_CONFIG; a server that is down keeps its last known tools listed, and calls to them fail as retryable until it is back' })
        })),
        ...errorResponses(401, 429, 500, 503)
      }
    }
  }, async () => ({ data: app.agentd.tools.list(), servers: app.agentd.tools.mcpStatus() }))
}
