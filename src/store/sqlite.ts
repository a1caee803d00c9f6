import { mkdirSync } from 'node:fs'
import { dirname } from 'node:path'
import { DatabaseSync, type StatementSync } from 'node:sqlite'
import type { Usage } from '../schemas/common.ts'
import { sqliteMigrations } from './sqlite-migrations.ts'
import type {
  EventQuery, EventRecord, IdempotencyClaim, IdempotencyOutcome, MessageRecord, NewEvent, RunPatch,
  RunRecord, SessionPatch, SessionRecord, Store, ToolCallRecord
} from './store.ts'

type Row = Record<string, unknown>
type Param = string | number | null

interface PendingWrite {
  work: () => unknown
  /** Runs in a savepoint: a write of several statements that must fail as a whole. */
  atomic: boolean
  resolve: (value: unknown) => void
  reject: (reason: unknown) => void
}

const json = (value: unknown): string | null => (value === undefined ? null : JSON.stringify(value))
const parse = <T>(text: unknown): T => (text === null || text === undefined ? (null as T) : (JSON.parse(String(text)) as T))

/** Thrown when the store was used after close(); the routes turn it into 503 UNAVAILABLE. */
export class StoreClosedError extends Error {
  readonly code = 'STORE_CLOSED'
  constructor() {
    super('the store is closed')
  }
}

/**
 * The embedded store on node:sqlite (no native build). node:sqlite is synchronous; each method
 * does a few microseconds of work, in WAL mode with synchronous=NORMAL, which survives a process
 * crash (kill -9) without losing a committed transaction.
 */
export class SqliteStore implements Store {
  readonly kind = 'sqlite' as const
  readonly #db: DatabaseSync
  readonly #statements = new Map<string, StatementSync>()
  #closed = false
  /** Writes waiting for the next group commit. */
  #pending: PendingWrite[] = []
  #flushScheduled = false
  /**
   * The newest seq of each session this process has appended to. This process is the store's
   * only writer, so the sessions row need not be read per event; it is written once per
   * session per commit (#flush).
   */
  readonly #lastSeq = new Map<string, number>()
  readonly #seqToStore = new Map<string, number>()

  constructor(path: string) {
    if (path !== ':memory:') mkdirSync(dirname(path), { recursive: true })
    this.#db = new DatabaseSync(path, { enableForeignKeyConstraints: true })
    this.#db.exec('PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000;')
  }

  #stmt(sql: string): StatementSync {
    if (this.#closed) throw new StoreClosedError()
    let statement = this.#statements.get(sql)
    if (!statement) {
      statement = this.#db.prepare(sql)
      this.#statements.set(sql, statement)
    }
    return statement
  }

  #transaction<T>(work: () => T): T {
    if (this.#closed) throw new StoreClosedError()
    this.#db.exec('BEGIN IMMEDIATE')
    try {
      const result = work()
      this.#db.exec('COMMIT')
      return result
    } catch (err) {
      this.#db.exec('ROLLBACK')
      throw err
    }
  }

  /**
   * Queues a write. Every write queued in one turn of the event loop is committed in one
   * transaction (group commit): a commit costs far more than a statement, and a busy service
   * queues dozens of writes per turn. Each write runs in its own savepoint, so one that fails
   * is rolled back alone; its promise resolves only once the transaction has committed.
   * Writes take their parameters when they are queued, never later.
   */
  #write<T>(work: () => T, options: { atomic?: boolean } = {}): Promise<T> {
    if (this.#closed) return Promise.reject(new StoreClosedError())
    return new Promise<T>((resolve, reject) => {
      this.#pending.push({ work, atomic: options.atomic ?? false, resolve: resolve as (value: unknown) => void, reject })
      if (!this.#flushScheduled) {
        this.#flushScheduled = true
        setImmediate(() => this.#flush())
      }
    })
  }

  #flush(): void {
    this.#flushScheduled = false
    const batch = this.#pending
    this.#pending = []
    if (batch.length === 0) return
    if (this.#closed) {
      for (const write of batch) write.reject(new StoreClosedError())
      return
    }
    const outcomes: Array<{ ok: true; value: unknown } | { ok: false; error: unknown }> = []
    try {
      this.#stmt('BEGIN IMMEDIATE').run()
      for (const write of batch) {
        // A single statement that fails is undone by SQLite alone; several need a savepoint.
        if (write.atomic) this.#stmt('SAVEPOINT write').run()
        try {
          outcomes.push({ ok: true, value: write.work() })
          if (write.atomic) this.#stmt('RELEASE write').run()
        } catch (error) {
          if (write.atomic) {
            this.#stmt('ROLLBACK TO write').run()
            this.#stmt('RELEASE write').run()
          }
          outcomes.push({ ok: false, error })
        }
      }
      const setSeq = this.#stmt('UPDATE sessions SET last_seq = ? WHERE id = ?')
      for (const [sessionId, seq] of this.#seqToStore) setSeq.run(seq, sessionId)
      this.#seqToStore.clear()
      this.#stmt('COMMIT').run()
      // Bounded: past this many sessions the cache starts over (each reloads on its next event).
      if (this.#lastSeq.size > 10_000) this.#lastSeq.clear()
    } catch (err) {
      // BEGIN or COMMIT failed (disk full, I/O error): nothing of the batch was committed.
      if (this.#db.isTransaction) this.#db.exec('ROLLBACK')
      this.#lastSeq.clear()
      this.#seqToStore.clear()
      for (const write of batch) write.reject(err)
      return
    }
    batch.forEach((write, i) => {
      const outcome = outcomes[i]
      if (outcome?.ok) write.resolve(outcome.value)
      else write.reject(outcome?.error)
    })
  }

  /** A one-statement write; its parameters are taken now, so a caller may change its objects right after. */
  #run(sql: string, params: Param[]): Promise<void> {
    return this.#write(() => {
      this.#stmt(sql).run(...params)
    })
  }

  async migrate(): Promise<void> {
    this.#db.exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
      version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)`)
    const applied = new Set(
      (this.#db.prepare('SELECT version FROM schema_migrations').all() as Row[]).map((row) => Number(row.version))
    )
    for (const migration of sqliteMigrations) {
      if (applied.has(migration.version)) continue
      this.#transaction(() => {
        this.#db.exec(migration.sql)
        this.#db
          .prepare('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)')
          .run(migration.version, migration.name, new Date().toISOString())
      })
    }
  }

  async ping(): Promise<void> {
    this.#stmt('SELECT 1').get()
  }

  async close(): Promise<void> {
    if (this.#closed) return
    this.#flush()
    this.#closed = true
    this.#statements.clear()
    this.#db.close()
  }

  async createSession(s: SessionRecord): Promise<void> {
    return this.#run(INSERT_SESSION, sessionParams(s))
  }

  async getSession(tenant: string, id: string): Promise<SessionRecord | null> {
    const row = this.#stmt('SELECT * FROM sessions WHERE id = ? AND tenant = ?').get(id, tenant) as Row | undefined
    return row ? toSession(row) : null
  }

  async getSessionById(id: string): Promise<SessionRecord | null> {
    const row = this.#stmt('SELECT * FROM sessions WHERE id = ?').get(id) as Row | undefined
    return row ? toSession(row) : null
  }

  async listSessions(tenant: string, options: { limit: number; before?: string }): Promise<SessionRecord[]> {
    const rows = options.before
      ? this.#stmt('SELECT * FROM sessions WHERE tenant = ? AND id < ? ORDER BY id DESC LIMIT ?').all(tenant, options.before, options.limit)
      : this.#stmt('SELECT * FROM sessions WHERE tenant = ? ORDER BY id DESC LIMIT ?').all(tenant, options.limit)
    return (rows as Row[]).map(toSession)
  }

  async countSessions(tenant: string): Promise<number> {
    const row = this.#stmt('SELECT sessions FROM tenant_stats WHERE tenant = ?').get(tenant) as Row | undefined
    return row ? Number(row.sessions) : 0
  }

  async updateSession(id: string, patch: SessionPatch): Promise<void> {
    const sets: string[] = []
    const values: Param[] = []
    if (patch.status !== undefined) { sets.push('status = ?'); values.push(patch.status) }
    sets.push('updated_at = ?')
    values.push(patch.updatedAt ?? new Date().toISOString())
    return this.#run(`UPDATE sessions SET ${sets.join(', ')} WHERE id = ?`, [...values, id])
  }

  async addSessionUsage(id: string, usage: Usage): Promise<void> {
    return this.#write(() => {
      this.#stmt(`UPDATE sessions SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?,
        total_tokens = total_tokens + ? WHERE id = ?`).run(usage.inputTokens, usage.outputTokens, usage.totalTokens, id)
    })
  }

  async deleteSession(tenant: string, id: string): Promise<boolean> {
    return this.#write(() => {
      const result = this.#stmt('DELETE FROM sessions WHERE id = ? AND tenant = ?').run(id, tenant)
      if (Number(result.changes) === 0) return false
      this.#lastSeq.delete(id)
      this.#seqToStore.delete(id)
      return true
    })
  }

  /** The session's newest seq, including this batch's uncommitted events; undefined when there is no such session. */
  #currentSeq(sessionId: string): number | undefined {
    const cached = this.#lastSeq.get(sessionId)
    if (cached !== undefined) return cached
    const row = this.#stmt('SELECT last_seq FROM sessions WHERE id = ?').get(sessionId) as Row | undefined
    return row ? Number(row.last_seq) : undefined
  }

  async appendEvent(event: NewEvent): Promise<EventRecord> {
    const data = JSON.stringify(event.data)
    return this.#write(() => {
      const last = this.#currentSeq(event.sessionId)
      if (last === undefined) throw new Error(`session ${event.sessionId} does not exist`)
      const seq = last + 1
      this.#stmt(`INSERT INTO events (session_id, seq, run_id, channel, type, at, request_id, data)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?)`).run(
        event.sessionId, seq, event.runId, event.channel, event.type, event.at, event.requestId, data
      )
      this.#lastSeq.set(event.sessionId, seq)
      this.#seqToStore.set(event.sessionId, seq)
      return { ...event, seq }
    })
  }

  async listEvents(sessionId: string, query: EventQuery): Promise<EventRecord[]> {
    const where = ['session_id = ?', 'seq > ?']
    const values: Array<string | number> = [sessionId, query.after]
    if (query.untilSeq !== undefined) { where.push('seq <= ?'); values.push(query.untilSeq) }
    if (query.channels?.length) {
      where.push(`channel IN (${query.channels.map(() => '?').join(', ')})`)
      values.push(...query.channels)
    }
    if (query.types?.length) {
      where.push(`type IN (${query.types.map(() => '?').join(', ')})`)
      values.push(...query.types)
    }
    values.push(query.limit ?? -1)
    const rows = this.#stmt(`SELECT * FROM events WHERE ${where.join(' AND ')} ORDER BY seq LIMIT ?`).all(...values) as Row[]
    return rows.map(toEvent)
  }

  async addMessage(m: MessageRecord): Promise<void> {
    const toolCalls = json(m.toolCalls)
    return this.#write(() => {
      // at_seq: the session's newest event when the message was stored, which places it for fork.
      const atSeq = this.#currentSeq(m.sessionId) ?? 0
      this.#stmt(INSERT_MESSAGE).run(
        m.id, m.sessionId, m.runId, m.role, m.content, toolCalls, m.toolCallId ?? null, atSeq, m.createdAt, m.replacesMessages ?? null
      )
    })
  }

  async listMessages(sessionId: string): Promise<MessageRecord[]> {
    const rows = this.#stmt('SELECT * FROM messages WHERE session_id = ? ORDER BY pos').all(sessionId) as Row[]
    return rows.map(toMessage)
  }

  async forkSession(sourceId: string, target: SessionRecord, atSeq: number, newMessageId: () => string): Promise<void> {
    return this.#write(() => {
      this.#stmt(INSERT_SESSION).run(...sessionParams(target))
      this.#stmt(`INSERT INTO events (session_id, seq, run_id, channel, type, at, request_id, data)
        SELECT ?, seq, run_id, channel, type, at, request_id, data FROM events WHERE session_id = ? AND seq <= ?`)
        .run(target.id, sourceId, atSeq)
      const messages = this.#stmt('SELECT * FROM messages WHERE session_id = ? AND at_seq <= ? ORDER BY pos')
        .all(sourceId, atSeq) as Row[]
      const insert = this.#stmt(INSERT_MESSAGE)
      for (const row of messages) {
        insert.run(newMessageId(), target.id, row.run_id as string | null, row.role as string, row.content as string | null,
          row.tool_calls as string | null, row.tool_call_id as string | null, Number(row.at_seq), row.created_at as string,
          row.replaces_messages as number | null)
      }
    }, { atomic: true })
  }

  async createRun(r: RunRecord): Promise<void> {
    return this.#run(`INSERT INTO runs (id, session_id, status, request_id, steps, usage, error, message_id, input, created_at,
        started_at, ended_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, [
      r.id, r.sessionId, r.status, r.requestId, r.steps, json(r.usage), json(r.error), r.messageId, r.input, r.createdAt,
      r.startedAt, r.endedAt
    ])
  }

  async getRun(sessionId: string, runId: string): Promise<RunRecord | null> {
    const row = this.#stmt('SELECT * FROM runs WHERE id = ? AND session_id = ?').get(runId, sessionId) as Row | undefined
    return row ? toRun(row) : null
  }

  async updateRun(id: string, patch: RunPatch): Promise<void> {
    const columns: Record<keyof RunPatch, string> = {
      status: 'status', steps: 'steps', usage: 'usage', error: 'error', startedAt: 'started_at', endedAt: 'ended_at'
    }
    const sets: string[] = []
    const values: Param[] = []
    for (const [key, column] of Object.entries(columns) as Array<[keyof RunPatch, string]>) {
      if (!(key in patch)) continue
      const value = patch[key]
      sets.push(`${column} = ?`)
      values.push(key === 'usage' || key === 'error' ? json(value) : (value as Param))
    }
    if (sets.length === 0) return
    return this.#run(`UPDATE runs SET ${sets.join(', ')} WHERE id = ?`, [...values, id])
  }

  async listUnfinishedRuns(): Promise<RunRecord[]> {
    const rows = this.#stmt(
      `SELECT * FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled') ORDER BY id`
    ).all() as Row[]
    return rows.map(toRun)
  }

  async saveToolCall(c: ToolCallRecord): Promise<void> {
    return this.#run(`INSERT INTO tool_calls (id, session_id, run_id, step, name, input, state, started_at, ended_at,
        duration_ms, result, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
      ON CONFLICT (session_id, id) DO UPDATE SET state = excluded.state, ended_at = excluded.ended_at,
        duration_ms = excluded.duration_ms, result = excluded.result, error = excluded.error`, [
      c.id, c.sessionId, c.runId, c.step, c.name, json(c.input), c.state, c.startedAt, c.endedAt, c.durationMs,
      json(c.result), json(c.error)
    ])
  }

  async getToolCall(sessionId: string, callId: string): Promise<ToolCallRecord | null> {
    const row = this.#stmt('SELECT * FROM tool_calls WHERE session_id = ? AND id = ?').get(sessionId, callId) as Row | undefined
    return row ? toToolCall(row) : null
  }

  async listToolCalls(runId: string): Promise<ToolCallRecord[]> {
    const rows = this.#stmt('SELECT * FROM tool_calls WHERE run_id = ? ORDER BY started_at, id').all(runId) as Row[]
    return rows.map(toToolCall)
  }

  async claimIdempotency(claim: IdempotencyClaim): Promise<IdempotencyOutcome> {
    return this.#write((): IdempotencyOutcome => {
      const inserted = this.#stmt(`INSERT INTO idempotency (tenant, key, fingerprint, state, created_at)
        VALUES (?, ?, ?, 'in_progress', ?) ON CONFLICT (tenant, key) DO NOTHING`)
        .run(claim.tenant, claim.key, claim.fingerprint, claim.createdAt)
      if (Number(inserted.changes) > 0) return { state: 'claimed' }
      const row = this.#stmt('SELECT * FROM idempotency WHERE tenant = ? AND key = ?').get(claim.tenant, claim.key) as Row
      if (row.fingerprint !== claim.fingerprint) return { state: 'mismatch' }
      if (row.state === 'in_progress') return { state: 'in_progress' }
      return { state: 'completed', status: Number(row.status), body: parse(row.body) }
    })
  }

  async completeIdempotency(tenant: string, key: string, response: { status: number; body: unknown }): Promise<void> {
    return this.#run(`UPDATE idempotency SET state = 'completed', status = ?, body = ? WHERE tenant = ? AND key = ?`,
      [response.status, json(response.body), tenant, key])
  }

  async releaseIdempotency(tenant: string, key: string): Promise<void> {
    return this.#write(() => {
      this.#stmt('DELETE FROM idempotency WHERE tenant = ? AND key = ?').run(tenant, key)
    })
  }

  async purgeIdempotency(olderThan: Date): Promise<number> {
    return this.#write(() => {
      return Number(this.#stmt('DELETE FROM idempotency WHERE created_at < ?').run(olderThan.toISOString()).changes)
    })
  }
}

const INSERT_SESSION = `INSERT INTO sessions (id, tenant, created_at, updated_at, status, model, instructions, tools,
    approval, limits, metadata, last_seq, input_tokens, output_tokens, total_tokens, forked_from)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

const INSERT_MESSAGE = `INSERT INTO messages (id, session_id, run_id, role, content, tool_calls, tool_call_id, at_seq, created_at,
    replaces_messages)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

/** A session as the parameters of INSERT_SESSION. */
function sessionParams(s: SessionRecord): Param[] {
  return [
    s.id, s.tenant, s.createdAt, s.updatedAt, s.status, s.model, s.instructions, json(s.tools),
    json(s.approval), json(s.limits), json(s.metadata), s.lastSeq, s.usage.inputTokens, s.usage.outputTokens,
    s.usage.totalTokens, json(s.forkedFrom)
  ]
}

function toSession(row: Row): SessionRecord {
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

function toEvent(row: Row): EventRecord {
  return {
    seq: Number(row.seq),
    sessionId: String(row.session_id),
    runId: (row.run_id as string | null) ?? null,
    channel: row.channel as EventRecord['channel'],
    type: String(row.type),
    at: String(row.at),
    requestId: (row.request_id as string | null) ?? null,
    data: parse(row.data)
  }
}

function toMessage(row: Row): MessageRecord {
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

function toRun(row: Row): RunRecord {
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
    endedAt: (row.ended_at as string | null) ?? null
  }
}

function toToolCall(row: Row): ToolCallRecord {
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
