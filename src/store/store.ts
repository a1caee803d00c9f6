import type { ClassifiedError, Usage } from '../schemas/common.ts'

/**
 * The narrow persistence interface. Routes and the agent loop only ever see this; the SQLite
 * and PostgreSQL implementations live behind it, and one contract suite (test/store/contract.ts)
 * holds every implementation to the same behaviour. Every method is async so that a networked
 * store fits unchanged.
 *
 * What is atomic is said here, never left to timing: each method is one unit of work, and the
 * agent loop's related writes (a step's message, usage and events; a tool call's final state,
 * its events and its answer; a run's error, status and `done`) go through `commit`, which applies
 * a list of writes in one transaction, all or none. A write is committed when its promise
 * resolves: callers publish (SSE, webhooks) only after that, which is what makes "nothing
 * committed is lost" hold.
 */
export interface Store {
  readonly kind: 'sqlite' | 'postgres'
  /** Applies pending migrations; idempotent. */
  migrate(): Promise<void>
  /** Throws when the store cannot answer (used by /readyz). */
  ping(): Promise<void>
  close(): Promise<void>

  /**
   * Applies the writes in one transaction, in order: all of them or none. Each event gets the
   * next `seq` of its session, allocated inside the transaction (so seq stays gap-free with any
   * number of writers); a message is placed after the events written before it. Resolves with
   * the stored events, in seq order per session, once committed. A write for a session that
   * does not exist (any more) fails the unit with SessionGoneError.
   */
  commit(writes: readonly StoreWrite[]): Promise<EventRecord[]>

  /** Fails with TenantFullError, inserting nothing, when the tenant already holds `maxSessions` (when given). */
  createSession(session: SessionRecord, maxSessions?: number): Promise<void>
  /** A session of this tenant, or null (also for another tenant's, a deleted one, or one whose deletion has begun). */
  getSession(tenant: string, id: string): Promise<SessionRecord | null>
  /** A session whatever its tenant: for the service's own work (recovery), never for a request. */
  getSessionById(id: string): Promise<SessionRecord | null>
  /** Whether getSessionById would find it, without reading the row (a stream asks for every run). */
  hasSession(id: string): Promise<boolean>
  /** Newest first; `before` is the ID of the last session of the previous page. */
  listSessions(tenant: string, options: { limit: number; before?: string }): Promise<SessionRecord[]>
  countSessions(tenant: string): Promise<number>
  /** Deletes the session and everything that belongs to it; false when there was none. */
  deleteSession(tenant: string, id: string): Promise<boolean>

  /** Events with seq > after, ascending, optionally filtered. */
  listEvents(sessionId: string, query: EventQuery): Promise<EventRecord[]>

  /**
   * Creates `target` as a fork of the source session at `atSeq`, whole or not at all (SQLite copies
   * a long session in pieces, the fork hidden until it is whole): a fork holds only runs that had
   * finished by then, so a point inside a run moves back to just before that run's first event.
   * The events up to that point keep their seq numbers, the messages stored up to it are copied
   * (new IDs, from `newMessageId`), and a tool call still without an answer gets a sealed one
   * (`sealedAnswer`), so the fork's history is always consistent. Resolves with the fork as stored
   * (its `lastSeq` is the point actually used); fails with SessionGoneError when the source is
   * gone, or is deleted before the fork is whole, and with TenantFullError when the target's
   * tenant already holds `maxSessions` (when given).
   */
  forkSession(sourceId: string, target: SessionRecord, atSeq: number, seal: ForkSealing, maxSessions?: number): Promise<SessionRecord>

  listMessages(sessionId: string): Promise<MessageRecord[]>
  /**
   * What a run builds its model context from (SPEC 12): the session's messages after the first
   * `replacesMessages` of its newest summary (the summary among them, as it is stored after the
   * messages it stands for), and how many were left unread before them (`offset`). The whole
   * history, offset 0, while the session has no summary. A long session is read from its newest
   * summary on, not from its first message, at every run's start.
   */
  listContextMessages(sessionId: string): Promise<{ messages: MessageRecord[]; offset: number }>
  /**
   * At most `limit` messages of the session in order, after the message `after` (from the first
   * when omitted); null when `after` is not a message of this session.
   */
  pageMessages(sessionId: string, options: { limit: number; after?: string }): Promise<MessageRecord[] | null>

  getRun(sessionId: string, runId: string): Promise<RunRecord | null>
  /** Runs in any non-final status, oldest first (queued, running, awaiting_*); for recovery. */
  listUnfinishedRuns(): Promise<RunRecord[]>

  getToolCall(sessionId: string, callId: string): Promise<ToolCallRecord | null>
  listToolCalls(runId: string): Promise<ToolCallRecord[]>
  /** A session's tool calls, oldest first, each with its run's request ID; `after` is the last call ID of the previous page. */
  listSessionToolCalls(sessionId: string, options: { limit: number; after?: string }): Promise<AuditedToolCall[]>

  /**
   * Claims an idempotency key for a request. Returns 'claimed' when the caller should process
   * the request and later call completeIdempotency or releaseIdempotency. A claim still in
   * progress whose `leaseUntil` has passed belongs to a holder that is gone (a crash): it is
   * taken over and answered 'claimed'.
   */
  claimIdempotency(claim: IdempotencyClaim): Promise<IdempotencyOutcome>
  completeIdempotency(tenant: string, key: string, response: { status: number; body: unknown }): Promise<void>
  releaseIdempotency(tenant: string, key: string): Promise<void>
  /** Extends an in-progress claim that this holder still works on. */
  renewIdempotency(tenant: string, key: string, leaseUntil: string): Promise<void>
  /** Forgets records created before `olderThan`. */
  purgeIdempotency(olderThan: Date): Promise<number>
}

/**
 * A write for a session that no longer exists (it was deleted meanwhile). Not a failure of the
 * store: the work that belonged to that session simply ends.
 */
export class SessionGoneError extends Error {
  readonly code = 'SESSION_GONE'
  constructor(sessionId?: string) {
    super(sessionId ? `session ${sessionId} does not exist` : 'the session does not exist')
  }
}

/**
 * Thrown when a new session (or a fork) would take its tenant past the most it may hold: the store
 * counts the tenant's sessions in the same transaction as the insert, so concurrent creations cannot
 * pass the check together.
 */
export class TenantFullError extends Error {
  readonly code = 'TENANT_FULL'
  readonly maxSessions: number
  constructor(maxSessions: number) {
    super(`the tenant holds ${maxSessions} sessions, the most it may`)
    this.maxSessions = maxSessions
  }
}

/** Whether a store call failed because its session is gone (SessionGoneError). */
export const isSessionGone = (err: unknown): boolean => (err as { code?: unknown } | null)?.code === 'SESSION_GONE'

/** Errors of a socket that lost (or never reached) the database server. */
const CONNECTION_ERRNOS = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN'])
/** pg's own messages for a connection that broke or never came (they carry no code). */
const PG_CONNECTION_MESSAGE = /^(Connection terminated|timeout exceeded when trying to connect|Query read timeout|Client has encountered a connection error|Client was closed)/
/**
 * SQLite's primary result codes for a database that cannot be written now, whatever is asked:
 * BUSY 5, LOCKED 6, READONLY 8, IOERR 10, FULL 13 (disk full), CANTOPEN 14. node:sqlite gives
 * the extended code in `errcode`; its low byte is the primary one.
 */
const SQLITE_UNAVAILABLE = new Set([5, 6, 8, 10, 13, 14])

/**
 * Why a store call failed when the cause is the database's availability rather than the call:
 * `unreachable` (PostgreSQL cannot be reached, or stopped answering: the connection broke, the
 * server is shutting down or starting, it has no connection slot left) or `failing` (the database
 * answers but cannot write: a full disk, an I/O error). Either way the same call can succeed later
 * (a request answers 503 UNAVAILABLE, retryable); null for every other failure (a bug is a 500).
 */
export function storeUnavailable(err: unknown): 'unreachable' | 'failing' | null {
  if (err === null || typeof err !== 'object') return null
  const { code, errcode, message } = err as { code?: unknown; errcode?: unknown; message?: unknown }
  if (code === 'STORE_CLOSED') return 'unreachable'
  if (typeof code === 'string') {
    if (CONNECTION_ERRNOS.has(code)) return 'unreachable'
    // SQLSTATE: class 08 connection exception; 57P01-57P03 shutting down, crashed, starting up;
    // class 53 insufficient resources: 53300 too many connections, 53100 disk full.
    if (/^08...$/.test(code) || /^57P0[123]$/.test(code) || code === '53300') return 'unreachable'
    if (/^53...$/.test(code) || code === '58030') return 'failing'
    if (code === 'ERR_SQLITE_ERROR' && typeof errcode === 'number' && SQLITE_UNAVAILABLE.has(errcode & 0xff)) return 'failing'
  }
  if (typeof message === 'string' && PG_CONNECTION_MESSAGE.test(message)) return 'unreachable'
  return null
}

/** One write of a unit of work (Store.commit). */
export type StoreWrite =
  | { type: 'event'; event: NewEvent }
  | { type: 'message'; message: MessageRecord }
  | { type: 'newRun'; run: RunRecord }
  | { type: 'run'; id: string; patch: RunPatch }
  | { type: 'session'; id: string; patch: SessionPatch }
  /** Adds usage to the session's running total, which stops at MOST_TOKENS (rows.ts). */
  | { type: 'usage'; sessionId: string; usage: Usage }
  /** Inserts or replaces the call's current state. */
  | { type: 'toolCall'; call: ToolCallRecord }

/** How a fork answers a tool call whose result it does not hold. */
export interface ForkSealing {
  newMessageId(): string
  /** The tool message content that seals an unanswered call of this tool. */
  sealedAnswer(toolName: string): string
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
  /**
   * The W3C traceparent of the request that submitted the run, when it had one: the process that
   * starts the run, whichever it is, continues that trace. Never part of the API's view.
   */
  traceparent?: string
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

/** A tool call as the audit route shows it: with the request ID of the run that made it. */
export interface AuditedToolCall extends ToolCallRecord {
  requestId: string | null
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

/**
 * The JSON text of an event's data as a store wrote or read it, kept on the record under a symbol
 * (JSON.stringify and Object.keys skip it) so that the SSE encoder does not serialise the data a
 * second time (a tool's result can be 100 KB). It holds for the data object it was made from: a
 * copy of the record with other data is encoded from its data. A WeakMap beside the records cost
 * more than it saved (its entries are ephemerons for the GC).
 */
const DATA_JSON = Symbol('agentd.dataJson')

type WithDataJson = EventRecord & { [DATA_JSON]?: { of: unknown; json: string } }

/** Keeps `json` (the event's data as the store wrote or read it) on the record; returns the record. */
export function withDataJson(event: EventRecord, json: string): EventRecord {
  ;(event as WithDataJson)[DATA_JSON] = { of: event.data, json }
  return event
}

/** The event's data as JSON text: the store's, or serialised now. */
export function dataJsonOf(event: EventRecord): string {
  const kept = (event as WithDataJson)[DATA_JSON]
  return kept !== undefined && kept.of === event.data ? kept.json : JSON.stringify(event.data)
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
  /**
   * Until when the claim holds while in progress; its holder renews it (renewIdempotency) while it
   * works. The PostgreSQL store counts the time left from the database's clock, which every machine shares.
   */
  leaseUntil: string
}

export type IdempotencyOutcome =
  | { state: 'claimed' }
  | { state: 'in_progress' }
  | { state: 'mismatch' }
  | { state: 'completed'; status: number; body: unknown }
