import type pg from 'pg'
import type { Logger } from 'pino'
import type { EventBus } from '../events/event-bus.ts'
import type { ClusterChannel, ClusterMessage } from '../events/cluster-channel.ts'
import { newId } from '../ids.ts'
import type { PostgresStore } from '../store/postgres.ts'
import { insertRun, toRun } from '../store/rows.ts'
import { SessionGoneError, type RunRecord, type SessionRecord, type ToolCallRecord } from '../store/store.ts'
import { AgentError } from './agent-error.ts'
import type { CallSignal, Cancellation, ClaimedRun, OnBusy, Orphan, RunCoordinator, RunSignals } from './run-coordinator.ts'
import { waitForRun } from './wait-for-run.ts'

type Row = Record<string, unknown>

const UNFINISHED = `status NOT IN ('completed', 'failed', 'cancelled')`
/** A run some process holds: executing, waiting on a person or a client, or just claimed. */
const CLAIMED = `${UNFINISHED} AND owner IS NOT NULL`
/** The states of a call that has its final outcome stored. */
const ENDED_CALL: ReadonlySet<ToolCallRecord['state']> = new Set(['completed', 'failed', 'denied', 'sealed'])
/** How long a process waits for a run's owner to take a signal before it says the owner is unavailable. */
const SIGNAL_TIMEOUT_MS = 5000

export interface PostgresRunCoordinatorOptions {
  /** This process's id, unique among the processes on the database. */
  ownerId: string
  store: PostgresStore
  bus: EventBus
  channel: ClusterChannel
  /** How long a claim holds without a heartbeat (AGENTD_RUN_LEASE_MS). */
  leaseMs: number
  logger: Logger
  /** How long a signal waits for the run's owner to answer; default SIGNAL_TIMEOUT_MS (tests shorten it). */
  signalTimeoutMs?: number
}

/**
 * The RunCoordinator of several processes on one PostgreSQL database: the queue and the owner of
 * every run live in the runs table. A process claims a run with its owner id and a lease it
 * renews (a heartbeat at a third of the lease); a run whose lease has expired belongs to a
 * process that is gone, and any other takes it over (orphans). Admission checks the busy session
 * and the tenant's count inside one transaction (the session row locked, then the tenant's
 * admissions serialised by an advisory lock). Signals go to the owner wherever it runs over the cluster
 * channel; a cancel is also written on the row, which the owner's heartbeat reads should the
 * message be lost.
 */
export class PostgresRunCoordinator implements RunCoordinator {
  readonly ownerId: string
  readonly #store: PostgresStore
  readonly #bus: EventBus
  readonly #channel: ClusterChannel
  readonly #leaseMs: number
  readonly #log: Logger
  readonly #signalTimeoutMs: number
  readonly #signals = new Map<string, RunSignals>()
  /** Cancels that reached this process before the run attached its signals. */
  readonly #pendingCancels = new Set<string>()
  readonly #queuedListeners = new Set<(sessionId: string) => void>()
  /** Signals sent to other owners, waiting for their answer. */
  readonly #answers = new Map<string, (accepted: boolean) => void>()
  readonly #heartbeat: NodeJS.Timeout
  readonly #stopListening: () => void
  #draining = false

  constructor(options: PostgresRunCoordinatorOptions) {
    this.ownerId = options.ownerId
    this.#store = options.store
    this.#bus = options.bus
    this.#channel = options.channel
    this.#leaseMs = options.leaseMs
    this.#log = options.logger
    this.#signalTimeoutMs = options.signalTimeoutMs ?? SIGNAL_TIMEOUT_MS
    this.#stopListening = this.#channel.onMessage((message) => this.#receive(message))
    this.#heartbeat = setInterval(() => void this.#beat(), this.#beatMs)
    this.#heartbeat.unref()
  }

  /** The heartbeat's interval: a third of the lease. */
  get #beatMs(): number {
    return Math.max(50, Math.floor(this.#leaseMs / 3))
  }

  get #lease(): string {
    return `now() + interval '${this.#leaseMs} milliseconds'`
  }

  async admit(session: SessionRecord, run: RunRecord, onBusy: OnBusy, maxActiveRunsPerTenant: number): Promise<Cancellation> {
    const { cancellation, cancels } = await this.#store.transaction(async (client) => {
      // The session row's lock orders the admissions of one session (busy check, FIFO). The check
      // is a statement of its own: its snapshot is taken once the lock is held, so it sees the
      // run an admission that held the lock before it committed.
      const locked = await client.query('SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE', [session.id])
      // Deleted since the route found it: gone, as the SQLite store says of a run inserted for it
      // (the caller answers SESSION_NOT_FOUND); a plain Error here was a 500.
      if (locked.rowCount === 0) throw new SessionGoneError(session.id)
      const { rows: [state] } = await client.query<Row>(
        `SELECT id AS busy_with FROM runs WHERE session_id = $1 AND ${UNFINISHED} ORDER BY owner IS NULL, pos LIMIT 1`, [session.id])
      const busy = state !== undefined
      if (busy && onBusy === 'reject') {
        throw new AgentError('SESSION_BUSY', `Session ${session.id} has an active run; send onBusy "enqueue" or "interrupt", or wait`, {
          activeRunId: state.busy_with
        })
      }
      const insert = insertRun(run, session.tenant)
      await client.query(insert.sql, insert.params)
      // Then the tenant's count, this run included, taken once the tenant's lock is held: each
      // admission on every process counts every one that held the lock before it and committed,
      // and holds the lock only for this count and its commit. (Counted without the lock below
      // half the limit, as before, a burst of admissions to many sessions all counted the same
      // few runs and all got in: twelve at once at a limit of 4, through three processes.)
      const { rows: [count] } = await client.query<Row>('SELECT agentd_tenant_runs($1) AS runs', [session.tenant])
      const others = Number(count?.runs ?? 1) - 1
      if (others >= maxActiveRunsPerTenant) {
        throw new AgentError('LIMIT_EXCEEDED', `This tenant has ${others} runs queued or running, the most it may (AGENTD_MAX_ACTIVE_RUNS_PER_TENANT)`, {
          limit: 'activeRunsPerTenant', max: maxActiveRunsPerTenant
        })
      }
      const result: Cancellation = { dequeued: [], signalled: [] }
      if (!busy || onBusy !== 'interrupt') return { cancellation: result, cancels: [] as Row[] }
      // Every run accepted before this one and not ended yet gives way: the claimed ones stop, and
      // the queued ones end as cancelled when their turn comes, so runs are still answered in the
      // order they were accepted and the newest interrupt wins.
      return this.#cancelIn(client, session.id, { except: run.id })
    })
    this.#sendCancels(cancels)
    this.#announce(session.id)
    return cancellation
  }

  async claimNext(sessionId: string): Promise<ClaimedRun | null> {
    if (this.#draining) return null
    // One statement: processes claiming at once all aim at the session's first queued run, so its
    // row lock lets one win; the others find it owned when they get the row, and claim nothing.
    // A run a later message interrupted while it was queued keeps its flag: it ends, unstarted, as
    // cancelled once attached (#execute), its turn being now.
    const { rows } = await this.#store.pool.query<Row>(`UPDATE runs SET owner = $2, lease_until = ${this.#lease}
      WHERE id = (SELECT id FROM runs WHERE session_id = $1 AND status = 'queued' AND owner IS NULL ORDER BY pos LIMIT 1)
        AND owner IS NULL
        AND NOT EXISTS (SELECT 1 FROM runs a WHERE a.session_id = $1 AND a.${UNFINISHED} AND (a.owner IS NOT NULL OR a.status <> 'queued'))
      RETURNING *`, [sessionId, this.ownerId])
    const row = rows[0]
    if (!row) return null
    if (row.cancel_requested === true) this.#pendingCancels.add(String(row.id))
    // Only stored runs are queued here: a claimed run is never ahead of its row.
    return { run: toRun(row), stored: null }
  }

  attach(runId: string, signals: RunSignals): () => void {
    this.#signals.set(runId, signals)
    if (this.#pendingCancels.delete(runId)) signals.cancel()
    return () => {
      if (this.#signals.get(runId) === signals) this.#signals.delete(runId)
    }
  }

  async release(run: RunRecord): Promise<void> {
    this.#pendingCancels.delete(run.id)
    // Ended or not, the run loses its owner. One whose end could not be stored stays unfinished:
    // started, it is an orphan that the recovery ends; never started (still queued), it is claimed again.
    await this.#store.pool.query('UPDATE runs SET owner = NULL, lease_until = NULL WHERE id = $1 AND owner = $2', [run.id, this.ownerId])
    if (this.#draining) await this.#channel.send({ type: 'queued', from: this.ownerId, sessionId: run.sessionId })
    else this.#announce(run.sessionId)
  }

  async cancel(sessionId: string, options: { onlyFirst?: boolean } = {}): Promise<Cancellation> {
    const { cancellation, cancels } = await this.#store.transaction(async (client) => {
      const locked = await client.query('SELECT id FROM sessions WHERE id = $1 FOR UPDATE', [sessionId])
      if (locked.rowCount === 0) return { cancellation: { dequeued: [], signalled: [] }, cancels: [] as Row[] }
      return this.#cancelIn(client, sessionId, { onlyFirst: options.onlyFirst ?? false })
    })
    this.#sendCancels(cancels)
    return cancellation
  }

  /**
   * Inside a transaction holding the session row: flags the claimed runs for cancellation (their
   * owners are told after commit) and takes queued ones out of the queue for the caller, who
   * records them as cancelled. With onlyFirst, the active run, or else the first queued one.
   * With `except` (an admission that interrupts, `except` being its run), the queued ones are
   * flagged where they are instead: each ends as cancelled when its turn comes (claimNext), after
   * the runs accepted before it. Recorded at once, a queued run's `done` came before that of the
   * active run, still stopping.
   */
  async #cancelIn(client: pg.PoolClient, sessionId: string, options: { onlyFirst?: boolean; except?: string }): Promise<{ cancellation: Cancellation; cancels: Row[] }> {
    const except = options.except ?? ''
    // A run taken out of the queue to be recorded as cancelled is claimed and flagged already: not signalled again.
    const { rows: cancels } = await client.query<Row>(`UPDATE runs SET cancel_requested = true
      WHERE session_id = $1 AND id <> $2 AND ${CLAIMED} AND NOT (status = 'queued' AND cancel_requested) RETURNING id, owner`, [sessionId, except])
    const cancellation: Cancellation = { dequeued: [], signalled: cancels.map((row) => String(row.id)) }
    if (options.onlyFirst && cancels.length > 0) return { cancellation, cancels }
    if (options.except !== undefined) {
      const { rows: flagged } = await client.query<Row>(`UPDATE runs SET cancel_requested = true
        WHERE session_id = $1 AND id <> $2 AND status = 'queued' AND owner IS NULL RETURNING id`, [sessionId, except])
      cancellation.signalled.push(...flagged.map((row) => String(row.id)))
      return { cancellation, cancels }
    }
    const { rows } = await client.query<Row>(`UPDATE runs SET owner = $3, lease_until = ${this.#lease}, cancel_requested = true
      WHERE id IN (SELECT id FROM runs WHERE session_id = $1 AND id <> $2 AND status = 'queued' AND owner IS NULL ORDER BY pos LIMIT $4)
      RETURNING *`, [sessionId, except, this.ownerId, options.onlyFirst ? 1 : null])
    cancellation.dequeued = rows.sort((a, b) => Number(a.pos) - Number(b.pos)).map(toRun)
    return { cancellation, cancels }
  }

  #sendCancels(cancels: Row[]): void {
    for (const row of cancels) {
      const runId = String(row.id)
      if (row.owner === this.ownerId) this.#cancelLocal(runId)
      else {
        this.#channel.send({ type: 'cancel', from: this.ownerId, to: String(row.owner), runId })
          .catch((err: unknown) => this.#log.warn({ err, runId }, 'could not tell the owner of a run to cancel it; its heartbeat will'))
      }
    }
  }

  async deliver(sessionId: string, callId: string, signal: CallSignal, endedWithThis?: (call: ToolCallRecord) => Promise<boolean>): Promise<void> {
    const what = signal.kind === 'approval' ? 'an approval' : 'a client tool result'
    const notAwaiting = () => new AgentError('NOT_AWAITING', `Call ${callId} is not waiting for ${what}`, { callId })
    const { rows } = await this.#store.pool.query<Row>(
      `SELECT r.id, r.owner FROM runs r JOIN tool_calls c ON c.session_id = r.session_id AND c.run_id = r.id
       WHERE r.session_id = $1 AND c.id = $2 AND r.${CLAIMED}`, [sessionId, callId])
    const run = rows[0]
    if (!run) throw notAwaiting()
    const runId = String(run.id)
    if (run.owner === this.ownerId) {
      if (!this.#signals.get(runId)?.signal(callId, signal)) throw notAwaiting()
      return
    }
    const id = newId('req')
    const answered = new Promise<boolean | 'timeout'>((resolve) => {
      const timer = setTimeout(() => {
        this.#answers.delete(id)
        resolve('timeout')
      }, this.#signalTimeoutMs)
      this.#answers.set(id, (accepted) => {
        clearTimeout(timer)
        this.#answers.delete(id)
        resolve(accepted)
      })
    })
    await this.#channel.send({ type: 'signal', from: this.ownerId, to: String(run.owner), id, runId, callId, signal })
    const accepted = await answered
    if (accepted === 'timeout') {
      // The owner may have taken the signal and its answer been lost on the way back: an approval
      // it took is stored as the call's permission_decided. Without this look, the request was a
      // 503 though the decision was applied, and its retry a 409.
      if (signal.kind === 'approval') {
        const decided = await this.#storedDecision(sessionId, runId, callId)
        if (decided === signal.decision.decision) return
        if (decided !== null) throw notAwaiting()
      }
      // A client's result it took is stored as the call's end: the same outcome answers as if
      // delivered, another is a 409. The owner stores it only once the run has made the result the
      // call's outcome: awaitClient commits the run's status change first, and postToolUse hooks
      // run before the outcome commits. In between the call still reads 'executing' and nothing
      // tells whose result the owner took, so that stays the 503 (retryable); should the owner
      // answer the retry itself, it holds no waiting call by then and says NOT_AWAITING.
      if (signal.kind === 'toolResult' && endedWithThis) {
        const call = await this.#store.getToolCall(sessionId, callId)
        if (call && call.runId === runId && ENDED_CALL.has(call.state)) {
          if (await endedWithThis(call)) return
          throw notAwaiting()
        }
      }
      throw new AgentError('UNAVAILABLE', `The process running call ${callId} did not answer; retry once its run has been taken over`, { callId })
    }
    if (!accepted) throw notAwaiting()
  }

  /** The decision stored for a call of the run ('allow' or 'deny'), or null when none is. */
  async #storedDecision(sessionId: string, runId: string, callId: string): Promise<string | null> {
    const events = await this.#store.listEvents(sessionId, { after: 0, types: ['permission_decided'] })
    const decided = events.findLast((event) => event.runId === runId && (event.data as { callId?: unknown }).callId === callId)
    return decided ? String((decided.data as { decision?: unknown }).decision) : null
  }

  async orphans(): Promise<Orphan[]> {
    // Runs whose owner stopped renewing its lease, and started runs released without an end.
    // SKIP LOCKED and the owner set here hand each to one process only. A queued run keeps its
    // cancel flag (a later message interrupted it): queued again, it still ends as cancelled in
    // its turn (claimNext) instead of running as if nobody had interrupted it.
    const { rows } = await this.#store.pool.query<Row>(`UPDATE runs SET owner = $1, lease_until = ${this.#lease},
        cancel_requested = (status = 'queued' AND cancel_requested)
      WHERE id IN (SELECT id FROM runs WHERE ${UNFINISHED}
        AND ((owner IS NOT NULL AND lease_until < now()) OR (owner IS NULL AND status <> 'queued'))
        ORDER BY pos FOR UPDATE SKIP LOCKED)
      RETURNING *`, [this.ownerId])
    // Every one of them had an owner: a queued run nobody claimed is not an orphan here (claimNext takes it).
    return rows.sort((a, b) => Number(a.pos) - Number(b.pos)).map((row) => ({ run: toRun(row), claimed: true }))
  }

  async requeue(session: SessionRecord, run: RunRecord): Promise<void> {
    // Its cancel flag stays (orphans): an interrupted run goes back in line only to end there.
    await this.#store.pool.query('UPDATE runs SET owner = NULL, lease_until = NULL WHERE id = $1 AND owner = $2', [run.id, this.ownerId])
    this.#announce(session.id)
  }

  async drainQueued(): Promise<RunRecord[]> {
    // Queued runs stay in the database for the other processes (or the next start) to run.
    this.#draining = true
    return []
  }

  waitFor(sessionId: string, runId: string, options: { untilPause?: boolean } = {}): Promise<RunRecord | null> {
    return waitForRun(this.#bus, this.#store, sessionId, runId, options.untilPause ?? false)
  }

  onQueued(listener: (sessionId: string) => void): () => void {
    this.#queuedListeners.add(listener)
    return () => this.#queuedListeners.delete(listener)
  }

  async close(): Promise<void> {
    clearInterval(this.#heartbeat)
    this.#stopListening()
    this.#queuedListeners.clear()
    for (const answer of this.#answers.values()) answer(false)
  }

  /**
   * Renews the leases of this process's runs, stops those a cancel was written for (in case its
   * message was lost), and offers this process the queued runs nobody has claimed (a wake-up lost,
   * or its sender died before it could claim).
   */
  async #beat(): Promise<void> {
    const { pool } = this.#store
    try {
      // Only the runs this process is executing: one it took over but could not finish (its
      // recovery failed) lapses again and is taken over again, instead of staying owned forever.
      // SKIP LOCKED: a run whose row a commit holds right now is renewed on the next beat.
      await pool.query(`UPDATE runs SET lease_until = ${this.#lease}
        WHERE id IN (SELECT id FROM runs WHERE owner = $1 AND id = ANY($2::text[]) AND ${UNFINISHED} FOR UPDATE SKIP LOCKED)`,
      [this.ownerId, [...this.#signals.keys()]])
      const { rows: cancelled } = await pool.query<Row>(`SELECT id FROM runs WHERE owner = $1 AND cancel_requested AND ${UNFINISHED}`, [this.ownerId])
      for (const row of cancelled) this.#signals.get(String(row.id))?.cancel()
      if (!this.#draining) {
        // Not a run admitted within the last beat: the process that admitted it claims it at
        // once, and the heartbeat is only the fallback for one whose wake-up was lost. Offered
        // sooner, it raced that claim, and a run accepted by one process could run on another.
        const { rows: queued } = await pool.query<Row>(`SELECT DISTINCT session_id FROM runs WHERE status = 'queued' AND owner IS NULL
          AND created_at::timestamptz < now() - interval '${this.#beatMs} milliseconds' LIMIT 100`)
        for (const row of queued) this.#announce(String(row.session_id))
      }
      await this.#channel.sweep()
    } catch (err) {
      this.#log.warn({ err }, 'run heartbeat failed; leases are renewed on the next one')
    }
  }

  #receive(message: ClusterMessage): void {
    switch (message.type) {
      case 'queued':
        if (message.from !== this.ownerId && !this.#draining) this.#announce(message.sessionId)
        return
      case 'cancel':
        if (message.to === this.ownerId) this.#cancelLocal(message.runId)
        return
      case 'signal': {
        if (message.to !== this.ownerId) return
        // Only coordinators send signals, and always a CallSignal.
        const accepted = this.#signals.get(message.runId)?.signal(message.callId, message.signal as CallSignal) ?? false
        this.#channel.send({ type: 'answer', from: this.ownerId, to: message.from, id: message.id, accepted })
          .catch((err: unknown) => this.#log.warn({ err }, 'could not answer a signal'))
        return
      }
      case 'answer':
        if (message.to === this.ownerId) this.#answers.get(message.id)?.(message.accepted)
        return
      default:
    }
  }

  #cancelLocal(runId: string): void {
    const signals = this.#signals.get(runId)
    if (signals) signals.cancel()
    else this.#pendingCancels.add(runId)
  }

  /** Offers this process the session's next queued run. */
  #announce(sessionId: string): void {
    for (const listener of [...this.#queuedListeners]) listener(sessionId)
  }
}
