import { Type, type Static } from '@sinclair/typebox'
import { ClassifiedErrorSchema, ref, StringEnum, UsageSchema } from './common.ts'

export const MessageSchema = Type.Object(
  {
    id: Type.String(),
    sessionId: Type.String(),
    runId: Type.Union([Type.String(), Type.Null()]),
    role: StringEnum(['user', 'assistant', 'tool']),
    content: Type.Union([Type.String(), Type.Null()]),
    toolCalls: Type.Optional(
      Type.Array(Type.Object({ id: Type.String(), name: Type.String(), arguments: Type.String({ description: 'JSON text as the model sent it' }) }))
    ),
    toolCallId: Type.Optional(Type.String()),
    createdAt: Type.String({ format: 'date-time' })
  },
  { $id: 'Message' }
)
export type Message = Static<typeof MessageSchema>

export const RunStatusSchema = StringEnum(['queued', 'running', 'awaiting_approval', 'awaiting_tool_result', 'completed', 'failed', 'cancelled'])

export const RunSchema = Type.Object(
  {
    id: Type.String(),
    sessionId: Type.String(),
    status: RunStatusSchema,
    requestId: Type.String({ description: 'X-Request-Id of the request that started the run' }),
    steps: Type.Integer({ minimum: 0 }),
    usage: ref(UsageSchema),
    error: Type.Union([ref(ClassifiedErrorSchema), Type.Null()]),
    startedAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
    endedAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()])
  },
  { $id: 'Run' }
)
export type Run = Static<typeof RunSchema>

export const PostMessageBodySchema = Type.Object(
  {
    content: Type.String({ minLength: 1, maxLength: 200_000 }),
    onBusy: Type.Optional(
      StringEnum(['reject', 'enqueue', 'interrupt'], {
        description: 'what to do while a run is active: reject (409 SESSION_BUSY, the default), enqueue, or interrupt it',
        default: 'reject'
      })
    )
  },
  { additionalProperties: false }
)

export const PostMessageQuerySchema = Type.Object(
  { wait: Type.Optional(Type.Boolean({ description: 'answer 200 once the run has ended, with the final assistant message' })) },
  { additionalProperties: false }
)

export const AcceptedSchema = Type.Object({ message: ref(MessageSchema), run: ref(RunSchema) })
export const FinishedSchema = Type.Object({
  message: Type.Union([ref(MessageSchema), Type.Null()], { description: 'the last assistant message of the run, if any' }),
  run: ref(RunSchema)
})

export const MessageListSchema = Type.Object({ data: Type.Array(ref(MessageSchema)) })

export const RunParamsSchema = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 64 }),
  runId: Type.String({ minLength: 1, maxLength: 64 })
})

export const CallParamsSchema = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 64 }),
  callId: Type.String({ minLength: 1, maxLength: 128 })
})

export const ApprovalBodySchema = Type.Object(
  {
    decision: StringEnum(['allow', 'deny']),
    note: Type.Optional(Type.String({ maxLength: 4096 }))
  },
  { additionalProperties: false }
)

export const ToolResultBodySchema = Type.Union(
  [
    Type.Object({ output: Type.Unknown() }, { additionalProperties: false }),
    Type.Object({ error: Type.String({ maxLength: 65_536 }) }, { additionalProperties: false })
  ],
  { description: '{output} with the tool result, or {error} when the client tool failed' }
)

export const AckSchema = Type.Object({ callId: Type.String(), accepted: Type.Literal(true) })
