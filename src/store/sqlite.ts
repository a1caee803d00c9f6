import { dirname } from 'node:path'
import { setImmediate as nextTurn } from 'node:timers/promises'
import { DatabaseSync, type StatementSync } from 'node:sqlite'
import { makeFoldersSync } from '../make-folders.ts'
import { sqliteMigrations } from './sqlite-migrations.ts'
import { WalCheckpointer } from './sqlite-checkpointer.ts'
import { dataJsonOf, SessionGoneError, TenantFullError, withDataJson } from './store.ts'
import { json, MOST_TOKENS, parse, sessionParams, toEvent, toMessage, toRun, toSession, toToolCall, type Row } from './rows.ts'
import type {
  EventQuery, EventRecord, ForkSealing, IdempotencyClaim, IdempotencyOutcome, MessageRecord, RunPatch,
  RunRecord, SessionRecord, Store, StoreWrite, ToolCallRecord, AuditedToolCall
} from './store.ts'

type Param = string | number | null

interface PendingWrite {
  work: () => unknown
  /** Runs in a savepoint: a write of several statements that must fail as a whole. */
  atomic: boolean
  resolve: (value: unknown) => void
  reject: (reason: unknown) => void
  /** What work() returned, or threw (failed), in the batch's latest attempt. */
  value: unknown
  failed: boolean
}

/**
 * Events of one session that follow each other in a unit of work: inserted with one statement
 * per EVENT_ROWS of them. `records` are what the unit resolves with (each gets its seq when it
 * is stored), their data's JSON taken when the unit was handed over (withDataJson).
 */
interface EventGroup {
  sessionId: string
  records: EventRecord[]
}

/** One write of a unit of work, its parameters taken when the unit was handed over. */
type Step = EventGroup | (() => void)

/** `list` with `item` added, or a list of it: an empty array's first push allocates room for 17 items. */
function append<T>(list: T[] | undefined, item: T): T[] {
  if (list === undefined) return [item]
  list.push(item)
  return list
}

/** Rows of the largest multi-row INSERT of events (8 parameters a row); a longer group takes several. */
const EVENT_ROWS = 32

/**
 * The WAL is checkpointed (copied into the database file) once the store has been idle this
 * long after at least IDLE_CHECKPOINT_COMMITS group commits, or after BUSY_CHECKPOINT_COMMITS
 * without a quiet moment, on a thread of its own (WalCheckpointer). Checkpointing the moment the
 * store goes quiet (a run waiting on its model is quiet) copies a few pages at a time and leaves
 * the WAL small, so that an idle service's database file alone holds every commit; e2e p90
 * 0.80–0.83 and p50 0.94 of leaving it to SQLite (`npm run bench -- ab`), which checkpoints
 * inside whichever commit takes the WAL past its limit, 6–15 ms with the event loop blocked.
 */
const IDLE_CHECKPOINT_MS = 2
const IDLE_CHECKPOINT_COMMITS = 30
const BUSY_CHECKPOINT_COMMITS = 200
/**
 * SQLite's own checkpoint, inside a commit on the event loop, only if the WAL outgrows this many
 * pages (4 KiB each) all the same: the thread has failed, or falls far behind.
 */
const WAL_PAGES_BACKSTOP = 10_000
/**
 * A group commit that held the event loop this long wrote hundreds of pages (a fork's or a
 * deletion's piece, a long unit of work): it counts as HEAVY_COMMIT_WEIGHT commits towards
 * BUSY_CHECKPOINT_COMMITS. Counted one each, a run of such commits with no idle moment between
 * them (a 50 000-message fork) took the WAL past WAL_PAGES_BACKSTOP before the thread was asked,
 * and SQLite's checkpoint inside a commit held the loop 60-90 ms.
 */
const HEAVY_COMMIT_MS = 4
const HEAVY_COMMIT_WEIGHT = 20
/**
 * The same by what a commit wrote, whatever the host's speed: a commit counts one more for each
 * this many rows it changed (~10 pages of events; a run's ordinary group commit writes 10-20
 * rows). Timed alone, a fast host wrote 3 000 events in under HEAVY_COMMIT_MS, so a fork's pieces
 * counted one each again.
 */
const ROWS_PER_COMMIT = 150

/**
 * Events a deleted session loses per write (deleteSession), or events or messages a fork copies
 * (forkSession): a few ms of the event loop each. A deletion takes the oldest first and never the
 * newest (the subquery walks the primary key from the session's start); a fork copies the newest
 * events first, and the messages in their order.
 */
const PIECE_ROWS = 4000
/**
 * Messages a fork copies per write. They go through JavaScript (each gets a new ID, and the calls
 * left open are tracked), ~10-20 µs a message with its indexes: 4 000 in one write held the
 * event loop 40-85 ms, as long for every piece of a long session's fork.
 */
const MESSAGE_COPY_ROWS = 500
const PURGE_EVENTS = `DELETE FROM events WHERE session_id = ? AND seq < ? AND seq IN
  (SELECT seq FROM events WHERE session_id = ? AND seq < ? ORDER BY seq LIMIT ?)`
/**
 * A session whose rows are being removed or copied a piece per write (deleteSession, forkSession):
 * left out of listings until the work is done, and removed at the next start should a stop cut
 * it short (removeUnfinished). The marker goes with the session row (ON DELETE CASCADE).
 */
const MARK_UNFINISHED = 'INSERT OR IGNORE INTO unfinished_sessions (session_id) VALUES (?)'
/** For each other table of a session's rows: whether more than a piece is left, and the statement that removes a piece. */
const PURGE_CHILDREN = [
  ['SELECT 1 FROM messages WHERE session_id = ? ORDER BY pos DESC LIMIT 1 OFFSET ?',
    'DELETE FROM messages WHERE pos IN (SELECT pos FROM messages WHERE session_id = ? ORDER BY pos DESC LIMIT ?)'],
  ['SELECT 1 FROM tool_calls WHERE session_id = ? LIMIT 1 OFFSET ?',
    'DELETE FROM tool_calls WHERE rowid IN (SELECT rowid FROM tool_calls WHERE session_id = ? LIMIT ?)'],
  ['SELECT 1 FROM runs WHERE session_id = ? LIMIT 1 OFFSET ?',
    'DELETE FROM runs WHERE rowid IN (SELECT rowid FROM runs WHERE session_id = ? LIMIT ?)']
] as const
/** A fork's events with seq in (from, to], copied from its source (forkSession): PIECE_ROWS at most, seqs being one apart. */
const COPY_EVENTS = `INSERT INTO events (session_id, seq, run_id, channel, type, at, request_id, data)
  SELECT ?, seq, run_id, channel, type, at, request_id, data FROM events WHERE session_id = ? AND seq > ? AND seq <= ?`

/** Thrown when the store was used after close(); the routes turn it into 503 UNAVAILABLE. */
export class StoreClosedError extends Error {
  readonly code = 'STORE_CLOSED'
  constructor() {
    super('the store is closed')
  }
}

/** Thrown when another process holds the database (SQLite serves one agentd process). */
export class StoreLockedError extends Error {
  readonly code = 'STORE_LOCKED'
  constructor(path: string) {
    super(`the SQLite database ${path} is in use by another process; one agentd process serves a SQLite file (use DATABASE_URL with PostgreSQL for several)`)
  }
}

/** What to throw for an error of opening `path`: StoreLockedError when SQLite found it locked (or busy), else the error itself. */
function lockedOr(err: unknown, path: string): unknown {
  return /locked|busy/i.test((err as Error).message) ? new StoreLockedError(path) : err
}

/**
 * Takes this process's claim on a database file: an exclusive lock on `<file>-lock`, a database
 * of one row (who holds it, since when) that the returned connection keeps locked until it is
 * closed or the process ends. Throws StoreLockedError while another connection holds it.
 */
function lockOwner(path: string): DatabaseSync {
  const owner = new DatabaseSync(`${path}-lock`)
  try {
    // EXCLUSIVE locking mode never releases a lock once taken: the write below takes the file's.
    // Its journal is kept in memory, so that no `-lock-journal` file lies beside it (node:sqlite
    // refuses journal_mode OFF).
    owner.exec(`PRAGMA busy_timeout = 200; PRAGMA locking_mode = EXCLUSIVE; PRAGMA journal_mode = MEMORY;
      BEGIN EXCLUSIVE; CREATE TABLE IF NOT EXISTS owner (pid INTEGER NOT NULL, since TEXT NOT NULL);
      DELETE FROM owner; INSERT INTO owner VALUES (${process.pid}, '${new Date().toISOString()}'); COMMIT;`)
  } catch (err) {
    owner.close()
    throw lockedOr(err, path)
  }
  return owner
}

/**
 * The statements of a run's hot path, prepared together on first use (after migrate) and kept
 * in fields: looking one up costs nothing, where a Map keyed by the SQL text hashes the text.
 */
class HotStatements {
  readonly begin: StatementSync
  readonly commit: StatementSync
  readonly rollback: StatementSync
  readonly savepoint: StatementSync
  readonly release: StatementSync
  readonly rollbackTo: StatementSync
  readonly totalChanges: StatementSync
  readonly insertSession: StatementSync
  readonly insertMessage: StatementSync
  readonly insertRun: StatementSync
  readonly upsertToolCall: StatementSync
  readonly addUsage: StatementSync
  readonly setSessionStatus: StatementSync
  readonly touchSession: StatementSync
  readonly lastSeq: StatementSync
  readonly session: StatementSync
  readonly sessionById: StatementSync
  readonly sessionExists: StatementSync
  readonly countSessions: StatementSync
  readonly eventsAfter: StatementSync
  readonly messages: StatementSync
  readonly newestSummary: StatementSync
  readonly messagesFrom: StatementSync
  readonly messagesAfter: StatementSync
  /** INSERT of n events at index n - 1, prepared when a unit first needs that many. */
  readonly insertEvents: Array<StatementSync | undefined> = []
  /** UPDATE of a run, by the set of fields its patch changes (a bit per RUN_FIELDS entry). */
  readonly updateRun: Array<StatementSync | undefined> = []
  readonly #db: DatabaseSync

  constructor(db: DatabaseSync) {
    this.#db = db
    this.begin = db.prepare('BEGIN IMMEDIATE')
    this.commit = db.prepare('COMMIT')
    this.rollback = db.prepare('ROLLBACK')
    this.savepoint = db.prepare('SAVEPOINT write')
    this.release = db.prepare('RELEASE write')
    this.rollbackTo = db.prepare('ROLLBACK TO write')
    // Rows changed by the connection so far (inserts, updates and deletes, a trigger's too).
    this.totalChanges = db.prepare('SELECT total_changes() AS n')
    this.insertSession = db.prepare(INSERT_SESSION)
    this.insertMessage = db.prepare(INSERT_MESSAGE)
    this.insertRun = db.prepare(`INSERT INTO runs (id, session_id, status, request_id, steps, usage, error, message_id, input, created_at,
      started_at, ended_at, traceparent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
    this.upsertToolCall = db.prepare(`INSERT INTO tool_calls (id, session_id, run_id, step, name, input, state, started_at, ended_at,
        duration_ms, result, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
      ON CONFLICT (session_id, id) DO UPDATE SET input = excluded.input, state = excluded.state, ended_at = excluded.ended_at,
        duration_ms = excluded.duration_ms, result = excluded.result, error = excluded.error`)
    this.addUsage = db.prepare(`UPDATE sessions SET input_tokens = min(input_tokens + ?, ${MOST_TOKENS}),
      output_tokens = min(output_tokens + ?, ${MOST_TOKENS}), total_tokens = min(total_tokens + ?, ${MOST_TOKENS}) WHERE id = ?`)
    this.setSessionStatus = db.prepare('UPDATE sessions SET status = ?, updated_at = ? WHERE id = ?')
    this.touchSession = db.prepare('UPDATE sessions SET updated_at = ? WHERE id = ?')
    this.lastSeq = db.prepare(`SELECT ${LAST_SEQ} AS last_seq FROM sessions s WHERE id = ?`)
    this.session = db.prepare(`${SELECT_SESSION} WHERE id = ? AND tenant = ?`)
    this.sessionById = db.prepare(`${SELECT_SESSION} WHERE id = ?`)
    this.sessionExists = db.prepare('SELECT 1 FROM sessions WHERE id = ?')
    this.countSessions = db.prepare('SELECT sessions FROM tenant_stats WHERE tenant = ?')
    this.eventsAfter = db.prepare('SELECT * FROM events WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?')
    this.messages = db.prepare('SELECT * FROM messages WHERE session_id = ? ORDER BY pos')
    this.newestSummary = db.prepare(`SELECT replaces_messages FROM messages WHERE session_id = ? AND role = 'summary' ORDER BY pos DESC LIMIT 1`)
    this.messagesFrom = db.prepare('SELECT * FROM messages WHERE session_id = ? ORDER BY pos LIMIT ? OFFSET ?')
    this.messagesAfter = db.prepare('SELECT * FROM messages WHERE session_id = ? AND pos > ? ORDER BY pos LIMIT ?')
  }

  /** The INSERT of `rows` events (1 to EVENT_ROWS). */
  insertEventRows(rows: number): StatementSync {
    let statement = this.insertEvents[rows - 1]
    if (!statement) {
      const values = Array.from({ length: rows }, () => '(?, ?, ?, ?, ?, ?, ?, ?)').join(', ')
      statement = this.#db.prepare(`INSERT INTO events (session_id, seq, run_id, channel, type, at, request_id, data) VALUES ${values}`)
      this.insertEvents[rows - 1] = statement
    }
    return statement
  }

  /** The UPDATE of the run fields whose bits are set in `fields` (never 0). */
  updateRunFields(fields: number): StatementSync {
    let statement = this.updateRun[fields]
    if (!statement) {
      const sets = RUN_FIELDS.filter((_, i) => fields & (1 << i)).map(([, column]) => `${column} = ?`)
      statement = this.#db.prepare(`UPDATE runs SET ${sets.join(', ')} WHERE id = ?`)
      this.updateRun[fields] = statement
    }
    return statement
  }
}

/**
 * The embedded store on node:sqlite (no native build). node:sqlite is synchronous; each method
 * does a few microseconds of work, in WAL mode with synchronous=NORMAL, which survives a process
 * crash (kill -9) without losing a committed transaction.
 *
 * One process owns the file: at open it takes an exclusive lock on a small database beside it
 * (`<file>-lock`, lockOwner) and keeps it, so a second agentd on the same file fails to start
 * instead of corrupting the first one's runs, and the lock dies with the process (kill -9
 * included). That single writer is what lets this store keep each session's newest seq in memory.
 * The database itself is opened in SQLite's normal locking mode, so that the checkpoint thread's
 * connection can work beside the store's.
 *
 * Writes are group commits (#write). The WAL is checkpointed on a thread of its own whenever the
 * store goes quiet (IDLE_CHECKPOINT_MS), so that an idle service's database file alone holds
 * every commit, and every BUSY_CHECKPOINT_COMMITS commits under sustained load.
 */
export class SqliteStore implements Store {
  readonly kind = 'sqlite' as const
  readonly #db: DatabaseSync
  /** Statements off the hot path, by their SQL. */
  readonly #statements = new Map<string, StatementSync>()
  #hotStatements: HotStatements | null = null
  #closed = false
  /** Writes waiting for the next group commit. */
  #pending: PendingWrite[] = []
  #flushScheduled = false
  /** A file's store checkpoints its WAL when idle (IDLE_CHECKPOINT_MS); `:memory:` has no WAL, no lock file and no thread. */
  readonly #walFile: boolean
  /** The connection to `<file>-lock` that holds this process's claim on the file. */
  readonly #owner: DatabaseSync | null = null
  readonly #checkpointer: WalCheckpointer | null = null
  /** How long the store waits, quiet, before it checkpoints (IDLE_CHECKPOINT_MS unless a test says otherwise). */
  readonly #idleCheckpointMs: number
  /** Group commits since the last checkpoint. */
  #sinceCheckpoint = 0
  /** The connection's total_changes() after the last group commit (#commitWeight). */
  #totalChanges = 0
  #idleCheckpoint: NodeJS.Timeout | null = null
  /**
   * The newest seq of each session this process has appended to (in the current transaction
   * too). A session's newest seq is not a column: it is its newest event's, found through the
   * events' primary key (LAST_SEQ), so a transaction writes no sessions row for its events.
   * The lock on `<file>-lock` makes this process the file's only writer, so that key is read
   * once per session, not per event.
   */
  readonly #lastSeq = new Map<string, number>()
  /**
   * Sessions being deleted (deleteSession), made by a fork that is still copying (forkSession), or
   * left unfinished by a stop and being removed (removeUnfinished): getSession does not find them.
   * (The table unfinished_sessions keeps them out of listings, and across a restart.)
   */
  readonly #hidden = new Set<string>()
  /** While an atomic write runs: the seqs it moved, to put back if its savepoint is rolled back. */
  #seqUndo: Array<{ sessionId: string; last: number | undefined }> | null = null

  /**
   * `idleCheckpointMs`: for tests, a quiet moment that never comes, so that only BUSY_CHECKPOINT_COMMITS checkpoints.
   * `onCheckpointFailure`: told once if the checkpoint thread fails and the store checkpoints on its own connection instead.
   */
  constructor(path: string, options: { idleCheckpointMs?: number; onCheckpointFailure?: (err: Error) => void } = {}) {
    this.#idleCheckpointMs = options.idleCheckpointMs ?? IDLE_CHECKPOINT_MS
    this.#walFile = path !== ':memory:'
    if (this.#walFile) {
      makeFoldersSync(dirname(path))
      this.#owner = lockOwner(path)
    }
    try {
      this.#db = new DatabaseSync(path, { enableForeignKeyConstraints: true })
    } catch (err) {
      this.#owner?.close()
      throw err
    }
    try {
      // A short wait first: a file held by an agentd from before the lock file answers busy at once.
      this.#db.exec(`PRAGMA busy_timeout = 200; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
        PRAGMA wal_autocheckpoint = ${WAL_PAGES_BACKSTOP}; PRAGMA busy_timeout = 5000;`)
    } catch (err) {
      this.#db.close()
      this.#owner?.close()
      // A file held by an agentd from before the lock file (its connection kept SQLite's own exclusive lock).
      throw lockedOr(err, path)
    }
    if (this.#walFile) {
      const report = options.onCheckpointFailure
      this.#checkpointer = new WalCheckpointer(path, (err) => {
        report?.(err)
        // The checkpoint the thread was asked for is made here instead (a turn later: the failure may be reported from inside #checkpoint).
        setImmediate(() => {
          if (!this.#closed) this.#checkpointHere()
        })
      })
    }
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

  /** The hot path's statements (prepared on first use, which comes after migrate). */
  get #hot(): HotStatements {
    if (this.#closed) throw new StoreClosedError()
    return (this.#hotStatements ??= new HotStatements(this.#db))
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
   * Queues a write. Writes are committed together, one transaction for all that came in before
   * it runs (group commit): a commit costs far more than a statement, and a busy service queues
   * dozens of writes per turn. A write that fails is rolled back alone (#flush); its promise,
   * like every other, settles only once the transaction has committed.
   * Writes take their parameters when they are queued, never later.
   *
   * The transaction runs in a check phase (an immediate), queued once the turn's ticks and
   * microtasks are done, not at the first write: whatever the turn's work queued for that
   * check phase goes first. That is the model request of a run that was just admitted, or whose
   * tool result was just handed over: undici holds a request on a reused keep-alive socket back
   * for one immediate (it reads what the idle socket may hold first), and a commit queued at the
   * first write would run ahead of it, the run waiting. Measured against an immediate queued at
   * the first write (`npm run bench -- ab`, twice): e2e p50 0.92-0.94, first text 0.90-0.92.
   */
  #write<T>(work: () => T, atomic = false): Promise<T> {
    if (this.#closed) return Promise.reject(new StoreClosedError())
    return new Promise<T>((resolve, reject) => {
      this.#pending.push({ work, atomic, resolve: resolve as (value: unknown) => void, reject, value: undefined, failed: false })
      if (!this.#flushScheduled) {
        this.#flushScheduled = true
        process.nextTick(this.#flushAfterTicks)
      }
    })
  }

  /** Runs once the turn's ticks and microtasks are done: the flush goes behind the immediates they queued. */
  readonly #flushAfterTicks = (): void => {
    setImmediate(this.#flushNow)
  }

  readonly #flushNow = (): void => {
    this.#flush()
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
    try {
      // Nearly every batch succeeds whole, so it runs first without savepoints (two statements
      // less per unit of work). When a unit of several statements fails part-way, the batch is
      // rolled back and run again with a savepoint around each unit, so only that one fails.
      const started = performance.now()
      if (!this.#applyBatch(batch, false)) this.#applyBatch(batch, true)
      if (this.#walFile) this.#sinceCheckpoint += this.#commitWeight(performance.now() - started) - 1
    } catch (err) {
      // BEGIN or COMMIT failed (disk full, I/O error): nothing of the batch was committed.
      if (this.#db.isTransaction) this.#db.exec('ROLLBACK')
      this.#forgetSeqs()
      for (const write of batch) write.reject(err)
      return
    }
    for (const write of batch) {
      if (write.failed) write.reject(write.value)
      else write.resolve(write.value)
    }
    if (this.#walFile && ++this.#sinceCheckpoint >= IDLE_CHECKPOINT_COMMITS) {
      if (this.#sinceCheckpoint >= BUSY_CHECKPOINT_COMMITS) this.#checkpoint()
      // Every commit pushes the idle deadline back; one timer, re-armed without allocating.
      else if (this.#idleCheckpoint) this.#idleCheckpoint.refresh()
      else this.#idleCheckpoint = setTimeout(this.#checkpointWhenIdle, this.#idleCheckpointMs).unref()
    }
  }

  /**
   * How many commits the group commit just made counts for towards BUSY_CHECKPOINT_COMMITS: one,
   * or more for one that held the loop (HEAVY_COMMIT_MS) or changed many rows (ROWS_PER_COMMIT).
   */
  #commitWeight(ms: number): number {
    const total = Number((this.#hot.totalChanges.get() as Row).n)
    const rows = total - this.#totalChanges
    this.#totalChanges = total
    return Math.max(ms >= HEAVY_COMMIT_MS ? HEAVY_COMMIT_WEIGHT : 1, Math.ceil(rows / ROWS_PER_COMMIT))
  }

  /** Copies the WAL into the database file, unless writes are queued (the next commit re-arms it). */
  readonly #checkpointWhenIdle = (): void => {
    this.#idleCheckpoint = null
    if (this.#closed || this.#flushScheduled) return
    this.#checkpoint()
  }

  /** Has the WAL copied into the database file: by the checkpoint thread, or here if it cannot. */
  #checkpoint(): void {
    this.#sinceCheckpoint = 0
    if (this.#idleCheckpoint) {
      clearTimeout(this.#idleCheckpoint)
      this.#idleCheckpoint = null
    }
    if (this.#checkpointer?.request()) return
    this.#checkpointHere()
  }

  /** Checkpoints on the store's own connection, on the event loop: when the thread cannot. */
  #checkpointHere(): void {
    try {
      // PASSIVE: copies what it can and never waits. The next write then starts the WAL over.
      this.#db.exec('PRAGMA wal_checkpoint(PASSIVE)')
    } catch {
      // Nothing is lost: the WAL keeps every commit, and SQLite's own checkpoint (WAL_PAGES_BACKSTOP)
      // runs inside a commit, which reports the same I/O error to its caller if it persists.
    }
  }

  /** Resolves once no checkpoint is running or asked for on the checkpoint thread. */
  checkpointed(): Promise<void> {
    return this.#checkpointer?.settled() ?? Promise.resolve()
  }

  /**
   * Runs a batch in one transaction and commits it; each write's outcome is left on it. Without
   * savepoints, a unit of several statements that fails rolls the whole transaction back and
   * answers false (run it again with savepoints); with them, each such unit is undone alone and
   * the rest commits.
   */
  #applyBatch(batch: PendingWrite[], withSavepoints: boolean): boolean {
    const hot = this.#hot
    hot.begin.run()
    for (const write of batch) {
      const savepoint = withSavepoints && write.atomic
      if (savepoint) {
        hot.savepoint.run()
        this.#seqUndo = []
      }
      try {
        write.value = write.work()
        write.failed = false
        if (savepoint) hot.release.run()
      } catch (error) {
        if (write.atomic && !withSavepoints) {
          hot.rollback.run()
          this.#forgetSeqs()
          return false
        }
        if (savepoint) {
          hot.rollbackTo.run()
          hot.release.run()
          this.#undoSeqs()
        }
        // A single statement that fails is undone by SQLite alone.
        write.value = error
        write.failed = true
      } finally {
        this.#seqUndo = null
      }
    }
    hot.commit.run()
    // Bounded: past this many sessions the cache starts over (each reloads on its next event).
    if (this.#lastSeq.size > 10_000) this.#lastSeq.clear()
    return true
  }

  /** Drops the cached seqs (a transaction was rolled back): each session reloads its own from the file. */
  #forgetSeqs(): void {
    this.#lastSeq.clear()
  }

  /** Puts back the seqs of a rolled-back write, newest change first. */
  #undoSeqs(): void {
    for (const { sessionId, last } of (this.#seqUndo ?? []).reverse()) {
      if (last === undefined) this.#lastSeq.delete(sessionId)
      else this.#lastSeq.set(sessionId, last)
    }
  }

  /** Moves the session's newest seq, remembering the old one while a savepoint may undo it. */
  #setSeq(sessionId: string, seq: number): void {
    this.#seqUndo?.push({ sessionId, last: this.#lastSeq.get(sessionId) })
    this.#lastSeq.set(sessionId, seq)
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

  /**
   * Claims of requests still in progress when the store was last closed. This process holds the
   * file alone, so no request of it is in flight yet: their holders are gone (kill -9), and their
   * keys are freed for the retry instead of waiting for the lease.
   */
  async releaseOrphanedClaims(): Promise<number> {
    return this.#write(() => Number(this.#stmt(`DELETE FROM idempotency WHERE state = 'in_progress'`).run().changes))
  }

  /**
   * Removes the sessions a stop left unfinished: a deletion cut short, or a fork whose copy was
   * (its ID was never answered). Each is hidden at once, then removed a piece per write while the
   * service runs, so that a long one does not hold up the start. Resolves with how many were
   * removed; never rejects: a removal that fails is told to `onFailure` (not when the store is
   * closing) and tried again at the next start.
   */
  async removeUnfinished(onFailure: (err: Error) => void = () => undefined): Promise<number> {
    const unfinished = this.#stmt(
      'SELECT s.id, s.tenant FROM unfinished_sessions u JOIN sessions s ON s.id = u.session_id'
    ).all() as Array<{ id: string; tenant: string }>
    for (const { id } of unfinished) this.#hidden.add(id)
    let removed = 0
    for (const { id, tenant } of unfinished) {
      try {
        if (await this.#remove(tenant, id)) removed++
      } catch (err) {
        if (err instanceof StoreClosedError) break
        onFailure(err as Error)
      }
    }
    return removed
  }

  async ping(): Promise<void> {
    this.#stmt('SELECT 1').get()
  }

  async close(): Promise<void> {
    if (this.#closed) return
    // The thread's connection goes first: the last connection to close checkpoints the WAL and
    // removes it. Told before the final flush, so that a flush crossing BUSY_CHECKPOINT_COMMITS
    // does not start a thread only to end it.
    const threadClosed = this.#checkpointer?.close()
    this.#flush()
    if (this.#idleCheckpoint) clearTimeout(this.#idleCheckpoint)
    this.#closed = true
    this.#statements.clear()
    this.#hotStatements = null
    await threadClosed
    this.#db.close()
    this.#owner?.close()
  }

  async commit(writes: readonly StoreWrite[]): Promise<EventRecord[]> {
    // Parameters are taken now (JSON included), so the caller may change its objects right after.
    // A unit is most often one text chunk: its lists are made with their first item (append).
    let steps: Step[] | undefined
    let events: EventRecord[] | undefined
    for (const write of writes) {
      if (write.type !== 'event') {
        steps = append(steps, this.#prepareWrite(write))
        continue
      }
      const e = write.event
      const record = withDataJson({
        seq: 0, sessionId: e.sessionId, runId: e.runId, channel: e.channel, type: e.type, at: e.at, requestId: e.requestId, data: e.data
      }, JSON.stringify(e.data))
      events = append(events, record)
      const previous = steps?.[steps.length - 1]
      if (typeof previous === 'object' && previous.sessionId === e.sessionId) previous.records.push(record)
      else steps = append(steps, { sessionId: e.sessionId, records: [record] })
    }
    const stored = events ?? []
    const all = steps ?? []
    return this.#write(() => {
      try {
        for (const step of all) {
          if (typeof step === 'function') step()
          else this.#insertEvents(step)
        }
      } catch (err) {
        // Every foreign key of these tables points at the session: it was deleted meanwhile.
        if (/FOREIGN KEY constraint failed/.test((err as Error).message)) throw new SessionGoneError()
        throw err
      }
      return stored
    }, writes.length > 1)
  }

  /** Stores a group of one session's events under its next seqs, EVENT_ROWS rows a statement. */
  #insertEvents({ sessionId, records }: EventGroup): void {
    const last = this.#currentSeq(sessionId)
    if (last === undefined) throw new SessionGoneError(sessionId)
    let seq = last
    for (let start = 0; start < records.length; start += EVENT_ROWS) {
      const rows = Math.min(EVENT_ROWS, records.length - start)
      const params: Param[] = new Array(rows * 8)
      for (let i = 0, p = 0; i < rows; i++, p += 8) {
        const record = records[start + i] as EventRecord
        record.seq = ++seq
        params[p] = sessionId
        params[p + 1] = seq
        params[p + 2] = record.runId
        params[p + 3] = record.channel
        params[p + 4] = record.type
        params[p + 5] = record.at
        params[p + 6] = record.requestId
        params[p + 7] = dataJsonOf(record)
      }
      this.#hot.insertEventRows(rows).run(...params)
    }
    this.#setSeq(sessionId, seq)
  }

  /** A write of a unit of work other than an event, as a closure over its parameters. */
  #prepareWrite(write: Exclude<StoreWrite, { type: 'event' }>): () => void {
    switch (write.type) {
      case 'message': {
        const { id, sessionId, runId, role, content, createdAt } = write.message
        const toolCalls = json(write.message.toolCalls)
        const toolCallId = write.message.toolCallId ?? null
        const replaces = write.message.replacesMessages ?? null
        return () => {
          // at_seq: the session's newest event when the message was stored, which places it for fork.
          const atSeq = this.#currentSeq(sessionId) ?? 0
          this.#hot.insertMessage.run(id, sessionId, runId, role, content, toolCalls, toolCallId, atSeq, createdAt, replaces)
        }
      }
      case 'newRun': {
        const r = write.run
        const params: Param[] = [
          r.id, r.sessionId, r.status, r.requestId, r.steps, json(r.usage), json(r.error), r.messageId, r.input, r.createdAt, r.startedAt, r.endedAt,
          r.traceparent ?? null
        ]
        return () => {
          this.#hot.insertRun.run(...params)
        }
      }
      case 'run': {
        const { fields, params } = runUpdate(write.id, write.patch)
        return () => {
          if (fields !== 0) this.#hot.updateRunFields(fields).run(...params)
        }
      }
      case 'session': {
        const { patch, id } = write
        const status = patch.status
        const updatedAt = patch.updatedAt ?? new Date().toISOString()
        return () => {
          if (status === undefined) this.#hot.touchSession.run(updatedAt, id)
          else this.#hot.setSessionStatus.run(status, updatedAt, id)
        }
      }
      case 'usage': {
        const { usage, sessionId } = write
        const { inputTokens, outputTokens, totalTokens } = usage
        return () => {
          this.#hot.addUsage.run(inputTokens, outputTokens, totalTokens, sessionId)
        }
      }
      case 'toolCall': {
        const c = write.call
        const params: Param[] = [
          c.id, c.sessionId, c.runId, c.step, c.name, json(c.input), c.state, c.startedAt, c.endedAt, c.durationMs, json(c.result), json(c.error)
        ]
        return () => {
          this.#hot.upsertToolCall.run(...params)
        }
      }
    }
  }

  async createSession(s: SessionRecord, maxSessions?: number): Promise<void> {
    const params = sessionParams(s, false)
    return this.#write(() => {
      this.#assertRoom(s.tenant, maxSessions)
      this.#hot.insertSession.run(...params)
      // A new session has no events: its first one then needs no read.
      this.#setSeq(s.id, 0)
    })
  }

  /**
   * Inside a write: the tenant's count as this transaction sees it, which counts the sessions the
   * batch's earlier writes made (the group commit applies them one after another).
   */
  #assertRoom(tenant: string, maxSessions: number | undefined): void {
    if (maxSessions === undefined) return
    const row = this.#hot.countSessions.get(tenant) as Row | undefined
    if (Number(row?.sessions ?? 0) >= maxSessions) throw new TenantFullError(maxSessions)
  }

  async getSession(tenant: string, id: string): Promise<SessionRecord | null> {
    if (this.#hidden.has(id)) return null
    const row = this.#hot.session.get(id, tenant) as Row | undefined
    return row ? toSession(row) : null
  }

  async getSessionById(id: string): Promise<SessionRecord | null> {
    const row = this.#hot.sessionById.get(id) as Row | undefined
    return row ? toSession(row) : null
  }

  async hasSession(id: string): Promise<boolean> {
    return this.#hot.sessionExists.get(id) !== undefined
  }

  async listSessions(tenant: string, options: { limit: number; before?: string }): Promise<SessionRecord[]> {
    const whole = 'id NOT IN (SELECT session_id FROM unfinished_sessions)'
    const rows = options.before
      ? this.#stmt(`${SELECT_SESSION} WHERE tenant = ? AND id < ? AND ${whole} ORDER BY id DESC LIMIT ?`).all(tenant, options.before, options.limit)
      : this.#stmt(`${SELECT_SESSION} WHERE tenant = ? AND ${whole} ORDER BY id DESC LIMIT ?`).all(tenant, options.limit)
    return (rows as Row[]).map(toSession)
  }

  async countSessions(tenant: string): Promise<number> {
    const row = this.#hot.countSessions.get(tenant) as Row | undefined
    return row ? Number(row.sessions) : 0
  }

  /**
   * A session's rows go PIECE_ROWS at a time, each piece a write of its own in the group commits
   * (the event loop runs every other session's work between them): its events, then its messages,
   * tool calls and runs while more than a piece of them is left; then the session row, whose
   * cascade takes the rest. One transaction for all of it held the event loop ~1 µs a row (a
   * session of a million events: a second, for every tenant). Meanwhile getSession no longer
   * finds it, and from its first write on, listings leave it out (unfinished_sessions). A
   * deletion cut short (the process stopped) is finished at the next start (removeUnfinished);
   * one that failed (an I/O error) is finished by a new deletion, or by the next start. Its newest
   * event stays to the last piece, so that it hands no seq out twice, and its messages go newest
   * first, so that what is left of its conversation is its beginning (a summary's
   * `replacesMessages` counts from there).
   */
  async deleteSession(tenant: string, id: string): Promise<boolean> {
    // Looked up and hidden in one go (no await between): a second deletion asked for meanwhile
    // finds it under way and answers false, instead of doing the same pieces alongside.
    if (this.#hidden.has(id) || this.#hot.session.get(id, tenant) === undefined) return false
    return this.#remove(tenant, id)
  }

  /** Removes a session's rows a piece per write (deleteSession); false when its row was gone by the last one. */
  async #remove(tenant: string, id: string): Promise<boolean> {
    this.#hidden.add(id)
    try {
      const newest = this.#currentSeq(id) ?? 0
      let removed: number
      do {
        removed = await this.#write(() => {
          // Every piece marks it (a no-op once marked): a batch run again after a rollback runs each write again.
          this.#stmt(MARK_UNFINISHED).run(id)
          return Number(this.#stmt(PURGE_EVENTS).run(id, newest, id, newest, PIECE_ROWS).changes)
        })
      } while (removed === PIECE_ROWS)
      for (const [beyondPiece, purge] of PURGE_CHILDREN) {
        let more = true
        while (more) {
          more = await this.#write(() => {
            if (this.#stmt(beyondPiece).get(id, PIECE_ROWS) === undefined) return false
            this.#stmt(purge).run(id, PIECE_ROWS)
            return true
          })
        }
      }
      return await this.#write(() => {
        const result = this.#stmt('DELETE FROM sessions WHERE id = ? AND tenant = ?').run(id, tenant)
        if (Number(result.changes) === 0) return false
        this.#lastSeq.delete(id)
        return true
      })
    } finally {
      this.#hidden.delete(id)
    }
  }

  /** The session's newest seq, including this batch's uncommitted events; undefined when there is no such session. */
  #currentSeq(sessionId: string): number | undefined {
    const cached = this.#lastSeq.get(sessionId)
    if (cached !== undefined) return cached
    const row = this.#hot.lastSeq.get(sessionId) as Row | undefined
    return row ? Number(row.last_seq) : undefined
  }

  /**
   * A filtered query (channels, types, untilSeq) reads every event of the range to find the few it
   * keeps (~80 ns a row: a session of 250 000 events held the event loop 16-40 ms for each such
   * request). It reads PIECE_ROWS seqs at a time, a turn of the event loop between, until it has
   * `limit` events or has reached the session's newest (or untilSeq).
   */
  async listEvents(sessionId: string, query: EventQuery): Promise<EventRecord[]> {
    // The common query (a replay from a point, a page at a time: the POST stream's, a reconnect's) has a statement of its own.
    if (query.untilSeq === undefined && !query.channels?.length && !query.types?.length) {
      return (this.#hot.eventsAfter.all(sessionId, query.after, query.limit ?? -1) as Row[]).map(toEvent)
    }
    const where = ['session_id = ?', 'seq > ?', 'seq <= ?']
    const filters: string[] = []
    if (query.channels?.length) {
      where.push(`channel IN (${query.channels.map(() => '?').join(', ')})`)
      filters.push(...query.channels)
    }
    if (query.types?.length) {
      where.push(`type IN (${query.types.map(() => '?').join(', ')})`)
      filters.push(...query.types)
    }
    const read = this.#stmt(`SELECT * FROM events WHERE ${where.join(' AND ')} ORDER BY seq LIMIT ?`)
    const end = Math.min(query.untilSeq ?? Number.MAX_SAFE_INTEGER, this.#currentSeq(sessionId) ?? 0)
    const limit = query.limit ?? Number.POSITIVE_INFINITY
    const events: EventRecord[] = []
    for await (const piece of this.#seqPieces(query.after, end)) {
      const left = limit - events.length
      const rows = read.all(sessionId, piece.after, piece.upTo, ...filters, Number.isFinite(left) ? left : -1) as Row[]
      for (const row of rows) events.push(toEvent(row))
      if (events.length >= limit) break
    }
    return events
  }

  async listMessages(sessionId: string): Promise<MessageRecord[]> {
    const rows = this.#hot.messages.all(sessionId) as Row[]
    return rows.map(toMessage)
  }

  /**
   * The messages from the newest summary on, PIECE_ROWS a turn of the event loop: a session
   * without a summary (or whose summaries keep failing) has its whole conversation read at every
   * run, and 50 000 messages in one statement held the loop ~130 ms.
   */
  async listContextMessages(sessionId: string): Promise<{ messages: MessageRecord[]; offset: number }> {
    const summary = this.#hot.newestSummary.get(sessionId) as Row | undefined
    const offset = Number(summary?.replaces_messages ?? 0)
    const messages: MessageRecord[] = []
    let rows = this.#hot.messagesFrom.all(sessionId, PIECE_ROWS, offset) as Row[]
    for (;;) {
      for (const row of rows) messages.push(toMessage(row))
      if (rows.length < PIECE_ROWS) return { messages, offset }
      // The session has one run at a time, which reads this before it writes: nothing is appended meanwhile.
      const last = Number(rows.at(-1)?.pos)
      await this.#nextTurn()
      rows = this.#hot.messagesAfter.all(sessionId, last, PIECE_ROWS) as Row[]
    }
  }

  async pageMessages(sessionId: string, options: { limit: number; after?: string }): Promise<MessageRecord[] | null> {
    let pos = 0
    if (options.after !== undefined) {
      const row = this.#stmt('SELECT pos FROM messages WHERE id = ? AND session_id = ?').get(options.after, sessionId) as Row | undefined
      if (!row) return null
      pos = Number(row.pos)
    }
    const rows = this.#stmt('SELECT * FROM messages WHERE session_id = ? AND pos > ? ORDER BY pos LIMIT ?').all(sessionId, pos, options.limit) as Row[]
    return rows.map(toMessage)
  }

  /**
   * The fork's row and its newest PIECE_ROWS events go in one write; its older events follow a
   * piece per write, newest first, then its messages MESSAGE_COPY_ROWS per write in their order, then the
   * sealed answers of the calls they leave open: a long session's fork does not hold the event
   * loop for all of it (250 000 events: ~480 ms in one transaction; 50 000 messages ~400 ms).
   * getSession does not find the fork until the last piece, nor do listings (unfinished_sessions).
   * A piece that fails has the fork deleted, as one transaction would have left nothing; a fork
   * cut short by a stop (its ID never answered) is removed at the next start (removeUnfinished).
   */
  async forkSession(sourceId: string, target: SessionRecord, atSeq: number, seal: ForkSealing, maxSessions?: number): Promise<SessionRecord> {
    this.#hidden.add(target.id)
    let made = false
    try {
      // Events up to atSeq never change (a deletion meanwhile fails the fork at its last write).
      const oldest = this.#oldestSeq(sourceId)
      const point = await this.#forkPoint(sourceId, atSeq, oldest ?? atSeq)
      const { fork, lastPos } = await this.#write(() => {
        const newest = this.#currentSeq(sourceId)
        if (newest === undefined || this.#hidden.has(sourceId)) throw new SessionGoneError(sourceId)
        this.#assertRoom(target.tenant, maxSessions)
        // Not past the source's newest event: the fork's newest seq is its newest copied event's.
        const at = Math.min(point, newest)
        const fork: SessionRecord = { ...target, lastSeq: at, forkedFrom: { sessionId: sourceId, atSeq: at } }
        this.#hot.insertSession.run(...sessionParams(fork, false))
        this.#stmt(MARK_UNFINISHED).run(fork.id)
        this.#setSeq(fork.id, at)
        this.#stmt(COPY_EVENTS).run(fork.id, sourceId, at - PIECE_ROWS, at)
        // The messages stored by now are the fork's: a message stored later has a later pos, whatever its at_seq.
        // Read down the (session_id, pos) index from the newest: max(pos) with at_seq in the filter
        // read every message of the session in this write (50 000: ~50 ms of the event loop).
        const newestCopied = this.#stmt('SELECT pos FROM messages WHERE session_id = ? AND at_seq <= ? ORDER BY pos DESC LIMIT 1').get(sourceId, at) as Row | undefined
        return { fork, lastPos: newestCopied ? Number(newestCopied.pos) : 0 }
      }, true)
      made = true
      for (let below = fork.lastSeq - PIECE_ROWS; below >= (oldest ?? fork.lastSeq); below -= PIECE_ROWS) {
        await this.#write(() => this.#stmt(COPY_EVENTS).run(fork.id, sourceId, below - PIECE_ROWS, below))
      }
      // The calls of the copied messages without an answer among them: sealed once all are copied.
      const open = new Map<string, { name: string; runId: string | null }>()
      for (let after = 0; after < lastPos;) {
        after = await this.#write(() => {
          const rows = this.#stmt('SELECT * FROM messages WHERE session_id = ? AND pos > ? AND pos <= ? AND at_seq <= ? ORDER BY pos LIMIT ?')
            .all(sourceId, after, lastPos, fork.lastSeq, MESSAGE_COPY_ROWS) as Row[]
          const insert = this.#stmt(INSERT_MESSAGE)
          for (const row of rows) {
            const m = toMessage(row)
            insert.run(seal.newMessageId(), fork.id, m.runId, m.role, m.content, json(m.toolCalls), m.toolCallId ?? null, Number(row.at_seq),
              m.createdAt, m.replacesMessages ?? null)
            if (m.role === 'assistant') for (const call of m.toolCalls ?? []) open.set(call.id, { name: call.name, runId: m.runId })
            if (m.role === 'tool' && m.toolCallId) open.delete(m.toolCallId)
          }
          return rows.length < MESSAGE_COPY_ROWS ? lastPos : Number(rows.at(-1)?.pos)
        })
      }
      await this.#write(() => {
        // A source deleted meanwhile may have lost rows before they were copied.
        if (this.#hidden.has(sourceId) || this.#currentSeq(sourceId) === undefined) throw new SessionGoneError(sourceId)
        const insert = this.#stmt(INSERT_MESSAGE)
        for (const [callId, call] of open) {
          insert.run(seal.newMessageId(), fork.id, call.runId, 'tool', seal.sealedAnswer(call.name), null, callId, fork.lastSeq, new Date().toISOString(), null)
        }
        // Whole: listed from this commit on.
        this.#stmt('DELETE FROM unfinished_sessions WHERE session_id = ?').run(fork.id)
      }, true)
      return fork
    } catch (err) {
      if (made && !this.#closed) await this.#remove(target.tenant, target.id).catch(() => undefined)
      throw err
    } finally {
      this.#hidden.delete(target.id)
    }
  }

  /**
   * The last seq <= atSeq at which no run of the session is half done: a run whose first event
   * is at or before atSeq but whose `done` is not moves the point back to just before it.
   * The events from `oldest` up to atSeq are read PIECE_ROWS seqs a turn (they never change): one
   * query that looked for each run event's `done` took time quadratic in the session's events
   * (20 000 events in 400 runs: 10.7 s of the event loop).
   */
  async #forkPoint(sessionId: string, atSeq: number, oldest: number): Promise<number> {
    const firstOfRun = new Map<string, number>()
    const ended = new Set<string>()
    const read = this.#stmt('SELECT seq, run_id, type FROM events WHERE session_id = ? AND seq > ? AND seq <= ? AND run_id IS NOT NULL ORDER BY seq')
    for await (const piece of this.#seqPieces(oldest - 1, atSeq)) {
      for (const row of read.all(sessionId, piece.after, piece.upTo) as Row[]) {
        const runId = String(row.run_id)
        if (!firstOfRun.has(runId)) firstOfRun.set(runId, Number(row.seq))
        if (row.type === 'done') ended.add(runId)
      }
    }
    let point = atSeq
    for (const [runId, first] of firstOfRun) if (!ended.has(runId)) point = Math.min(point, first - 1)
    return point
  }

  /**
   * The seq ranges (after, upTo] from `after` to `end`, PIECE_ROWS seqs each, with a turn of the
   * event loop between two: a read over a long session holds the loop for a piece, not all of it.
   */
  async *#seqPieces(after: number, end: number): AsyncGenerator<{ after: number; upTo: number }> {
    for (let from = after; from < end; from += PIECE_ROWS) {
      if (from > after) await this.#nextTurn()
      yield { after: from, upTo: Math.min(from + PIECE_ROWS, end) }
    }
  }

  /** A turn of the event loop in the middle of a read; the store may have been closed meanwhile (its statements with it). */
  async #nextTurn(): Promise<void> {
    await nextTurn()
    if (this.#closed) throw new StoreClosedError()
  }

  /** The seq of the session's oldest event (usually 1; later after a deletion cut short), or undefined when it has none. */
  #oldestSeq(sessionId: string): number | undefined {
    const { seq } = this.#stmt('SELECT min(seq) AS seq FROM events WHERE session_id = ?').get(sessionId) as Row
    return seq === null || seq === undefined ? undefined : Number(seq)
  }

  async getRun(sessionId: string, runId: string): Promise<RunRecord | null> {
    const row = this.#stmt('SELECT * FROM runs WHERE id = ? AND session_id = ?').get(runId, sessionId) as Row | undefined
    return row ? toRun(row) : null
  }

  async listUnfinishedRuns(): Promise<RunRecord[]> {
    // rowid: the order the runs were accepted in, which FIFO queues keep.
    const rows = this.#stmt(
      `SELECT * FROM runs WHERE status NOT IN ('completed', 'failed', 'cancelled') ORDER BY rowid`
    ).all() as Row[]
    return rows.map(toRun)
  }

  async getToolCall(sessionId: string, callId: string): Promise<ToolCallRecord | null> {
    const row = this.#stmt('SELECT * FROM tool_calls WHERE session_id = ? AND id = ?').get(sessionId, callId) as Row | undefined
    return row ? toToolCall(row) : null
  }

  async listToolCalls(runId: string): Promise<ToolCallRecord[]> {
    const rows = this.#stmt('SELECT * FROM tool_calls WHERE run_id = ? ORDER BY started_at, id').all(runId) as Row[]
    return rows.map(toToolCall)
  }

  async listSessionToolCalls(sessionId: string, options: { limit: number; after?: string }): Promise<AuditedToolCall[]> {
    // Call IDs are time-ordered, so ID order is the order the model made the calls.
    const rows = this.#stmt(`SELECT c.*, r.request_id FROM tool_calls c LEFT JOIN runs r ON r.id = c.run_id
      WHERE c.session_id = ? AND c.id > ? ORDER BY c.id LIMIT ?`).all(sessionId, options.after ?? '', options.limit) as Row[]
    return rows.map((row) => ({ ...toToolCall(row), requestId: (row.request_id as string | null) ?? null }))
  }

  async claimIdempotency(claim: IdempotencyClaim): Promise<IdempotencyOutcome> {
    return this.#write((): IdempotencyOutcome => {
      // A claim in progress whose lease has passed was left by a holder that is gone: take it over.
      const inserted = this.#stmt(`INSERT INTO idempotency (tenant, key, fingerprint, state, created_at, lease_until)
        VALUES (?, ?, ?, 'in_progress', ?, ?)
        ON CONFLICT (tenant, key) DO UPDATE SET fingerprint = excluded.fingerprint, created_at = excluded.created_at,
          lease_until = excluded.lease_until
        WHERE idempotency.state = 'in_progress' AND idempotency.lease_until < ?`)
        .run(claim.tenant, claim.key, claim.fingerprint, claim.createdAt, claim.leaseUntil, claim.createdAt)
      if (Number(inserted.changes) > 0) return { state: 'claimed' }
      const row = this.#stmt('SELECT * FROM idempotency WHERE tenant = ? AND key = ?').get(claim.tenant, claim.key) as Row
      if (row.fingerprint !== claim.fingerprint) return { state: 'mismatch' }
      if (row.state === 'in_progress') return { state: 'in_progress' }
      return { state: 'completed', status: Number(row.status), body: parse(row.body) }
    })
  }

  async renewIdempotency(tenant: string, key: string, leaseUntil: string): Promise<void> {
    return this.#run(`UPDATE idempotency SET lease_until = ? WHERE tenant = ? AND key = ? AND state = 'in_progress'`, [leaseUntil, tenant, key])
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
    approval, limits, metadata, input_tokens, output_tokens, total_tokens, forked_from)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

/** A session's newest seq (0 before its first event), for a query on `sessions s`: one descent of the events' primary key. */
const LAST_SEQ = 'coalesce((SELECT max(seq) FROM events WHERE session_id = s.id), 0)'

/** A session row as toSession reads it, last_seq included; WHERE … follows. */
const SELECT_SESSION = `SELECT id, tenant, created_at, updated_at, status, model, instructions, tools, approval, limits, metadata,
    ${LAST_SEQ} AS last_seq, input_tokens, output_tokens, total_tokens, forked_from
  FROM sessions s`

const INSERT_MESSAGE = `INSERT INTO messages (id, session_id, run_id, role, content, tool_calls, tool_call_id, at_seq, created_at,
    replaces_messages)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`

/** The fields a run patch may change, with their columns; a patch's UPDATE is keyed by which of them it sets. */
const RUN_FIELDS: ReadonlyArray<readonly [keyof RunPatch, string]> = [
  ['status', 'status'], ['steps', 'steps'], ['usage', 'usage'], ['error', 'error'], ['startedAt', 'started_at'], ['endedAt', 'ended_at']
]

/** Which fields a run patch sets (a bit per RUN_FIELDS entry; 0 when none) and the UPDATE's parameters. */
function runUpdate(id: string, patch: RunPatch): { fields: number; params: Param[] } {
  let fields = 0
  const params: Param[] = []
  for (let i = 0; i < RUN_FIELDS.length; i++) {
    const key = (RUN_FIELDS[i] as readonly [keyof RunPatch, string])[0]
    if (!(key in patch)) continue
    fields |= 1 << i
    const value = patch[key]
    params.push(key === 'usage' || key === 'error' ? json(value) : (value as Param))
  }
  params.push(id)
  return { fields, params }
}
