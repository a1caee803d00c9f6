import type { Logger } from 'pino'
import type { EventLog } from '../events/event-log.ts'
import type { HookRunner } from '../hooks/hooks.ts'
import type { ModelProvider } from '../model/types.ts'
import type { ClassifiedError } from '../schemas/common.ts'
import type { EventChannel, EventRecord, RunRecord, RunStatus, SessionRecord, SessionStatus, Store, StoreWrite } from '../store/store.ts'
import { NO_RUN_TRACE, type RunTrace } from '../telemetry/tracing.ts'
import type { RetryPolicy } from './retry.ts'
import { isFinal } from './wait-for-run.ts'

/** What every run needs from the service. */
export interface RunDependencies {
  store: Store
  events: EventLog
  model: ModelProvider
  retryPolicy: RetryPolicy
  logger: Logger
  /** Server upper bounds; the session's limits may lower them. */
  maxSteps: number
  /** The operator's preToolUse and postToolUse hooks (SPEC 15). */
  hooks?: HookRunner | undefined
  /** The token budget of a model request when the session sets none (SPEC 12). */
  contextTokens: number
  /**
   * True while other runs execute in this process. A run that ends alone has its answer's text
   * committed before its end, so that the text is not held back by the end's writes; with others
   * running, the two share a group commit, which costs less under load (RunExecution.execute).
   */
  othersRunning?: () => boolean
}

export type RunPhase = 'model' | 'tool' | 'system'

/** A run's write when its admission failed (ClaimedRun.stored): the run was never accepted and writes nothing. */
export class RunNotAccepted extends Error {
  constructor() {
    super('the run was not accepted: its admission could not be committed')
  }
}

/** Raised inside the loop to end the run as failed with a classified error. */
export class RunFailure extends Error {
  readonly error: ClassifiedError
  readonly phase: RunPhase
  /** A model call that failed after its answer had begun to stream: asking again would show a second answer. */
  readonly afterOutput: boolean
  constructor(error: ClassifiedError, phase: RunPhase, afterOutput = false) {
    super(error.message)
    this.error = error
    this.phase = phase
    this.afterOutput = afterOutput
  }
}

let nowMs = -1
let nowIso = ''
/** The time as an ISO string; every event carries one, so it is formatted once per millisecond. */
export const now = (): string => {
  const ms = Date.now()
  if (ms !== nowMs) {
    nowMs = ms
    nowIso = new Date(ms).toISOString()
  }
  return nowIso
}

/** Milliseconds since `startedAt` (a Date.now() time), never negative: a start stored by a peer whose clock runs ahead, or a clock set back, would make it so. */
export const msSince = (startedAt: number): number => Math.max(0, Date.now() - startedAt)

const nothing = (): undefined => undefined
/** What #commitSoon returns when nothing waits: one settled promise, not one made per commit. */
const SETTLED: Promise<void> = Promise.resolve()

/**
 * One run's view of the service, shared by its phases (model turn, tool call, recovery): the
 * session and the run record, and how the run's writes are committed. Writes that belong
 * together are built as StoreWrites and committed as one unit of work (`commit`).
 */
export class RunContext {
  readonly session: SessionRecord
  readonly run: RunRecord
  readonly deps: RunDependencies
  readonly signal: AbortSignal
  readonly log: Logger
  /** This run's span, under which model and tool calls get theirs (a no-op without tracing). */
  readonly trace: RunTrace
  /** The step the run is in (1-based; 0 before the first model call). */
  step = 0
  /** The first failure of a unit handed over without waiting (commitSoon, emitSoon); the next awaited commit throws it. */
  #unsentError: unknown = null
  /** The newest commitSoon unit not yet settled (either way): once it is, so is every earlier one. */
  #inFlight: Promise<unknown> | null = null
  /** Events emitted without waiting in this tick, committed together at its end (or before the next commit). */
  #soon: StoreWrite[] | null = null
  /** Writes kept back to open the run's next unit of work (commitWithNext). */
  #held: StoreWrite[] | null = null
  /**
   * While the run's admission is being committed (it was claimed before: ClaimedRun.stored),
   * whether that commit succeeded: the run's units are handed over only after it, in order, and
   * none if it failed (the run was never accepted). Null once it has succeeded, or from the start.
   */
  #gate: Promise<boolean> | null

  /** `accepted`: the admission's outcome when the run started before it was stored; omitted when it was stored. */
  constructor(
    session: SessionRecord, run: RunRecord, deps: RunDependencies, signal: AbortSignal, trace: RunTrace = NO_RUN_TRACE,
    accepted: Promise<boolean> | null = null
  ) {
    this.session = session
    this.run = run
    this.deps = deps
    this.signal = signal
    this.trace = trace
    this.log = deps.logger.child({ reqId: run.requestId, sessionId: session.id, runId: run.id })
    this.#gate = accepted
    void accepted?.then((ok) => {
      if (ok) this.#gate = null
    })
  }

  /** An event of this run, as a write of a unit of work. */
  event(channel: EventChannel, type: string, data: Record<string, unknown>): StoreWrite {
    return {
      type: 'event',
      event: { sessionId: this.session.id, runId: this.run.id, channel, type, at: now(), requestId: this.run.requestId, data }
    }
  }

  /**
   * Commits the writes as one unit of work, then publishes their events; resolves once committed.
   * A unit comes after the run's commitSoon units have landed: should one of them have failed,
   * this one is not committed and that failure is thrown (once; the run's end then commits).
   */
  async commit(writes: StoreWrite[]): Promise<EventRecord[]> {
    void this.#commitSoon()
    if (this.#inFlight) await this.#inFlight
    this.#throwUnsent()
    const events = await this.#toLog(writes)
    this.#throwUnsent()
    return events
  }

  /** Hands a unit to the event log, once the run is accepted (#gate); throws RunNotAccepted if it never is. */
  #toLog(writes: StoreWrite[]): Promise<EventRecord[]> {
    const held = this.#held
    if (held !== null) {
      this.#held = null
      writes = [...held, ...writes]
    }
    const gate = this.#gate
    if (!gate) return this.deps.events.commit(this.session.id, writes)
    return gate.then((accepted) => {
      if (!accepted) throw new RunNotAccepted()
      return this.deps.events.commit(this.session.id, writes)
    })
  }

  #throwUnsent(): void {
    if (this.#unsentError === null) return
    const err = this.#unsentError
    this.#unsentError = null
    throw err
  }

  /**
   * Hands a unit of work to the event log without waiting for its commit: the run goes on (a model
   * call goes out) while the store works. It is committed and published in order all the same, and
   * a failure surfaces at the next awaited commit. Only for units that nothing irreversible waits
   * for: before a tool runs, its start is committed with `commit` (or, for a tool that only reads,
   * kept for its answer's unit: commitWithNext).
   */
  commitSoon(writes: StoreWrite[]): void {
    void this.#commitSoon()
    const unit = this.#handOver(writes)
    this.#inFlight = unit
    void unit.then(() => {
      if (this.#inFlight === unit) this.#inFlight = null
    })
  }

  /**
   * Keeps writes back to open the run's next unit of work, committed with it as one: a read-only
   * tool's start goes with its answer, so the tool runs at once and the step takes no commit of
   * its own, while no answer is ever stored without the call that asked for it. Nothing of them
   * is stored or published before that unit; every way a unit is made (commit, commitSoon, emitSoon,
   * settle) takes them first. An earlier unit's known failure is thrown now, as commit would.
   */
  commitWithNext(writes: StoreWrite[]): void {
    this.#throwUnsent()
    this.#held = this.#held === null ? writes : [...this.#held, ...writes]
  }

  /** Resolves once every unit handed over or kept back has been committed (or has failed): the run's own writes can then be read back. */
  async settle(): Promise<void> {
    void this.#commitSoon()
    if (this.#held !== null) this.commitSoon([])
    await this.#inFlight
  }

  /** Emits one event of this run; resolves once it (and every event emitted before it) is committed. */
  async emit(channel: EventChannel, type: string, data: Record<string, unknown>): Promise<void> {
    await this.commit([this.event(channel, type, data)])
  }

  /**
   * Emits without waiting for the commit, for the stream of text deltas: the loop reads the next
   * chunk while this one is stored. It is still committed before it is published, in order; a
   * failure surfaces at the next awaited commit (at the latest, the end of the text). The deltas
   * of one tick (a socket read of the model's stream holds many) go to the store as one unit of
   * work: they are stored and published in the same turn either way, at a fraction of the cost.
   */
  emitSoon(channel: EventChannel, type: string, data: Record<string, unknown>): void {
    if (this.#soon) {
      this.#soon.push(this.event(channel, type, data))
      return
    }
    this.#soon = [this.event(channel, type, data)]
    // A tick runs after the microtasks that read the rest of the socket's chunks, before any I/O.
    process.nextTick(this.#commitSoonTick)
  }

  /**
   * Hands the events emitted without waiting to the event log now, and resolves once they are
   * committed (or have failed: the next awaited commit throws it): the text then goes out in a
   * group commit of its own, not behind writes made after it.
   */
  async commitEmitted(): Promise<void> {
    await this.#commitSoon()
  }

  /**
   * Hands the events emitted without waiting to the event log, ahead of any later write of the
   * run; the promise settles once they are committed or have failed (never rejects), at once
   * when there were none.
   */
  #commitSoon(): Promise<void> {
    const writes = this.#soon
    if (!writes) return SETTLED
    this.#soon = null
    return this.#handOver(writes)
  }

  /** emitSoon's tick: one function per run, not one per delta (a text chunk is the hot path). */
  readonly #commitSoonTick = (): void => {
    void this.#commitSoon()
  }

  /** Hands a unit to the event log without waiting; its failure is kept for the next awaited commit. */
  #handOver(writes: StoreWrite[]): Promise<void> {
    return this.#toLog(writes).then(nothing, this.#keepUnsent)
  }

  readonly #keepUnsent = (err: unknown): void => {
    this.#unsentError ??= err
  }

  /** Moves the run (and its session) to a new status: the writes, with a state_changed event; none when unchanged. */
  statusChange(status: RunStatus): StoreWrite[] {
    const from = this.run.status
    if (from === status) return []
    this.run.status = status
    const patch: Partial<RunRecord> = { status }
    if (status === 'running' && !this.run.startedAt) patch.startedAt = this.run.startedAt = now()
    if (isFinal(status)) patch.endedAt = this.run.endedAt = now()
    return [
      { type: 'run', id: this.run.id, patch },
      { type: 'session', id: this.session.id, patch: { status: sessionStatusOf(status) } },
      this.event('monitor', 'state_changed', { from, to: status })
    ]
  }

  /** Moves the run to a new status, committed on its own. */
  async setStatus(status: RunStatus): Promise<void> {
    const writes = this.statusChange(status)
    if (writes.length > 0) await this.commit(writes)
  }
}

/** The session's status while its active run has this status. */
function sessionStatusOf(status: RunStatus): SessionStatus {
  switch (status) {
    case 'running':
    case 'awaiting_approval':
    case 'awaiting_tool_result':
      return status
    default:
      return 'idle'
  }
}
