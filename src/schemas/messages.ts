import { Type, type Static } from '@sinclair/typebox'
import { ClassifiedErrorSchema, ref, StringEnum, UsageSchema } from './common.ts'

export const MessageSchema = Type.Object(
  {
    id: Type.String(),
    sessionId: Type.String(),
    runId: Type.Union([Type.String(), Type.Null()]),
    role: StringEnum(['user', 'assistant', 'tool', 'summary'], {
      description: 'summary: written by the model when the history outgrew the context window; it stands for earlier messages in later model calls, and they stay stored'
    }),
    content: Type.Union([Type.String(), Type.Null()]),
    toolCalls: Type.Optional(
      Type.Array(Type.Object({ id: Type.String(), name: Type.String(), arguments: Type.String({ description: 'JSON text as the model sent it' }) }))
    ),
    toolCallId: Type.Optional(Type.String()),
    replacesMessages: Type.Optional(Type.Integer({ minimum: 0, description: 'of a summary: how many messages, counted from the first of this list, it stands for when the model is called' })),
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

export const PostMessageHeadersSchema = Type.Object({
  'last-event-id': Type.Optional(Type.String({
    pattern: '^[0-9]{1,15}$',
    description: 'with the Idempotency-Key of an earlier streamed POST (a client reconnecting by sending it again): its stream resumes after this seq'
  }))
})

export const AcceptedSchema = Type.Object({ message: ref(MessageSchema), run: ref(RunSchema) })
export const FinishedSchema = Type.Object({
  message: Type.Union([ref(MessageSchema), Type.Null()], { description: 'the last assistant message of the run, if any' }),
  run: ref(RunSchema),
  pendingCall: Type.Optional(Type.Object({
    id: Type.String(),
    name: Type.String(),
    input: Type.Unknown(),
    state: Type.String({ description: "'approval_required' (answer with POST …/approvals/{callId}) or 'executing' (a client tool: POST …/tool-results/{callId})" })
  }, { additionalProperties: true, description: 'when the run paused (awaiting_approval or awaiting_tool_result): the call it waits on' }))
})

/** Messages per page when the query names no limit. */
export const MESSAGE_PAGE_SIZE = 100

export const ListMessagesQuerySchema = Type.Object(
  {
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: MESSAGE_PAGE_SIZE })),
    cursor: Type.Optional(Type.String({ maxLength: 200, description: 'nextCursor of the previous page' }))
  },
  { additionalProperties: false }
)

export const MessageListSchema = Type.Object({
  data: Type.Array(ref(MessageSchema)),
  nextCursor: Type.Union([Type.String(), Type.Null()], { description: 'pass as ?cursor= for the next page; null on the last page' })
})

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
