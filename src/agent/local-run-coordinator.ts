import type { EventBus } from '../events/event-bus.ts'
import { newId } from '../ids.ts'
import type { RunRecord, SessionRecord, Store } from '../store/store.ts'
import { AgentError } from './agent-error.ts'
import type { CallSignal, Cancellation, ClaimedRun, OnBusy, Orphan, RunCoordinator, RunSignals } from './run-coordinator.ts'
import { isFinal, waitForRun } from './wait-for-run.ts'

/**
 * A run in a session's queue; `stored` once its row is committed. Only then may it start, unless
 * it came to an idle session: such a run may start at once, with `storing` (its row's commit) as
 * the gate of its writes.
 */
interface QueueEntry {
  run: RunRecord
  tenant: string
  stored: boolean
  storing: Promise<unknown> | null
}

interface SessionRuns {
  /** The claimed run: executing, or waiting on a person or a client. */
  active: QueueEntry | null
  /** Accepted runs in the order they were accepted. */
  queue: QueueEntry[]
}

/**
 * The in-process RunCoordinator: this process is the only one on its store (the SQLite store
 * holds an exclusive lock on `<file>-lock`), so the queues, the active run of each session and
 * the per-tenant counts live in maps, signals are calls, and every unfinished run found at start
 * is an orphan.
 */
export class LocalRunCoordinator implements RunCoordinator {
  readonly ownerId = newId('req').replace('req_', 'own_')
  readonly #store: Store
  readonly #bus: EventBus
  readonly #sessions = new Map<string, SessionRuns>()
  /** Runs accepted and not yet ended, per tenant (LIMIT_EXCEEDED). */
  readonly #tenantRuns = new Map<string, number>()
  readonly #signals = new Map<string, RunSignals>()
  /** Cancels asked for a claimed run before it attached its signals; delivered when it does. */
  readonly #pendingCancels = new Set<string>()
  readonly #queuedListeners = new Set<(sessionId: string) => void>()
  /** Active runs released without a recorded end (release), by id: the recovery ends them. */
  readonly #unended = new Map<string, RunRecord>()
  #orphansTaken = false
  #draining = false

  readonly #stopWatching: () => void

  constructor(options: { store: Store; bus: EventBus }) {
    this.#store = options.store
    this.#bus = options.bus
    // A run's `done` is committed with its final status: from then on its session is free, so a
    // client that saw `done` may send the next message at once, before the execution unwinds.
    this.#stopWatching = this.#bus.subscribeAll((event) => {
      if (event.type === 'done' && event.runId) this.#free(event.sessionId, event.runId)
    })
  }

  async admit(session: SessionRecord, run: RunRecord, onBusy: OnBusy, maxActiveRunsPerTenant: number): Promise<Cancellation> {
    const runs = this.#runsOf(session.id)
    const busy = runs.active !== null || runs.queue.length > 0
    if (busy && onBusy === 'reject') {
      throw new AgentError('SESSION_BUSY', `Session ${session.id} has an active run; send onBusy "enqueue" or "interrupt", or wait`, {
        activeRunId: runs.active?.run.id ?? runs.queue[0]?.run.id
      })
    }
    const tenantRuns = this.#tenantRuns.get(session.tenant) ?? 0
    if (tenantRuns >= maxActiveRunsPerTenant) {
      throw new AgentError('LIMIT_EXCEEDED', `This tenant has ${tenantRuns} runs queued or running, the most it may (AGENTD_MAX_ACTIVE_RUNS_PER_TENANT)`, {
        limit: 'activeRunsPerTenant', max: maxActiveRunsPerTenant
      })
    }
    // The run takes its place in the queue now, before it is stored: acceptance order is call
    // order, whatever order the store's commits resolve in. A new run has no event to publish,
    // so its row goes straight to the store, not through the event log.
    const storing = this.#store.commit([{ type: 'newRun', run }])
    const entry: QueueEntry = { run, tenant: session.tenant, stored: false, storing: busy ? null : storing }
    runs.queue.push(entry)
    this.#count(session.tenant, +1)
    // A run that comes to an idle session starts now: its first model call goes out while its row
    // is committed (it waits for that commit before any write of its own: ClaimedRun.stored).
    if (!busy) this.#announce(session.id)
    try {
      await storing
    } catch (err) {
      // A run already claimed ends by itself once its gate fails; one still queued leaves the queue.
      this.#remove(session.id, entry)
      throw err
    }
    entry.stored = true
    entry.storing = null
    const cancellation: Cancellation = { dequeued: [], signalled: [] }
    if (busy && onBusy === 'interrupt') {
      // Every run accepted before this one and not ended yet gives way: the active one stops, and
      // the queued ones end as cancelled when their turn comes, so runs are still answered in the
      // order they were accepted and the newest interrupt wins.
      const earlier = runs.queue.slice(0, runs.queue.indexOf(entry)).filter((e) => e.stored).map((e) => e.run.id)
      cancellation.signalled = this.#signalCancel([...(runs.active ? [runs.active.run.id] : []), ...earlier])
    }
    // A busy session's run waits its turn; an idle one's is claimed already, unless draining kept it.
    if (busy || runs.queue.includes(entry)) this.#announce(session.id)
    return cancellation
  }

  async claimNext(sessionId: string): Promise<ClaimedRun | null> {
    const runs = this.#sessions.get(sessionId)
    if (!runs || runs.active || this.#draining) return null
    const next = runs.queue[0]
    if (!next || (!next.stored && !next.storing)) return null
    runs.queue.shift()
    runs.active = next
    return { run: next.run, stored: next.stored ? null : next.storing }
  }

  attach(runId: string, signals: RunSignals): () => void {
    this.#signals.set(runId, signals)
    if (this.#pendingCancels.delete(runId)) signals.cancel()
    return () => {
      if (this.#signals.get(runId) === signals) this.#signals.delete(runId)
    }
  }

  async release(run: RunRecord, ended: boolean): Promise<void> {
    if (ended) {
      this.#unended.delete(run.id)
      this.#free(run.sessionId, run.id)
    } else {
      // The store says it still runs: the recovery ends it, and until then its session (when
      // this process was running it) stays busy.
      this.#unended.set(run.id, run)
    }
  }

  /** The session's active run has ended (idempotent): the next one may start. */
  #free(sessionId: string, runId: string): void {
    const runs = this.#sessions.get(sessionId)
    if (!runs || runs.active?.run.id !== runId) return
    this.#count(runs.active.tenant, -1)
    this.#pendingCancels.delete(runId)
    runs.active = null
    if (runs.queue.length === 0) this.#sessions.delete(sessionId)
    else this.#announce(sessionId)
  }

  async cancel(sessionId: string, options: { onlyFirst?: boolean } = {}): Promise<Cancellation> {
    const runs = this.#sessions.get(sessionId)
    const cancellation: Cancellation = { dequeued: [], signalled: [] }
    if (!runs) return cancellation
    if (runs.active) {
      cancellation.signalled = this.#signalCancel([runs.active.run.id])
      if (options.onlyFirst) return cancellation
    }
    const queued = runs.queue.filter((e) => e.stored).slice(0, options.onlyFirst ? 1 : undefined)
    for (const entry of queued) this.#remove(sessionId, entry)
    cancellation.dequeued = queued.map((e) => e.run)
    return cancellation
  }

  async deliver(sessionId: string, callId: string, signal: CallSignal): Promise<void> {
    const active = this.#sessions.get(sessionId)?.active
    const handler = active ? this.#signals.get(active.run.id) : undefined
    if (!handler?.signal(callId, signal)) {
      const what = signal.kind === 'approval' ? 'an approval' : 'a client tool result'
      throw new AgentError('NOT_AWAITING', `Call ${callId} is not waiting for ${what}`, { callId })
    }
  }

  async orphans(): Promise<Orphan[]> {
    const orphans: Orphan[] = []
    // The store is this process's alone: whatever was unfinished when it opened is orphaned. It
    // records no claims: a run still queued counts as one that was waiting its turn, never
    // started (as on PostgreSQL, where only claimed runs are announced). One whose process died
    // in the instant between claiming it and storing its start is among them: it runs again.
    if (!this.#orphansTaken) {
      for (const run of await this.#store.listUnfinishedRuns()) orphans.push({ run, claimed: run.status !== 'queued' })
      this.#orphansTaken = true
    }
    // Runs of this process whose end the store failed to record, as the store has them now (a
    // read that fails leaves them for the next recovery). Each stays here until it is released ended.
    for (const run of this.#unended.values()) {
      const stored = await this.#store.getRun(run.sessionId, run.id)
      if (stored && !isFinal(stored.status)) orphans.push({ run: stored, claimed: true })
      else await this.release(run, true)
    }
    return orphans
  }

  async requeue(session: SessionRecord, run: RunRecord): Promise<void> {
    const runs = this.#runsOf(session.id)
    if (this.#unended.delete(run.id) && runs.active?.run.id === run.id) {
      // Released without an end before it had started: it is first in line again, counted already.
      runs.active = null
      runs.queue.unshift({ run, tenant: session.tenant, stored: true, storing: null })
    } else {
      runs.queue.push({ run, tenant: session.tenant, stored: true, storing: null })
      this.#count(session.tenant, +1)
    }
    this.#announce(session.id)
  }

  async drainQueued(): Promise<RunRecord[]> {
    this.#draining = true
    const queued: RunRecord[] = []
    for (const [sessionId, runs] of this.#sessions) {
      for (const entry of runs.queue.filter((e) => e.stored)) {
        this.#remove(sessionId, entry)
        queued.push(entry.run)
      }
    }
    return queued
  }

  waitFor(sessionId: string, runId: string, options: { untilPause?: boolean } = {}): Promise<RunRecord | null> {
    return waitForRun(this.#bus, this.#store, sessionId, runId, options.untilPause ?? false)
  }

  onQueued(listener: (sessionId: string) => void): () => void {
    this.#queuedListeners.add(listener)
    return () => this.#queuedListeners.delete(listener)
  }

  async close(): Promise<void> {
    this.#stopWatching()
    this.#queuedListeners.clear()
  }

  #runsOf(sessionId: string): SessionRuns {
    let runs = this.#sessions.get(sessionId)
    if (!runs) {
      runs = { active: null, queue: [] }
      this.#sessions.set(sessionId, runs)
    }
    return runs
  }

  #remove(sessionId: string, entry: QueueEntry): void {
    const runs = this.#sessions.get(sessionId)
    if (!runs) return
    const at = runs.queue.indexOf(entry)
    if (at < 0) return
    runs.queue.splice(at, 1)
    this.#count(entry.tenant, -1)
    if (!runs.active && runs.queue.length === 0) this.#sessions.delete(sessionId)
  }

  #signalCancel(runIds: string[]): string[] {
    for (const id of runIds) {
      const signals = this.#signals.get(id)
      if (signals) signals.cancel()
      else this.#pendingCancels.add(id)
    }
    return runIds
  }

  #count(tenant: string, delta: number): void {
    const next = (this.#tenantRuns.get(tenant) ?? 0) + delta
    if (next > 0) this.#tenantRuns.set(tenant, next)
    else this.#tenantRuns.delete(tenant)
  }

  #announce(sessionId: string): void {
    for (const listener of [...this.#queuedListeners]) listener(sessionId)
  }
}
