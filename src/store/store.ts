import type { ClassifiedError, Usage } from '../schemas/common.ts'

/**
 * The narrow persistence interface. Routes and the agent loop only ever see this; the SQLite
 * and PostgreSQL implementations live behind it. Every method is async so that a networked
 * store fits unchanged. Every write is committed when its promise resolves: callers publish
 * (SSE, webhooks) only after that, which is what makes "nothing committed is lost" hold.
 */
export interface Store {
  readonly kind: 'sqlite' | 'postgres'
  /** Applies pending migrations; idempotent. */
  migrate(): Promise<void>
  /** Throws when the store cannot answer (used by /readyz). */
  ping(): Promise<void>
  close(): Promise<void>

  createSession(session: SessionRecord): Promise<void>
  /** A session of this tenant, or null (also for another tenant's or a deleted session). */
  getSession(tenant: string, id: string): Promise<SessionRecord | null>
  /** Newest first; `before` is the ID of the last session of the previous page. */
  /** A session whatever its tenant: for the service's own work (recovery), never for a request. */
  getSessionById(id: string): Promise<SessionRecord | null>
  listSessions(tenant: string, options: { limit: number; before?: string }): Promise<SessionRecord[]>
  countSessions(tenant: string): Promise<number>
  updateSession(id: string, patch: SessionPatch): Promise<void>
  /** Adds usage to the session's running total. */
  addSessionUsage(id: string, usage: Usage): Promise<void>
  /** Deletes the session and everything that belongs to it; false when there was none. */
  deleteSession(tenant: string, id: string): Promise<boolean>

  /** Stores the event with the next `seq` of its session, atomically, and returns it. */
  appendEvent(event: NewEvent): Promise<EventRecord>
  /** Events with seq > after, ascending, optionally filtered. */
  listEvents(sessionId: string, query: EventQuery): Promise<EventRecord[]>

  /**
   * Creates `target` with the source session's events up to atSeq (same seq numbers) and the
   * messages stored up to that event (new IDs), in one transaction.
   */
  forkSession(sourceId: string, target: SessionRecord, atSeq: number, newMessageId: () => string): Promise<void>

  addMessage(message: MessageRecord): Promise<void>
  listMessages(sessionId: string): Promise<MessageRecord[]>

  createRun(run: RunRecord): Promise<void>
  getRun(sessionId: string, runId: string): Promise<RunRecord | null>
  updateRun(id: string, patch: RunPatch): Promise<void>
  /** Runs in any non-final status, oldest first (queued, running, awaiting_*); for recovery. */
  listUnfinishedRuns(): Promise<RunRecord[]>

  /** Inserts or replaces the call's current state. */
  saveToolCall(call: ToolCallRecord): Promise<void>
  getToolCall(sessionId: string, callId: string): Promise<ToolCallRecord | null>
  listToolCalls(runId: string): Promise<ToolCallRecord[]>

  /**
   * Claims an idempotency key for a request. Returns 'claimed' when the caller should process
   * the request and later call completeIdempotency or releaseIdempotency.
   */
  claimIdempotency(claim: IdempotencyClaim): Promise<IdempotencyOutcome>
  completeIdempotency(tenant: string, key: string, response: { status: number; body: unknown }): Promise<void>
  releaseIdempotency(tenant: string, key: string): Promise<void>
  /** Forgets records created before `olderThan`. */
  purgeIdempotency(olderThan: Date): Promise<number>
}

export type SessionStatus = 'idle' | 'running' | 'awaiting_approval' | 'awaiting_tool_result'
export type RunStatus = 'queued' | 'running' | 'awaiting_approval' | 'awaiting_tool_result' | 'completed' | 'failed' | 'cancelled'
export type ToolCallState = 'pending' | 'approval_required' | 'executing' | 'completed' | 'failed' | 'denied' | 'sealed'

export interface ApprovalPolicy {
  mode: 'auto' | 'always' | 'tools'
  tools?: string[]
}

export interface RunLimits {
  maxSteps?: number
  toolTimeoutMs?: number
  maxTokens?: number
  contextTokens?: number
}

export interface SessionRecord {
  id: string
  tenant: string
  createdAt: string
  updatedAt: string
  status: SessionStatus
  model: string
  instructions: string | null
  /** The selection as the client gave it: names and ToolSpecs (null = server defaults). */
  tools: unknown[] | null
  approval: ApprovalPolicy
  limits: RunLimits
  metadata: Record<string, string>
  lastSeq: number
  usage: Usage
  forkedFrom: { sessionId: string; atSeq: number } | null
}

export type SessionPatch = Partial<Pick<SessionRecord, 'status' | 'updatedAt'>>

export interface MessageToolCall {
  id: string
  name: string
  /** The arguments as the model sent them (a JSON string, possibly invalid). */
  arguments: string
}

export interface MessageRecord {
  id: string
  sessionId: string
  runId: string | null
  role: 'user' | 'assistant' | 'tool' | 'summary'
  content: string | null
  toolCalls?: MessageToolCall[]
  toolCallId?: string
  /** Of a summary: how many messages, from the first, it stands for in what the model is sent (SPEC 12). */
  replacesMessages?: number
  createdAt: string
}

export interface RunRecord {
  id: string
  sessionId: string
  status: RunStatus
  requestId: string
  steps: number
  usage: Usage
  error: ClassifiedError | null
  /** The user message this run answers; stored in messages when the run starts. */
  messageId: string
  /** That message's text, kept with the run so that a queued run survives a restart. */
  input: string
  createdAt: string
  startedAt: string | null
  endedAt: string | null
}

export type RunPatch = Partial<Pick<RunRecord, 'status' | 'steps' | 'usage' | 'error' | 'startedAt' | 'endedAt'>>

export interface ToolCallRecord {
  id: string
  sessionId: string
  runId: string
  step: number
  name: string
  input: unknown
  state: ToolCallState
  startedAt: string
  endedAt: string | null
  durationMs: number | null
  result?: unknown
  error?: ClassifiedError
}

export type EventChannel = 'progress' | 'control' | 'monitor'

export interface NewEvent {
  sessionId: string
  runId: string | null
  channel: EventChannel
  type: string
  at: string
  requestId: string | null
  data: Record<string, unknown>
}

export interface EventRecord extends NewEvent {
  seq: number
}

export interface EventQuery {
  after: number
  limit?: number
  /** Only events with seq <= this one (used by fork). */
  untilSeq?: number
  channels?: EventChannel[]
  types?: string[]
}

export interface IdempotencyClaim {
  tenant: string
  key: string
  /** Method, route and a hash of the body: the same key with another request is a reuse. */
  fingerprint: string
  createdAt: string
}

export type IdempotencyOutcome =
  | { state: 'claimed' }
  | { state: 'in_progress' }
  | { state: 'mismatch' }
  | { state: 'completed'; status: number; body: unknown }
