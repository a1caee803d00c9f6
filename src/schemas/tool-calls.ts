import { Type, type Static } from '@sinclair/typebox'
import { ClassifiedErrorSchema, ref, StringEnum } from './common.ts'

export const ToolCallStateSchema = StringEnum(['pending', 'approval_required', 'executing', 'completed', 'failed', 'denied', 'sealed'])

/** One tool call as the audit route shows it: the ToolCallSnapshot of SPEC 4 with the run and request that made it. */
export const ToolCallSchema = Type.Object(
  {
    id: Type.String(),
    sessionId: Type.String(),
    runId: Type.String(),
    requestId: Type.Union([Type.String(), Type.Null()], { description: 'X-Request-Id of the request that started the run' }),
    step: Type.Integer({ minimum: 0, description: 'the model step of the run that asked for the call' }),
    name: Type.String(),
    input: Type.Unknown({ description: 'the arguments the tool got (after any preToolUse hook rewrote them)' }),
    state: ToolCallStateSchema,
    startedAt: Type.String({ format: 'date-time' }),
    endedAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
    durationMs: Type.Union([Type.Integer({ minimum: 0 }), Type.Null()]),
    result: Type.Optional(Type.Unknown({ description: "the tool's own result (a postToolUse hook changes only what the model sees)" })),
    error: Type.Optional(ref(ClassifiedErrorSchema))
  },
  { $id: 'ToolCall' }
)
export type ToolCallView = Static<typeof ToolCallSchema>

/** Tool calls per page when the query names no limit. */
export const TOOL_CALL_PAGE_SIZE = 20

export const ListToolCallsQuerySchema = Type.Object(
  {
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100, default: TOOL_CALL_PAGE_SIZE })),
    cursor: Type.Optional(Type.String({ maxLength: 200, description: 'nextCursor of the previous page' }))
  },
  { additionalProperties: false }
)

export const ToolCallPageSchema = Type.Object({
  data: Type.Array(ref(ToolCallSchema)),
  nextCursor: Type.Union([Type.String(), Type.Null()], { description: 'pass as cursor for the next page; null on the last one' })
})
