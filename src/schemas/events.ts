import { Type, type TObject, type TSchema } from '@sinclair/typebox'
import type { EventRecord } from '../store/store.ts'
import { ClassifiedErrorSchema, ref, StringEnum, UsageSchema } from './common.ts'
import { RunStatusSchema } from './messages.ts'

/** SPEC 4: a tool call as events show it. */
const ToolCallSnapshotSchema = Type.Object(
  {
    id: Type.String(),
    name: Type.String(),
    input: Type.Unknown({ description: 'the arguments, as the model sent them' }),
    state: StringEnum(['pending', 'approval_required', 'executing', 'completed', 'failed', 'denied', 'sealed']),
    startedAt: Type.String({ format: 'date-time' }),
    endedAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
    durationMs: Type.Union([Type.Number({ minimum: 0 }), Type.Null()]),
    result: Type.Optional(Type.Unknown({ description: 'what the tool returned, once completed' })),
    error: Type.Optional(ref(ClassifiedErrorSchema))
  },
  { $id: 'ToolCallSnapshot' }
)

const call = { call: ref(ToolCallSnapshotSchema) }
const step = { step: Type.Integer({ minimum: 0 }) }

/**
 * One member of the Event union: the common envelope of every event, with `channel` and `type`
 * fixed and `data` of that type's own shape.
 */
function eventOf(
  $id: string, channel: 'progress' | 'control' | 'monitor', type: string | TSchema, data: TObject, description: string
) {
  return Type.Object(
    {
      seq: Type.Integer({ minimum: 1, description: 'per session: 1, 2, 3 … without gaps; the SSE id' }),
      sessionId: Type.String(),
      runId: Type.Union([Type.String(), Type.Null()]),
      channel: Type.Literal(channel),
      type: typeof type === 'string' ? Type.Literal(type) : type,
      at: Type.String({ format: 'date-time' }),
      requestId: Type.Union([Type.String(), Type.Null()], { description: 'X-Request-Id of the request that started the run' }),
      data
    },
    { $id, description }
  )
}

const textBlock = (kind: 'text' | 'think', what: string) => [
  eventOf(`${kind === 'text' ? 'Text' : 'Think'}ChunkStartEvent`, 'progress', `${kind}_chunk_start`, Type.Object(step), `${what} of a step begins`),
  eventOf(`${kind === 'text' ? 'Text' : 'Think'}ChunkEvent`, 'progress', `${kind}_chunk`, Type.Object({ ...step, delta: Type.String() }), `a piece of ${what}`),
  eventOf(`${kind === 'text' ? 'Text' : 'Think'}ChunkEndEvent`, 'progress', `${kind}_chunk_end`, Type.Object({ ...step, text: Type.String({ description: 'the whole block' }) }), `${what} of a step ends`)
]

/** A tool's own progress event (ToolContext.emit): its type is `tool:<kind>`, a kind the tool chose. */
const ToolProgressEventSchema = eventOf(
  'ToolProgressEvent', 'progress',
  Type.String({ pattern: '^tool:(?!(start|end|error)$).+$', description: 'tool:<kind>, a kind the tool chose' }),
  Type.Object({ callId: Type.String(), name: Type.String({ description: 'the tool' }) }, { additionalProperties: true }),
  "a tool's own progress report; data holds the tool's fields besides callId and name"
)

/** Every event type agentd emits, one schema each (SPEC 4). */
const eventTypeSchemas = [
  ...textBlock('text', 'the answer text'),
  ...textBlock('think', 'the reasoning the model sends'),
  eventOf('ToolStartEvent', 'progress', 'tool:start', Type.Object(call), 'a tool call starts'),
  eventOf('ToolEndEvent', 'progress', 'tool:end', Type.Object(call), 'a tool call ended, whatever its outcome (follows every tool:start)'),
  eventOf('ToolErrorEvent', 'progress', 'tool:error', Type.Object({ ...call, error: ref(ClassifiedErrorSchema) }), 'a tool call failed'),
  ToolProgressEventSchema,
  eventOf('DoneEvent', 'progress', 'done', Type.Object({
    ...step,
    reason: StringEnum(['completed', 'interrupted', 'failed', 'max_steps']),
    runId: Type.String()
  }), 'the run ended; the last event of every run'),
  eventOf('PermissionRequiredEvent', 'control', 'permission_required', Type.Object(call),
    'a call waits for POST /v1/sessions/{id}/approvals/{callId}'),
  eventOf('PermissionDecidedEvent', 'control', 'permission_decided', Type.Object({
    callId: Type.String(),
    decision: StringEnum(['allow', 'deny']),
    note: Type.Union([Type.String(), Type.Null()])
  }), 'an approval was answered'),
  eventOf('ToolResultRequiredEvent', 'control', 'tool_result_required', Type.Object(call),
    'a client tool call waits for POST /v1/sessions/{id}/tool-results/{callId}'),
  eventOf('StateChangedEvent', 'monitor', 'state_changed', Type.Object({ from: RunStatusSchema, to: RunStatusSchema }), 'the run changed status'),
  eventOf('StepCompleteEvent', 'monitor', 'step_complete', Type.Object({
    ...step, durationMs: Type.Number({ minimum: 0 }), usage: ref(UsageSchema)
  }), 'a model call and its tool calls are done'),
  eventOf('TokenUsageEvent', 'monitor', 'token_usage', Type.Object({
    inputTokens: Type.Integer({ minimum: 0 }), outputTokens: Type.Integer({ minimum: 0 }), totalTokens: Type.Integer({ minimum: 0 }),
    purpose: Type.Optional(StringEnum(['summary'], { description: 'summary: the call that summarised the history (SPEC 12); absent for a step\'s call' }))
  }), 'tokens of one model call'),
  eventOf('ModelRetryEvent', 'monitor', 'model_retry', Type.Object({
    attempt: Type.Integer({ minimum: 1 }),
    delayMs: Type.Number({ minimum: 0 }),
    code: Type.String({ description: 'the model error code that is retried' }),
    status: Type.Optional(Type.Union([Type.Integer(), Type.Null()], { description: "the provider's HTTP status, if it answered" }))
  }), 'a model call is retried after a retryable error'),
  eventOf('ToolExecutedEvent', 'monitor', 'tool_executed', Type.Object({
    ...call, durationMs: Type.Union([Type.Number({ minimum: 0 }), Type.Null()]), ok: Type.Boolean()
  }), 'a tool call ran'),
  eventOf('ErrorEvent', 'monitor', 'error', Type.Object({
    severity: StringEnum(['warn', 'error']),
    phase: StringEnum(['model', 'tool', 'sandbox', 'system']),
    message: Type.String(),
    detail: ref(ClassifiedErrorSchema)
  }), 'an error: warn when the run goes on, error when it ends the run'),
  eventOf('RunRecoveredEvent', 'monitor', 'run_recovered', Type.Object({
    runId: Type.String(),
    previousStatus: RunStatusSchema,
    sealedCalls: Type.Array(Type.String(), { description: 'IDs of the calls that got a sealed result' })
  }), 'after a restart, a run the previous process left unfinished was ended or queued again'),
  eventOf('ContextCompactedEvent', 'monitor', 'context_compacted', Type.Object({
    ...step,
    method: StringEnum(['tool_outputs', 'summary', 'truncation']),
    removedMessages: Type.Integer({ minimum: 0 }),
    cutToolOutputs: Type.Integer({ minimum: 0, description: 'tool outputs cut short' }),
    tokensBefore: Type.Integer({ minimum: 0 }),
    tokensAfter: Type.Integer({ minimum: 0 }),
    budget: Type.Integer({ minimum: 0, description: 'the tokens the history had to fit in' }),
    summaryMessageId: Type.Union([Type.String(), Type.Null()], { description: 'the summary message this compaction wrote, if any' }),
    harder: Type.Boolean({ description: 'after the provider refused a request as too long' })
  }), 'the history was fitted into the context window (SPEC 12)'),
  eventOf('HookDecidedEvent', 'control', 'hook_decided', Type.Object({
    hook: Type.String({ description: "the hook's name" }),
    callId: Type.String(),
    decision: StringEnum(['allow', 'deny', 'ask', 'replace', 'keep', 'withhold'], {
      description: 'preToolUse: allow, deny or ask (for a person\'s approval); postToolUse: replace or keep what the model reads, or withhold it (a failed hook with onFailure deny)'
    }),
    reason: Type.Optional(Type.Union([Type.String(), Type.Null()])),
    input: Type.Optional(Type.Unknown({ description: 'the input a preToolUse hook rewrote the call to' }))
  }), 'a preToolUse or postToolUse hook decided on a call')
] as const

const fixedTypeSchemas = eventTypeSchemas.filter((schema) => schema.$id !== ToolProgressEventSchema.$id)

/** Every event whose type is a fixed name, discriminated by `type` (the discriminator mapping names each). */
const CoreEventSchema = Type.Unsafe<EventRecord>({
  $id: 'CoreEvent',
  oneOf: fixedTypeSchemas.map((schema) => ({ $ref: schema.$id })),
  discriminator: {
    propertyName: 'type',
    mapping: Object.fromEntries(
      fixedTypeSchemas.map((schema) => [String(schema.properties.type.const), `#/components/schemas/${schema.$id}`])
    )
  }
})

/** SPEC 4: one event. A CoreEvent, or a tool's own `tool:<kind>` progress event, whose type is not a fixed name. */
const EventUnionSchema = Type.Unsafe<EventRecord>({
  $id: 'Event',
  description: 'One event. Clients should ignore types they do not know: new ones may be added.',
  oneOf: [{ $ref: CoreEventSchema.$id }, { $ref: ToolProgressEventSchema.$id }]
})

/**
 * What the routes serialise an event with: its envelope, with `data` passed through as it is.
 * The union with a data schema per type would cost every route's serializer a compile of about
 * twenty schemas at start-up and a validation per member for every event sent, so it is only in
 * the OpenAPI document (eventDocumentSchemas replaces this there); test/schemas/events.test.ts
 * checks that real events of every kind match it.
 */
export const EventSchema = Type.Unsafe<EventRecord>(Type.Object(
  {
    seq: Type.Integer({ minimum: 1 }),
    sessionId: Type.String(),
    runId: Type.Union([Type.String(), Type.Null()]),
    channel: Type.String(),
    type: Type.String(),
    at: Type.String(),
    requestId: Type.Union([Type.String(), Type.Null()]),
    data: Type.Object({}, { additionalProperties: true })
  },
  { $id: 'Event' }
))

/**
 * The event schemas as OpenAPI components: ToolCallSnapshot, one schema per type, CoreEvent and
 * the Event union, with their references pointing into components.
 */
export function eventDocumentSchemas(): Record<string, unknown> {
  const schemas = [ToolCallSnapshotSchema, ...eventTypeSchemas, CoreEventSchema, EventUnionSchema]
  const toComponentRefs = (_key: string, value: unknown) =>
    typeof value === 'string' && _key === '$ref' && !value.startsWith('#') ? `#/components/schemas/${value}` : value
  return Object.fromEntries(schemas.map((schema) => {
    const { $id, ...rest } = JSON.parse(JSON.stringify(schema, toComponentRefs)) as Record<string, unknown>
    return [String($id), rest]
  }))
}

export const EventsQuerySchema = Type.Object(
  {
    after: Type.Optional(Type.Integer({ minimum: 0, description: 'replay events with a larger seq; a Last-Event-ID header wins over it (an EventSource reconnecting to the URL it was opened with sends where it got to)' })),
    channels: Type.Optional(Type.String({ pattern: '^(progress|control|monitor)(,(progress|control|monitor))*$', description: 'comma list' })),
    types: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9_:]+(,[A-Za-z0-9_:]+)*$', maxLength: 1000, description: 'comma list of event types' })),
    until: Type.Optional(StringEnum(['done'], { description: 'end the stream after the next done event' })),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100, description: 'page size of the JSON form' })),
    token: Type.Optional(Type.String({
      maxLength: 2048,
      description: 'a stream token from POST /v1/sessions/{id}/stream-tokens, for clients that cannot send Authorization (EventSource)'
    }))
  },
  { additionalProperties: false }
)

export const EventsHeadersSchema = Type.Object({
  'last-event-id': Type.Optional(Type.String({ pattern: '^[0-9]{1,15}$', description: 'resume after this seq (EventSource sends it on reconnect)' }))
})
