import { withDataJson, type EventRecord, type MessageRecord, type RunRecord, type SessionRecord, type ToolCallRecord } from './store.ts'

/**
 * Rows as both SQL stores read and write them: the same columns, JSON kept as text. One place,
 * so that a column added to one store's records is added to the other's.
 */
export type Row = Record<string, unknown>

/**
 * The most a session's token total holds (2^53 - 1): a sum stops there. A provider may report any
 * safe integer for one call, and a larger sum is one that JSON clients cannot read exactly and that
 * node:sqlite refuses to read at all (every read of the session failed, and its tenant's listing).
 */
export const MOST_TOKENS = Number.MAX_SAFE_INTEGER

export const json = (value: unknown): string | null => (value === undefined ? null : JSON.stringify(value))
export const parse = <T>(text: unknown): T => (text === null || text === undefined ? (null as T) : (JSON.parse(String(text)) as T))

/**
 * A session as the parameters of INSERT_SESSION; without last_seq (`withLastSeq` false) for the
 * SQLite store, which finds a session's newest seq from its events instead of keeping a column.
 */
export function sessionParams(s: SessionRecord, withLastSeq = true): Array<string | number | null> {
  return [
    s.id, s.tenant, s.createdAt, s.updatedAt, s.status, s.model, s.instructions, json(s.tools),
    json(s.approval), json(s.limits), json(s.metadata), ...(withLastSeq ? [s.lastSeq] : []), s.usage.inputTokens, s.usage.outputTokens,
    s.usage.totalTokens, json(s.forkedFrom)
  ]
}

export function toSession(row: Row): SessionRecord {
  return {
    id: String(row.id),
    tenant: String(row.tenant),
    createdAt: String(row.created_at),
    updatedAt: String(row.updated_at),
    status: row.status as SessionRecord['status'],
    model: String(row.model),
    instructions: (row.instructions as string | null) ?? null,
    tools: parse(row.tools),
    approval: parse(row.approval),
    limits: parse(row.limits),
    metadata: parse(row.metadata),
    lastSeq: Number(row.last_seq),
    usage: { inputTokens: Number(row.input_tokens), outputTokens: Number(row.output_tokens), totalTokens: Number(row.total_tokens) },
    forkedFrom: parse(row.forked_from)
  }
}

export function toEvent(row: Row): EventRecord {
  const event: EventRecord = {
    seq: Number(row.seq),
    sessionId: String(row.session_id),
    runId: (row.run_id as string | null) ?? null,
    channel: row.channel as EventRecord['channel'],
    type: String(row.type),
    at: String(row.at),
    requestId: (row.request_id as string | null) ?? null,
    data: parse(row.data)
  }
  // The data as stored is its JSON already; a driver that hands it over parsed gets it encoded again.
  return typeof row.data === 'string' ? withDataJson(event, row.data) : event
}

export function toMessage(row: Row): MessageRecord {
  const message: MessageRecord = {
    id: String(row.id),
    sessionId: String(row.session_id),
    runId: (row.run_id as string | null) ?? null,
    role: row.role as MessageRecord['role'],
    content: (row.content as string | null) ?? null,
    createdAt: String(row.created_at)
  }
  if (row.tool_calls !== null) message.toolCalls = parse(row.tool_calls)
  if (row.tool_call_id !== null) message.toolCallId = String(row.tool_call_id)
  if (row.replaces_messages !== null) message.replacesMessages = Number(row.replaces_messages)
  return message
}

/**
 * A new run's INSERT on PostgreSQL, for the store's own write and the run coordinator's admission:
 * one list of columns, so that a column added to runs is added here for both (SQLite's INSERT is
 * its own, in sqlite.ts). tenant: the session's, which the coordinator's admission counts
 * (agentd_tenant_runs); null from the store's write, whose run records do not carry it. Here
 * rather than in postgres.ts: the coordinator is loaded by SQLite processes too, which never load `pg`.
 */
export function insertRun(r: RunRecord, tenant: string | null): { sql: string; params: Array<string | number | null> } {
  return {
    sql: `INSERT INTO runs (id, session_id, tenant, status, request_id, steps, usage, error, message_id, input, created_at, started_at, ended_at,
        traceparent) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
    params: [
      r.id, r.sessionId, tenant, r.status, r.requestId, r.steps, json(r.usage), json(r.error), r.messageId, r.input, r.createdAt, r.startedAt,
      r.endedAt, r.traceparent ?? null
    ]
  }
}

export function toRun(row: Row): RunRecord {
  return {
    id: String(row.id),
    sessionId: String(row.session_id),
    status: row.status as RunRecord['status'],
    requestId: String(row.request_id),
    steps: Number(row.steps),
    usage: parse(row.usage),
    error: parse(row.error),
    messageId: String(row.message_id),
    input: String(row.input),
    createdAt: String(row.created_at),
    startedAt: (row.started_at as string | null) ?? null,
    endedAt: (row.ended_at as string | null) ?? null,
    ...(typeof row.traceparent === 'string' ? { traceparent: row.traceparent } : {})
  }
}

export function toToolCall(row: Row): ToolCallRecord {
  const call: ToolCallRecord = {
    id: String(row.id),
    sessionId: String(row.session_id),
    runId: String(row.run_id),
    step: Number(row.step),
    name: String(row.name),
    input: parse(row.input),
    state: row.state as ToolCallRecord['state'],
    startedAt: String(row.started_at),
    endedAt: (row.ended_at as string | null) ?? null,
    durationMs: row.duration_ms === null ? null : Number(row.duration_ms)
  }
  if (row.result !== null) call.result = parse(row.result)
  if (row.error !== null) call.error = parse(row.error)
  return call
}
