import { Type, type Static } from '@sinclair/typebox'
import { ID_PATTERN } from '../ids.ts'
import { ref, StringEnum, UsageSchema } from './common.ts'
import { ClientToolSpecSchema, WebhookToolSpecSchema } from './tools.ts'

export const SessionStatusSchema = StringEnum(['idle', 'running', 'awaiting_approval', 'awaiting_tool_result'])

export const ApprovalSchema = Type.Object(
  {
    mode: StringEnum(['auto', 'always', 'tools'], {
      description: "auto: no approvals; always: every call waits; tools: the calls to the named tools wait"
    }),
    tools: Type.Optional(Type.Array(Type.String({ maxLength: 64 }), { maxItems: 128 }))
  },
  { additionalProperties: false }
)

export const LimitsSchema = Type.Object(
  {
    maxSteps: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, description: 'model calls per run, at most the server limit' })),
    toolTimeoutMs: Type.Optional(Type.Integer({ minimum: 100, maximum: 3_600_000, description: 'at most the server limit' })),
    maxTokens: Type.Optional(Type.Integer({ minimum: 1, maximum: 100_000_000, description: 'total tokens per run' })),
    contextTokens: Type.Optional(Type.Integer({
      minimum: 256, maximum: 10_000_000,
      description: 'tokens one model request may hold (instructions, tool definitions, history); a longer history is compacted to fit; default AGENTD_CONTEXT_TOKENS'
    }))
  },
  { additionalProperties: false }
)

export const ToolSelectionSchema = Type.Array(
  Type.Union([Type.String({ pattern: '^([A-Za-z0-9_-]{1,64}|[A-Za-z0-9_-]{1,32}__\\*)$', description: 'a tool name, or <server>__* for every tool of an MCP server' }), ref(WebhookToolSpecSchema), ref(ClientToolSpecSchema)]),
  { maxItems: 64, description: 'built-in tool names and client-brought ToolSpecs; omitted = the fs_* built-ins, [] = none' }
)

export const MetadataSchema = Type.Record(Type.String({ maxLength: 64 }), Type.String({ maxLength: 1024 }), {
  maxProperties: 64
})

export const CreateSessionBodySchema = Type.Object(
  {
    model: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
    instructions: Type.Optional(Type.String({ maxLength: 100_000 })),
    tools: Type.Optional(ToolSelectionSchema),
    approval: Type.Optional(ApprovalSchema),
    limits: Type.Optional(LimitsSchema),
    metadata: Type.Optional(MetadataSchema)
  },
  { additionalProperties: false }
)
export type CreateSessionBody = Static<typeof CreateSessionBodySchema>

export const SessionSchema = Type.Object(
  {
    id: Type.String({ pattern: ID_PATTERN.session }),
    createdAt: Type.String({ format: 'date-time' }),
    updatedAt: Type.String({ format: 'date-time' }),
    status: SessionStatusSchema,
    model: Type.String(),
    instructions: Type.Union([Type.String(), Type.Null()]),
    tools: ToolSelectionSchema,
    approval: ApprovalSchema,
    limits: LimitsSchema,
    metadata: MetadataSchema,
    lastSeq: Type.Integer({ minimum: 0, description: 'seq of the newest event' }),
    usage: ref(UsageSchema),
    forkedFrom: Type.Union([
      Type.Object({ sessionId: Type.String(), atSeq: Type.Integer({ minimum: 0 }) }),
      Type.Null()
    ])
  },
  { $id: 'Session' }
)
export type Session = Static<typeof SessionSchema>

export const SessionParamsSchema = Type.Object({
  id: Type.String({ minLength: 1, maxLength: 64, description: 'a session ID (ses_…)' })
})

/** Sessions per page when the query names no limit. */
export const SESSION_PAGE_SIZE = 20

export const ListSessionsQuerySchema = Type.Object(
  {
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100, default: SESSION_PAGE_SIZE })),
    cursor: Type.Optional(Type.String({ maxLength: 200, description: 'nextCursor of the previous page' }))
  },
  { additionalProperties: false }
)

export const SessionPageSchema = Type.Object({
  data: Type.Array(ref(SessionSchema)),
  nextCursor: Type.Union([Type.String(), Type.Null()])
})

export const ForkBodySchema = Type.Object(
  { atSeq: Type.Optional(Type.Integer({ minimum: 0, description: 'copy history up to and including this event; default: the last one' })) },
  { additionalProperties: false }
)
