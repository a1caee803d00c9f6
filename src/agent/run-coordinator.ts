import type { RunRecord, SessionRecord, ToolCallRecord } from '../store/store.ts'

export type OnBusy = 'reject' | 'enqueue' | 'interrupt'

export interface ApprovalDecision {
  decision: 'allow' | 'deny'
  note: string | null
}

export type ClientToolResult = { output: unknown } | { error: string }

/** What reaches a run that waits on a person or a client for one of its calls. */
export type CallSignal = { kind: 'approval'; decision: ApprovalDecision } | { kind: 'toolResult'; result: ClientToolResult }

/** How a run this process executes receives control signals, wherever they were sent from. */
export interface RunSignals {
  /** Someone asked for the run to be cancelled. */
  cancel(): void
  /** A decision or a result for one of its calls; false when the run waits on no such call. */
  signal(callId: string, signal: CallSignal): boolean
}

/** A run claimed to execute here. */
export interface ClaimedRun {
  run: RunRecord
  /**
   * Null when the run is stored. Otherwise it was claimed while its admission is committed (an
   * idle session's run starts at once, its first model call going out meanwhile): this settles
   * with that commit, and the run writes nothing before it has. Should it fail, the run was never
   * accepted (its client got the error): it ends without a trace, no event, no hook.
   */
  stored: Promise<unknown> | null
}

/** A run left unfinished by an owner that is gone, as orphans() hands it over. */
export interface Orphan {
  run: RunRecord
  /**
   * A process had claimed it: it was active (SPEC 8), and the recovery announces it with
   * run_recovered. False for a run that was still waiting in its queue (found queued at a restart):
   * it never started, and it takes its place in the queue again without a word.
   */
  claimed: boolean
}

/** Runs the coordinator took out of a session's queue (they never started) and runs it asked to stop. */
export interface Cancellation {
  /** Queued runs now owned by the caller, which records them as cancelled. */
  dequeued: RunRecord[]
  /** Runs asked to stop: a running one ends as cancelled by itself, a queued one when its turn comes (in order). */
  signalled: string[]
}

/**
 * Who runs what (STYLE 13): one active run per session across every process, the order runs
 * were accepted in, ownership of a run by one process, and the signals that must reach that
 * owner — cancel, an approval decision, a client tool result — from whichever process got the
 * request. Waiting for a run to end or pause works from anywhere too.
 *
 * `LocalRunCoordinator` is the in-process implementation (one process owns the store, so every
 * unfinished run at start is an orphan). A shared implementation keeps queue and ownership in
 * the database with leases and carries signals between processes.
 */
export interface RunCoordinator {
  /** This process's owner id, as it appears on the runs it claims. */
  readonly ownerId: string
  /**
   * Accepts a stored-to-be run for the session under its busy policy and its tenant's limit, and
   * stores it as queued. Throws SESSION_BUSY ('reject' while busy) or LIMIT_EXCEEDED. Runs are
   * answered in the order they were accepted; with 'interrupt' every earlier run of the session
   * that has not ended is cancelled (the result says which).
   */
  admit(session: SessionRecord, run: RunRecord, onBusy: OnBusy, maxActiveRunsPerTenant: number): Promise<Cancellation>
  /** Claims the session's next queued run for this process when none of the session's runs is active. */
  claimNext(sessionId: string): Promise<ClaimedRun | null>
  /** Registers the signal handlers of a claimed run; returns the detach. */
  attach(runId: string, signals: RunSignals): () => void
  /**
   * A claimed run has stopped executing here. `ended`: its end is in the store, and the session may
   * start its next run. Otherwise (the store failed to record the end) the run stays unfinished and
   * its session busy, and `orphans()` offers it to the recovery, which ends it (or queues it again,
   * when it never started) once the store answers.
   */
  release(run: RunRecord, ended: boolean): Promise<void>
  /** Cancels the session's runs (all of them, or the first `limit` in order): queued ones are dequeued, running ones signalled. */
  cancel(sessionId: string, options?: { onlyFirst?: boolean }): Promise<Cancellation>
  /**
   * Hands a decision or a client result to the run waiting on that call. Throws NOT_AWAITING when
   * none does. `endedWithThis` tells, for a client result, whether a call that no longer waits was
   * ended by this result (the session's tools make the outcome): when the run's owner in another
   * process took the signal but its answer was lost, the stored call answers instead.
   */
  deliver(sessionId: string, callId: string, signal: CallSignal, endedWithThis?: (call: ToolCallRecord) => Promise<boolean>): Promise<void>
  /** Runs left unfinished by owners that are gone, oldest first; each is handed over to the caller once. */
  orphans(): Promise<Orphan[]>
  /** Puts an orphaned run that never started back in its session's queue (in the order it was accepted). */
  requeue(session: SessionRecord, run: RunRecord): Promise<void>
  /** Shutting down: stop claiming, and take the queued runs this process must end itself (a peer would run them). */
  drainQueued(): Promise<RunRecord[]>
  /** Resolves with the run once it has ended (or paused, with untilPause), from any process; null when it is gone. */
  waitFor(sessionId: string, runId: string, options?: { untilPause?: boolean }): Promise<RunRecord | null>
  /** Calls the listener when a session has a queued run that may be claimed (here or by a peer). */
  onQueued(listener: (sessionId: string) => void): () => void
  /** Stops the coordinator's timers and connections. */
  close(): Promise<void>
}
