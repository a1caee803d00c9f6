import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox'
import { validationError } from '../http/errors.ts'
import { errorResponses } from '../schemas/common.ts'
import { SessionParamsSchema } from '../schemas/sessions.ts'
import { ListToolCallsQuerySchema, TOOL_CALL_PAGE_SIZE, ToolCallPageSchema, type ToolCallView } from '../schemas/tool-calls.ts'
import type { AuditedToolCall } from '../store/store.ts'
import { sessionOr404 } from './views.ts'

const encodeCursor = (callId: string) => Buffer.from(callId, 'utf8').toString('base64url')
function decodeCursor(cursor: string): string {
  const callId = Buffer.from(cursor, 'base64url').toString('utf8')
  if (!/^call_[A-Za-z0-9_-]{1,128}$/.test(callId) || encodeCursor(callId) !== cursor) {
    throw validationError([{ field: 'querystring.cursor', message: 'is not a valid cursor', keyword: 'cursor' }],
      'cursor is not a nextCursor this API returned')
  }
  return callId
}

function toToolCallView(call: AuditedToolCall): ToolCallView {
  const view: ToolCallView = {
    id: call.id, sessionId: call.sessionId, runId: call.runId, requestId: call.requestId, step: call.step, name: call.name,
    input: call.input, state: call.state, startedAt: call.startedAt, endedAt: call.endedAt, durationMs: call.durationMs
  }
  if (call.result !== undefined) view.result = call.result
  if (call.error !== undefined) view.error = call.error
  return view
}

/** GET /v1/sessions/{id}/tool-calls: the audit trail of a session's tool calls (SPEC 15). */
export const toolCallRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const { store } = app.agentd

  app.get('/v1/sessions/:id/tool-calls', {
    schema: {
      tags: ['sessions'],
      operationId: 'listToolCalls',
      summary: "Audit a session's tool calls, oldest first: input, state, result or classified error, duration, run and request",
      params: SessionParamsSchema,
      querystring: ListToolCallsQuerySchema,
      response: { 200: ToolCallPageSchema, ...errorResponses(400, 401, 404, 429, 500, 503) }
    }
  }, async (request) => {
    const session = await sessionOr404(store, request.tenant, request.params.id)
    const { limit = TOOL_CALL_PAGE_SIZE, cursor } = request.query
    const after = cursor === undefined ? undefined : decodeCursor(cursor)
    const page = await store.listSessionToolCalls(session.id, after === undefined ? { limit: limit + 1 } : { limit: limit + 1, after })
    const data = page.slice(0, limit)
    const last = data.at(-1)
    return { data: data.map(toToolCallView), nextCursor: page.length > limit && last ? encodeCursor(last.id) : null }
  })
}
