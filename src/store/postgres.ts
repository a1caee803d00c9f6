import pg from 'pg'
import { postgresMigrations } from './postgres-migrations.ts'
import { PgTextClient, toPgText } from './postgres-text.ts'
import { unansweredCalls } from './history.ts'
import { insertRun, json, MOST_TOKENS, parse, sessionParams, toEvent, toMessage, toRun, toSession, toToolCall, type Row } from './rows.ts'
import { StoreClosedError } from './sqlite.ts'
import { SessionGoneError, storeUnavailable, TenantFullError, withDataJson } from './store.ts'
import type {
  AuditedToolCall, EventQuery, EventRecord, ForkSealing, IdempotencyClaim, IdempotencyOutcome, MessageRecord, RunPatch, RunRecord,
  SessionRecord, Store, StoreWrite, ToolCallRecord
} from './store.ts'

type Param = string | number | boolean | null


/** A unit of work waiting for the next group commit. */
interface PendingUnit {
  /** The session it writes to: units are applied in session order, so two batches never lock rows in opposite orders. */
  sessionId: string
  unit: PreparedUnit
  resolve(events: EventRecord[]): void
  reject(reason: unknown): void
}

/** A group-commit lane: units waiting for its next batch, and the batch in flight. */
interface Lane {
  pending: PendingUnit[]
  flushing: Promise<void> | null
}

/**
 * Batches in flight at once per process. A commit waits for its WAL flush; with one batch in
 * flight a run's every unit waits for the batch before it too. Lanes commit side by side (their
 * flushes coalesce in PostgreSQL), and a session's units all go to one lane, so their order holds.
 */
const COMMIT_LANES = 4

/** The lane of a session: a stable hash of its id. */
function laneOf(sessionId: string, lanes: number): number {
  let hash = 0
  for (let i = 0; i < sessionId.length; i++) hash = (hash * 31 + sessionId.charCodeAt(i)) | 0
  return Math.abs(hash) % lanes
}

/** Thrown when DATABASE_URL names a database that cannot be reached or used; server.ts prints it as one line. */
export class StoreUnreachableError extends Error {
  readonly code = 'STORE_UNREACHABLE'
  constructor(where: string, cause: unknown) {
    const reason = cause instanceof Error ? cause.message || (cause as { code?: string }).code || cause.name : String(cause)
    super(`cannot use the PostgreSQL database ${where}: ${reason}`, { cause })
  }
}

export interface PostgresStoreOptions {
  connectionString: string
  /** Most connections this process opens (pg's pool size). */
  maxConnections?: number
  /** Server options, e.g. `-c search_path=…` (tests give each run its own schema). */
  options?: string
  /** Batches committed at once, each on its own connection (default COMMIT_LANES). */
  commitLanes?: number
  /** Called when an idle pooled connection fails (the database restarted); the pool replaces it. */
  onIdleError?(err: Error): void
  /**
   * How long one statement (or transaction step) may wait for its answer before it fails, and
   * its connection with it (default 30 s). Without it a database that stops answering without
   * closing its sockets (a network partition, a hung server) would hold every request and run
   * that touches it forever. Migrations, which may wait on another process's, have none.
   */
  queryTimeoutMs?: number
}

/** Readiness asks the database for `SELECT 1` and gives it this long at most (a probe has seconds). */
const PING_TIMEOUT_MS = 3000

/**
 * The scale-out store on PostgreSQL (`pg`). Several agentd processes share it, so nothing is
 * cached in memory: each event's seq is allocated inside the transaction that stores it, under
 * the session row's lock (`UPDATE sessions SET last_seq = last_seq + n … RETURNING`), which keeps
 * one gap-free sequence per session whatever process writes.
 *
 * Units of work queued in one turn of the event loop are committed in one transaction (group
 * commit): a commit costs a WAL flush and a round trip, and a busy run writes a unit per text
 * chunk. Sessions are spread over a few lanes that commit side by side; within a lane one batch
 * is in flight at a time, so a session's units commit in the order they were handed over. If a unit of a batch fails, the batch is rolled back and its units are committed
 * one by one, so only the failing one is refused.
 */
export class PostgresStore implements Store {
  readonly kind = 'postgres' as const
  readonly pool: pg.Pool
  readonly #where: string
  readonly #clientConfig: pg.ClientConfig
  readonly #queryTimeoutMs: number
  #closed = false
  /** Group-commit lanes: a session's units always go to the same lane, which commits one batch at a time. */
  readonly #lanes: Lane[]

  constructor(options: PostgresStoreOptions) {
    this.#where = describeUrl(options.connectionString)
    this.#clientConfig = {
      connectionString: options.connectionString,
      // How its connections show in pg_stat_activity (an application_name in the URL wins).
      application_name: 'agentd',
      connectionTimeoutMillis: 5000,
      // A peer that vanished (a lost machine, a cut network) is noticed by the kernel's probes.
      keepAlive: true,
      keepAliveInitialDelayMillis: 10_000,
      ...(options.options ? { options: options.options } : {})
    }
    this.#queryTimeoutMs = options.queryTimeoutMs ?? 30_000
    try {
      this.pool = new pg.Pool({ ...this.#clientConfig, query_timeout: this.#queryTimeoutMs, max: options.maxConnections ?? 16, Client: PgTextClient })
    } catch (err) {
      throw new StoreUnreachableError(this.#where, err)
    }
    this.pool.on('error', (err) => options.onIdleError?.(err))
    // A connection checked out of the pool has no listener of the pool's: should the server end it
    // between two statements (an administrator's pg_terminate_backend, a restart), pg would emit
    // an 'error' nobody hears, and the process would exit. The next statement on it fails instead,
    // which its caller handles, and the pool drops it when it comes back (it is not queryable).
    this.pool.on('connect', (client) => client.on('error', () => undefined))
    this.#lanes = Array.from({ length: options.commitLanes ?? COMMIT_LANES }, () => ({ pending: [], flushing: null }))
  }

  /** Where the store points (host, port and database; never the password), for messages. */
  get where(): string {
    return this.#where
  }

  /** A connection of its own, outside the pool, with the pool's settings (LISTEN needs one). */
  newClient(): pg.Client {
    return new PgTextClient({ ...this.#clientConfig, query_timeout: this.#queryTimeoutMs })
  }

  async migrate(): Promise<void> {
    // A connection of its own, without the statement timeout: it may wait for another process's migrations.
    const client = new PgTextClient(this.#clientConfig)
    client.on('error', () => undefined)
    try {
      await client.connect()
    } catch (err) {
      await client.end().catch(() => undefined)
      throw new StoreUnreachableError(this.#where, err)
    }
    try {
      // One process migrates a schema at a time; the others wait here, then find nothing to do.
      await client.query(`SELECT pg_advisory_lock(hashtext('agentd-migrations:' || current_schema()))`)
      try {
        await client.query(`CREATE TABLE IF NOT EXISTS schema_migrations (
          version integer PRIMARY KEY, name text NOT NULL, applied_at text NOT NULL)`)
        const applied = new Set((await client.query('SELECT version FROM schema_migrations')).rows.map((row: Row) => Number(row.version)))
        for (const migration of postgresMigrations) {
          if (applied.has(migration.version)) continue
          await client.query('BEGIN')
          try {
            await client.query(migration.sql)
            await client.query('INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)',
              [migration.version, migration.name, new Date().toISOString()])
            await client.query('COMMIT')
          } catch (err) {
            await client.query('ROLLBACK')
            throw err
          }
        }
      } finally {
        await client.query(`SELECT pg_advisory_unlock(hashtext('agentd-migrations:' || current_schema()))`)
      }
    } finally {
      await client.end().catch(() => undefined)
    }
  }

  async ping(): Promise<void> {
    if (this.#closed) throw new StoreClosedError()
    await selectOne(this.pool, Math.min(PING_TIMEOUT_MS, this.#queryTimeoutMs))
  }

  async close(): Promise<void> {
    if (this.#closed) return
    this.#closed = true
    // Units already handed over are committed before the pool goes.
    for (const lane of this.#lanes) while (lane.flushing) await lane.flushing
    await this.pool.end()
  }

  #query(sql: string, params: Param[] = []): Promise<pg.QueryResult<Row>> {
    if (this.#closed) return Promise.reject(new StoreClosedError())
    return this.pool.query<Row>(sql, params)
  }

  /** Runs work in one transaction on one connection. */
  async transaction<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    if (this.#closed) throw new StoreClosedError()
    const client = await this.pool.connect()
    let broken: Error | undefined
    try {
      await client.query('BEGIN')
      try {
        const result = await work(client)
        await client.query('COMMIT')
        return result
      } catch (err) {
        broken = await rollBack(client, err)
        throw err
      }
    } finally {
      client.release(broken)
    }
  }

  commit(writes: readonly StoreWrite[]): Promise<EventRecord[]> {
    if (this.#closed) return Promise.reject(new StoreClosedError())
    // Values are taken now (JSON included), so the caller may change its objects right after.
    const unit = prepareUnit(writes)
    const sessionId = sessionOf(writes)
    const lane = this.#lanes[laneOf(sessionId, this.#lanes.length)] as Lane
    return new Promise((resolve, reject) => {
      lane.pending.push({ sessionId, unit, resolve, reject })
      if (!lane.flushing) lane.flushing = new Promise((done) => setImmediate(done)).then(() => this.#flushLane(lane))
    })
  }

  async #flushLane(lane: Lane): Promise<void> {
    try {
      while (lane.pending.length > 0) {
        const batch = lane.pending
        lane.pending = []
        // Stable: a session's units keep their order; sessions are locked in id order.
        batch.sort((a, b) => (a.sessionId < b.sessionId ? -1 : a.sessionId > b.sessionId ? 1 : 0))
        await this.#commitBatch(batch)
      }
    } finally {
      lane.flushing = null
    }
  }

  async #commitBatch(batch: PendingUnit[]): Promise<void> {
    let client: pg.PoolClient
    try {
      client = await this.pool.connect()
    } catch (err) {
      for (const unit of batch) unit.reject(err)
      return
    }
    let broken: Error | undefined
    try {
      const together = await runUnits(client, batch)
      if (together.ok) {
        batch.forEach((unit, i) => settle(unit, together.value[i]))
        return
      }
      if (together.broken) throw together.error
      if (batch.length === 1) {
        batch[0]?.reject(sessionGoneOr(together.error))
        return
      }
      // One unit failed the batch: commit each alone, so only the failing one is refused.
      for (const unit of batch) {
        const alone = await runUnits(client, [unit])
        if (alone.ok) settle(unit, alone.value[0])
        else if (alone.broken) throw alone.error
        else unit.reject(sessionGoneOr(alone.error))
      }
    } catch (err) {
      // The connection itself failed: whatever is not settled yet was not committed.
      broken = err as Error
      for (const unit of batch) unit.reject(err)
    } finally {
      client.release(broken)
    }
  }

  async createSession(s: SessionRecord, maxSessions?: number): Promise<void> {
    if (maxSessions === undefined) {
      await this.#query(INSERT_SESSION, sessionParams(s))
      return
    }
    const { rowCount } = await this.#query(INSERT_SESSION_WITH_ROOM, [...sessionParams(s), maxSessions])
    if (rowCount === 0) throw new TenantFullError(maxSessions)
  }

  async getSession(tenant: string, id: string): Promise<SessionRecord | null> {
    const { rows } = await this.#query('SELECT * FROM sessions WHERE id = $1 AND tenant = $2', [id, tenant])
    return rows[0] ? toSession(rows[0]) : null
  }

  async getSessionById(id: string): Promise<SessionRecord | null> {
    const { rows } = await this.#query('SELECT * FROM sessions WHERE id = $1', [id])
    return rows[0] ? toSession(rows[0]) : null
  }

  async hasSession(id: string): Promise<boolean> {
    const { rows } = await this.#query('SELECT 1 FROM sessions WHERE id = $1', [id])
    return rows.length > 0
  }

  async listSessions(tenant: string, options: { limit: number; before?: string }): Promise<SessionRecord[]> {
    const { rows } = options.before
      ? await this.#query('SELECT * FROM sessions WHERE tenant = $1 AND id < $2 ORDER BY id DESC LIMIT $3', [tenant, options.before, options.limit])
      : await this.#query('SELECT * FROM sessions WHERE tenant = $1 ORDER BY id DESC LIMIT $2', [tenant, options.limit])
    return rows.map(toSession)
  }

  async countSessions(tenant: string): Promise<number> {
    const { rows } = await this.#query('SELECT sessions FROM tenant_stats WHERE tenant = $1', [tenant])
    return rows[0] ? Number(rows[0].sessions) : 0
  }

  async deleteSession(tenant: string, id: string): Promise<boolean> {
    const result = await this.#query('DELETE FROM sessions WHERE id = $1 AND tenant = $2', [id, tenant])
    return (result.rowCount ?? 0) > 0
  }

  async listEvents(sessionId: string, query: EventQuery): Promise<EventRecord[]> {
    const where = ['session_id = $1', 'seq > $2']
    const values: Param[] = [sessionId, query.after]
    const next = (value: Param) => `$${values.push(value)}`
    if (query.untilSeq !== undefined) where.push(`seq <= ${next(query.untilSeq)}`)
    if (query.channels?.length) where.push(`channel IN (${query.channels.map((c) => next(c)).join(', ')})`)
    if (query.types?.length) where.push(`type IN (${query.types.map((type) => next(type)).join(', ')})`)
    // LIMIT NULL is no limit.
    const limit = next(query.limit ?? null)
    const { rows } = await this.#query(`SELECT * FROM events WHERE ${where.join(' AND ')} ORDER BY seq LIMIT ${limit}`, values)
    return rows.map(toEvent)
  }

  async listMessages(sessionId: string): Promise<MessageRecord[]> {
    const { rows } = await this.#query('SELECT * FROM messages WHERE session_id = $1 ORDER BY pos', [sessionId])
    return rows.map(toMessage)
  }

  async listContextMessages(sessionId: string): Promise<{ messages: MessageRecord[]; offset: number }> {
    const { rows: [summary] } = await this.#query(
      `SELECT replaces_messages FROM messages WHERE session_id = $1 AND role = 'summary' ORDER BY pos DESC LIMIT 1`, [sessionId])
    const offset = Number(summary?.replaces_messages ?? 0)
    const { rows } = await this.#query('SELECT * FROM messages WHERE session_id = $1 ORDER BY pos OFFSET $2', [sessionId, offset])
    return { messages: rows.map(toMessage), offset }
  }

  async pageMessages(sessionId: string, options: { limit: number; after?: string }): Promise<MessageRecord[] | null> {
    let pos = '0'
    if (options.after !== undefined) {
      const { rows } = await this.#query('SELECT pos FROM messages WHERE id = $1 AND session_id = $2', [options.after, sessionId])
      if (!rows[0]) return null
      pos = String(rows[0].pos)
    }
    const { rows } = await this.#query('SELECT * FROM messages WHERE session_id = $1 AND pos > $2 ORDER BY pos LIMIT $3', [sessionId, pos, options.limit])
    return rows.map(toMessage)
  }

  async forkSession(sourceId: string, target: SessionRecord, atSeq: number, seal: ForkSealing, maxSessions?: number): Promise<SessionRecord> {
    return this.transaction(async (client) => {
      // The source stays while it is copied: a deletion waits for the fork, or came first. FOR KEY
      // SHARE holds off only a deletion: the source's own run goes on updating its row meanwhile.
      const source = await client.query('SELECT 1 FROM sessions WHERE id = $1 FOR KEY SHARE', [sourceId])
      if (source.rowCount === 0) throw new SessionGoneError(sourceId)
      if (maxSessions !== undefined) {
        // The tenant's count, locked until the fork commits: another creation waits to count it.
        const counted = await client.query<Row>(LOCK_TENANT_COUNT, [target.tenant])
        if (Number(counted.rows[0]?.sessions) >= maxSessions) throw new TenantFullError(maxSessions)
      }
      // The first event of each run whose `done` is not at or before atSeq, in one pass over the
      // events: a NOT EXISTS looking for each event's `done` grew with the square of the session
      // (50 000 events in 1 000 runs: 1.6 s inside this transaction).
      const point = await client.query<Row>(`SELECT min(first) AS first FROM (
          SELECT min(seq) AS first, bool_or(type = 'done') AS ended FROM events
          WHERE session_id = $1 AND seq <= $2 AND run_id IS NOT NULL GROUP BY run_id
        ) runs WHERE NOT ended`,
      [sourceId, atSeq])
      const first = point.rows[0]?.first
      const at = first === null || first === undefined ? atSeq : Number(first) - 1
      const fork: SessionRecord = { ...target, lastSeq: at, forkedFrom: { sessionId: sourceId, atSeq: at } }
      await client.query(INSERT_SESSION, sessionParams(fork))
      await client.query(`INSERT INTO events (session_id, seq, run_id, channel, type, at, request_id, data)
        SELECT $1, seq, run_id, channel, type, at, request_id, data FROM events WHERE session_id = $2 AND seq <= $3`, [fork.id, sourceId, at])
      const { rows } = await client.query<Row>('SELECT * FROM messages WHERE session_id = $1 AND at_seq <= $2 ORDER BY pos', [sourceId, at])
      const copied = rows.map((row) => ({ ...toMessage(row), id: seal.newMessageId(), sessionId: fork.id, atSeq: Number(row.at_seq) }))
      const runOfCall = new Map(copied.flatMap((m) => (m.toolCalls ?? []).map((call) => [call.id, m.runId] as const)))
      const sealed = unansweredCalls(copied).map((call): StoredMessage => ({
        id: seal.newMessageId(), sessionId: fork.id, runId: runOfCall.get(call.id) ?? null, role: 'tool', content: seal.sealedAnswer(call.name),
        toolCallId: call.id, atSeq: at, createdAt: new Date().toISOString()
      }))
      // A round trip per FORK_MESSAGE_ROWS messages, not per message (20 000 messages: 4.6 s in this transaction).
      const all = [...copied, ...sealed]
      for (let i = 0; i < all.length; i += FORK_MESSAGE_ROWS) await client.query(INSERT_MESSAGES, messageColumns(all.slice(i, i + FORK_MESSAGE_ROWS)))
      return fork
    })
  }

  async getRun(sessionId: string, runId: string): Promise<RunRecord | null> {
    const { rows } = await this.#query('SELECT * FROM runs WHERE id = $1 AND session_id = $2', [runId, sessionId])
    return rows[0] ? toRun(rows[0]) : null
  }

  async listUnfinishedRuns(): Promise<RunRecord[]> {
    const { rows } = await this.#query(`SELECT * FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled') ORDER BY pos`)
    return rows.map(toRun)
  }

  async getToolCall(sessionId: string, callId: string): Promise<ToolCallRecord | null> {
    const { rows } = await this.#query('SELECT * FROM tool_calls WHERE session_id = $1 AND id = $2', [sessionId, callId])
    return rows[0] ? toToolCall(rows[0]) : null
  }

  async listToolCalls(runId: string): Promise<ToolCallRecord[]> {
    const { rows } = await this.#query('SELECT * FROM tool_calls WHERE run_id = $1 ORDER BY started_at, id', [runId])
    return rows.map(toToolCall)
  }

  async listSessionToolCalls(sessionId: string, options: { limit: number; after?: string }): Promise<AuditedToolCall[]> {
    // Call IDs are time-ordered (and compared byte by byte), so ID order is the order the model made the calls.
    const { rows } = await this.#query(`SELECT c.*, r.request_id FROM tool_calls c LEFT JOIN runs r ON r.id = c.run_id
      WHERE c.session_id = $1 AND c.id > $2 ORDER BY c.id LIMIT $3`, [sessionId, options.after ?? '', options.limit])
    return rows.map((row) => ({ ...toToolCall(row), requestId: (row.request_id as string | null) ?? null }))
  }

  async claimIdempotency(claim: IdempotencyClaim): Promise<IdempotencyOutcome> {
    // A claim in progress whose lease has passed was left by a holder that is gone: take it over.
    // When it has passed is the database's clock's to say (leaseFromNow), as for run leases.
    const inserted = await this.#query(`INSERT INTO idempotency (tenant, key, fingerprint, state, created_at, lease_until)
      VALUES ($1, $2, $3, 'in_progress', $4, ${leaseSql('$5')})
      ON CONFLICT (tenant, key) DO UPDATE SET fingerprint = excluded.fingerprint, created_at = excluded.created_at,
        lease_until = excluded.lease_until
      WHERE idempotency.state = 'in_progress' AND idempotency.lease_until::timestamptz < now()`,
    [claim.tenant, claim.key, claim.fingerprint, claim.createdAt, leaseFromNow(claim.leaseUntil)])
    if ((inserted.rowCount ?? 0) > 0) return { state: 'claimed' }
    const { rows } = await this.#query('SELECT * FROM idempotency WHERE tenant = $1 AND key = $2', [claim.tenant, claim.key])
    const row = rows[0]
    // Released between the two statements: the key is free again.
    if (!row) return this.claimIdempotency(claim)
    if (row.fingerprint !== claim.fingerprint) return { state: 'mismatch' }
    if (row.state === 'in_progress') return { state: 'in_progress' }
    return { state: 'completed', status: Number(row.status), body: parse(row.body) }
  }

  async renewIdempotency(tenant: string, key: string, leaseUntil: string): Promise<void> {
    await this.#query(`UPDATE idempotency SET lease_until = ${leaseSql('$1')} WHERE tenant = $2 AND key = $3 AND state = 'in_progress'`,
      [leaseFromNow(leaseUntil), tenant, key])
  }

  async completeIdempotency(tenant: string, key: string, response: { status: number; body: unknown }): Promise<void> {
    await this.#query(`UPDATE idempotency SET state = 'completed', status = $1, body = $2 WHERE tenant = $3 AND key = $4`,
      [response.status, json(response.body), tenant, key])
  }

  async releaseIdempotency(tenant: string, key: string): Promise<void> {
    await this.#query('DELETE FROM idempotency WHERE tenant = $1 AND key = $2', [tenant, key])
  }

  async purgeIdempotency(olderThan: Date): Promise<number> {
    const result = await this.#query('DELETE FROM idempotency WHERE created_at < $1', [olderThan.toISOString()])
    return result.rowCount ?? 0
  }
}

type Attempt<T> = { ok: true; value: T } | { ok: false; error: unknown; broken: boolean }

/**
 * Sends the units as one transaction in one string (BEGIN; …; COMMIT) and hands each its own
 * statements' results; a failure is rolled back and returned (broken: the connection itself failed).
 */
async function runUnits(client: pg.PoolClient, units: PendingUnit[]): Promise<Attempt<Array<pg.QueryResult<Row>[]>>> {
  const statements = units.flatMap((u) => u.unit.statements)
  try {
    const results = (await client.query<Row>(['BEGIN', ...statements, 'COMMIT'].join(';\n'))) as unknown as pg.QueryResult<Row>[]
    let at = 1
    return {
      ok: true,
      value: units.map((u) => {
        const own = results.slice(at, at + u.unit.statements.length)
        at += u.unit.statements.length
        return own
      })
    }
  } catch (error) {
    return { ok: false, error, broken: (await rollBack(client, error)) !== undefined }
  }
}

/**
 * Rolls back the transaction that `cause` failed; resolves with what broke the connection (for
 * the pool to drop it), or undefined when it rolled back and may be reused. A connection that
 * broke or timed out is not asked (a ROLLBACK would wait behind the statement that hangs):
 * dropping it rolls the transaction back on the server.
 */
async function rollBack(client: pg.PoolClient, cause: unknown): Promise<Error | undefined> {
  if (storeUnavailable(cause) === 'unreachable') return cause as Error
  try {
    await client.query('ROLLBACK')
    return undefined
  } catch (err) {
    return err as Error
  }
}

/**
 * Asks `SELECT 1` and gives the answer `timeoutMs` at most: whether a pool or a connection is
 * alive. pg reads query_timeout off a query's config too; its types know it only on the client's.
 */
export async function selectOne(on: pg.Pool | pg.ClientBase, timeoutMs: number): Promise<void> {
  const question: pg.QueryConfig & { query_timeout: number } = { text: 'SELECT 1', query_timeout: timeoutMs }
  await on.query(question)
}

/** Resolves a committed unit with its events, or rejects it when its session was gone. */
function settle(pending: PendingUnit, results: pg.QueryResult<Row>[] | undefined): void {
  try {
    pending.resolve(pending.unit.finish(results ?? []))
  } catch (err) {
    pending.reject(err)
  }
}

/** Every foreign key of the written tables points at the session: a violation means it was deleted meanwhile. */
function sessionGoneOr(err: unknown): unknown {
  return (err as { code?: string } | null)?.code === FOREIGN_KEY_VIOLATION ? new SessionGoneError() : err
}

/** The session a unit writes to (every write of a unit belongs to one session). */
function sessionOf(writes: readonly StoreWrite[]): string {
  for (const write of writes) {
    switch (write.type) {
      case 'event': return write.event.sessionId
      case 'message': return write.message.sessionId
      case 'newRun': return write.run.sessionId
      case 'usage': return write.sessionId
      case 'toolCall': return write.call.sessionId
      case 'session': return write.id
      case 'run': break
    }
  }
  return ''
}

/**
 * A unit of work as SQL text with its values inlined (escaped), so that a whole batch of units
 * travels to the server as one string, in one round trip, instead of a round trip per statement:
 * under load each round trip also waits for a turn of this process's event loop. `finish` reads
 * the seqs the unit reserved out of its statements' results.
 *
 * Each session the unit writes events or messages to is locked first (in id order) by the
 * statement that reserves its seqs (`UPDATE sessions SET last_seq = last_seq + n … RETURNING`);
 * the events and messages then take their seq from that row. For a session that is gone the
 * reservation finds no row, the inserts insert nothing, and the unit fails as SessionGoneError.
 */
interface PreparedUnit {
  statements: string[]
  finish(results: pg.QueryResult<Row>[]): EventRecord[]
}

function prepareUnit(writes: readonly StoreWrite[]): PreparedUnit {
  const reserve = new Map<string, number>()
  for (const write of writes) {
    if (write.type === 'event') reserve.set(write.event.sessionId, (reserve.get(write.event.sessionId) ?? 0) + 1)
    else if (write.type === 'message') reserve.set(write.message.sessionId, reserve.get(write.message.sessionId) ?? 0)
  }
  const sessions = [...reserve.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
  const statements = sessions.map(([sessionId, count]) =>
    `UPDATE sessions SET last_seq = last_seq + ${count} WHERE id = ${literal(sessionId)} RETURNING last_seq`)
  const events: Array<{ event: Omit<EventRecord, 'seq'>; n: number; data: string }> = []
  const placed = new Map<string, number>()
  const rows = new Map<string, string[]>()
  for (const write of writes) {
    const step = prepareWrite(write)
    if (step.kind === 'event') {
      const { sessionId } = step.event
      const n = (placed.get(sessionId) ?? 0) + 1
      placed.set(sessionId, n)
      events.push({ event: step.event, n, data: step.data })
      const e = step.event
      const list = rows.get(sessionId) ?? []
      list.push(`(${n}, ${[e.runId, e.channel, e.type, e.at, e.requestId, step.data].map(literal).join(', ')})`)
      rows.set(sessionId, list)
    } else if (step.kind === 'message') {
      // Placed after the events written before it in this unit.
      const count = reserve.get(step.sessionId) ?? 0
      const before = placed.get(step.sessionId) ?? 0
      const values = step.params(0).map((value, i) => (i === AT_SEQ ? `s.last_seq - ${count - before}` : literal(value)))
      statements.push(`INSERT INTO messages (id, session_id, run_id, role, content, tool_calls, tool_call_id, at_seq, created_at,
          replaces_messages)
        SELECT ${values.join(', ')} FROM sessions s WHERE s.id = ${literal(step.sessionId)}`)
    } else if (step.sql) {
      statements.push(inline(step.sql, step.params))
    }
  }
  for (const [sessionId, list] of rows) {
    const count = reserve.get(sessionId) ?? 0
    statements.push(`INSERT INTO events (session_id, seq, run_id, channel, type, at, request_id, data)
      SELECT s.id, s.last_seq - ${count} + v.n, v.run_id, v.channel, v.type, v.at, v.request_id, v.data
      FROM sessions s, (VALUES ${list.join(', ')}) AS v (n, run_id, channel, type, at, request_id, data)
      WHERE s.id = ${literal(sessionId)}`)
  }
  return {
    statements,
    finish(results) {
      const base = new Map<string, number>()
      sessions.forEach(([sessionId, count], i) => {
        const row = results[i]?.rows[0]
        if (!row) throw new SessionGoneError(sessionId)
        base.set(sessionId, Number(row.last_seq) - count)
      })
      return events.map(({ event, n, data }) => withDataJson({ ...event, seq: (base.get(event.sessionId) ?? 0) + n }, data))
    }
  }
}

/** Position of at_seq among INSERT_MESSAGE's parameters. */
const AT_SEQ = 7

/** A value as an SQL literal (strings as PgTextClient writes its parameters, escaped by pg's escapeLiteral). */
function literal(value: Param): string {
  if (value === null) return 'NULL'
  if (typeof value === 'number') return Number.isFinite(value) ? String(value) : 'NULL'
  if (typeof value === 'boolean') return value ? 'true' : 'false'
  return pg.escapeLiteral(toPgText(value))
}

/** A parameterised statement with its parameters written in as literals. */
function inline(sql: string, params: Param[]): string {
  return sql.replace(/\$(\d+)/g, (_, n: string) => literal(params[Number(n) - 1] ?? null))
}

/** PostgreSQL's SQLSTATE for a foreign key violation. */
const FOREIGN_KEY_VIOLATION = '23503'

type PreparedWrite =
  /** data: the event's JSON, taken when the unit was handed over. */
  | { kind: 'event'; event: Omit<EventRecord, 'seq'>; data: string }
  /** at_seq: the session's newest event when the message is stored, which places it for fork. */
  | { kind: 'message'; sessionId: string; params(atSeq: number): Param[] }
  | { kind: 'statement'; sql: string; params: Param[] }

function prepareWrite(write: StoreWrite): PreparedWrite {
  switch (write.type) {
    case 'event':
      return { kind: 'event', event: write.event, data: JSON.stringify(write.event.data) }
    case 'message': {
      const m = write.message
      const toolCalls = json(m.toolCalls)
      return {
        kind: 'message',
        sessionId: m.sessionId,
        params: (atSeq) => [m.id, m.sessionId, m.runId, m.role, m.content, toolCalls, m.toolCallId ?? null, atSeq, m.createdAt, m.replacesMessages ?? null]
      }
    }
    case 'newRun':
      return { kind: 'statement', ...insertRun(write.run, null) }
    case 'run':
      return { kind: 'statement', ...runUpdate(write.id, write.patch) }
    case 'session': {
      const { patch, id } = write
      const params: Param[] = [id, patch.updatedAt ?? new Date().toISOString()]
      const status = patch.status !== undefined ? `, status = $${params.push(patch.status)}` : ''
      return { kind: 'statement', sql: `UPDATE sessions SET updated_at = $2${status} WHERE id = $1`, params }
    }
    case 'usage': {
      const { usage, sessionId } = write
      return {
        kind: 'statement',
        sql: `UPDATE sessions SET input_tokens = LEAST(input_tokens + $2, ${MOST_TOKENS}), output_tokens = LEAST(output_tokens + $3, ${MOST_TOKENS}),
          total_tokens = LEAST(total_tokens + $4, ${MOST_TOKENS}) WHERE id = $1`,
        params: [sessionId, usage.inputTokens, usage.outputTokens, usage.totalTokens]
      }
    }
    case 'toolCall': {
      const c = write.call
      return {
        kind: 'statement',
        sql: `INSERT INTO tool_calls (id, session_id, run_id, step, name, input, state, started_at, ended_at, duration_ms, result, error)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
          ON CONFLICT (session_id, id) DO UPDATE SET input = excluded.input, state = excluded.state, ended_at = excluded.ended_at,
            duration_ms = excluded.duration_ms, result = excluded.result, error = excluded.error`,
        params: [c.id, c.sessionId, c.runId, c.step, c.name, json(c.input), c.state, c.startedAt, c.endedAt, c.durationMs, json(c.result), json(c.error)]
      }
    }
  }
}

const RUN_COLUMNS: Record<keyof RunPatch, string> = {
  status: 'status', steps: 'steps', usage: 'usage', error: 'error', startedAt: 'started_at', endedAt: 'ended_at'
}

/** The UPDATE for a run patch; sql is empty when the patch changes nothing. */
function runUpdate(id: string, patch: RunPatch): { sql: string; params: Param[] } {
  const sets: string[] = []
  const params: Param[] = [id]
  for (const [key, column] of Object.entries(RUN_COLUMNS) as Array<[keyof RunPatch, string]>) {
    if (!(key in patch)) continue
    const value = patch[key]
    sets.push(`${column} = $${params.push(key === 'usage' || key === 'error' ? json(value) : (value as Param))}`)
  }
  return sets.length === 0 ? { sql: '', params: [] } : { sql: `UPDATE runs SET ${sets.join(', ')} WHERE id = $1`, params }
}

/** host:port/database of a connection URL, without user or password; the URL itself when it does not parse. */
function describeUrl(url: string): string {
  try {
    const parsed = new URL(url)
    return `${parsed.hostname || 'localhost'}:${parsed.port || '5432'}${parsed.pathname || '/'}`
  } catch {
    return '(DATABASE_URL does not parse as a URL)'
  }
}

/** A session row's columns, in sessionParams' order. */
const SESSION_COLUMNS = `id, tenant, created_at, updated_at, status, model, instructions, tools,
    approval, limits, metadata, last_seq, input_tokens, output_tokens, total_tokens, forked_from`
const INSERT_SESSION = `INSERT INTO sessions (${SESSION_COLUMNS})
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`
/**
 * The tenant's session count, its row locked until the transaction ends (made at 0 for a tenant
 * without one): ON CONFLICT DO UPDATE waits for a creation in progress and reads its count as
 * committed, so two creations never both see room for one.
 */
const LOCK_TENANT_COUNT = `INSERT INTO tenant_stats (tenant, sessions) VALUES ($1, 0)
  ON CONFLICT (tenant) DO UPDATE SET sessions = tenant_stats.sessions RETURNING sessions`
/** INSERT_SESSION when the tenant holds fewer than $17 sessions, counted and locked in the same statement; inserts nothing otherwise. */
const INSERT_SESSION_WITH_ROOM = `WITH counted AS (${LOCK_TENANT_COUNT.replace('$1', '$2')})
  INSERT INTO sessions (${SESSION_COLUMNS})
  SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::integer, $13::bigint, $14::bigint, $15::bigint, $16
  FROM counted WHERE counted.sessions < $17::integer`

/**
 * SQL for an idempotency claim's lease as the database's clock has it: `ms` (a parameter) milliseconds from its now, as
 * ISO-8601 text (the column's form). Processes on several machines must agree on when a claim has
 * lapsed; judged by each one's own clock, one running ahead of the holder's by more than the
 * lease took over a live claim, and processed the request a second time.
 */
const leaseSql = (ms: string): string => `to_char((now() + ${ms} * interval '1 millisecond') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`

/** How far ahead of this process's now `until` is: a caller's lease, to be counted from the database's now. */
function leaseFromNow(until: string): number {
  return Math.max(0, Date.parse(until) - Date.now())
}

/** A message with the seq it was stored at (a fork copies it). */
type StoredMessage = MessageRecord & { atSeq: number }

/** Messages a fork inserts per statement (INSERT_MESSAGES). */
const FORK_MESSAGE_ROWS = 2000

/** Inserts messages given as one array per column (messageColumns), in the arrays' order, so their pos keeps it. */
const INSERT_MESSAGES = `INSERT INTO messages (id, session_id, run_id, role, content, tool_calls, tool_call_id, at_seq, created_at, replaces_messages)
  SELECT id, session_id, run_id, role, content, tool_calls, tool_call_id, at_seq, created_at, replaces_messages
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::integer[], $9::text[], $10::integer[])
    WITH ORDINALITY AS m (id, session_id, run_id, role, content, tool_calls, tool_call_id, at_seq, created_at, replaces_messages, n)
  ORDER BY n`

/** INSERT_MESSAGES' parameters: a column at a time. */
function messageColumns(messages: StoredMessage[]): unknown[][] {
  return [
    messages.map((m) => m.id), messages.map((m) => m.sessionId), messages.map((m) => m.runId), messages.map((m) => m.role),
    messages.map((m) => m.content), messages.map((m) => json(m.toolCalls)), messages.map((m) => m.toolCallId ?? null),
    messages.map((m) => m.atSeq), messages.map((m) => m.createdAt), messages.map((m) => m.replacesMessages ?? null)
  ]
}

const INSERT_MESSAGE = `INSERT INTO messages (id, session_id, run_id, role, content, tool_calls, tool_call_id, at_seq, created_at,
    replaces_messages)
  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`
