import type { Logger } from 'pino'
import { newId } from '../ids.ts'
import type { EventLog } from '../events/event-log.ts'
import type { HookRunner } from '../hooks/hooks.ts'
import type { ModelProvider } from '../model/types.ts'
import type { Tracing } from '../telemetry/tracing.ts'
import { emptyUsage } from '../schemas/common.ts'
import { isSessionGone, type MessageRecord, type RunRecord, type SessionRecord, type Store, type ToolCallRecord } from '../store/store.ts'
import { AgentError } from './agent-error.ts'
import { abandonAfterRestart } from './recovery.ts'
import type { RetryPolicy } from './retry.ts'
import type { ApprovalDecision, CallSignal, ClientToolResult, OnBusy, RunCoordinator } from './run-coordinator.ts'
import { RunContext } from './run-context.ts'
import { endRun } from './run-end.ts'
import { clientOutcome, endedWith } from './tool-call.ts'
import { RunExecution, serviceFailure, ServiceShutdown, type ExecuteTool, type RunDependencies } from './run-execution.ts'
import type { SessionToolSet } from '../tools/tool-set.ts'

export type { OnBusy } from './run-coordinator.ts'

export interface RunManagerOptions {
  store: Store
  events: EventLog
  coordinator: RunCoordinator
  model: ModelProvider
  logger: Logger
  retryPolicy: RetryPolicy
  maxSteps: number
  /** The token budget of a model request when the session sets none. */
  contextTokens: number
  /** Runs (queued or executing) one tenant may have at once. */
  maxActiveRunsPerTenant: number
  /** The tools of a session, resolved from its stored selection. */
  resolveTools(session: SessionRecord): Promise<SessionToolSet>
  /** Builds the executor of server-side tools for one session. */
  toolExecutor(session: SessionRecord, tools: SessionToolSet, requestId: string): Promise<ExecuteTool>
  /** The operator's hooks: tool hooks inside each run, runEnd after it. */
  hooks?: HookRunner | undefined
  /** Spans per run, model call and tool call (a no-op when tracing is off). */
  tracing: Tracing
}

/** A call of a run waiting on a person (approval) or a client (tool result). */
interface Waiting {
  callId: string
  kind: CallSignal['kind']
  resolve(signal: CallSignal): void
}

/** A run this process executes. */
interface Execution {
  controller: AbortController
  waiting: Waiting | null
  finished: Promise<RunRecord>
}

/**
 * Executes runs: takes what the RunCoordinator says this process should run, drives each
 * through a RunExecution with its tools, and turns control signals (cancel, an approval, a
 * client result) into aborts and answers for the call that waits. Routes call it; it never
 * touches HTTP, and it keeps no state that another process would need.
 */
export class RunManager {
  readonly #options: RunManagerOptions
  readonly #executions = new Map<string, Execution>()
  /** For a run's end (RunDependencies.othersRunning): whether runs besides it execute here. */
  readonly #othersRunning = (): boolean => this.#executions.size > 1
  /**
   * The session a run was submitted with, while its submission is under way. A run that starts
   * straight away (its session was free) starts from it instead of reading the session again;
   * submit() forgets it once admission is over, so a run that waited in the queue, or that a peer
   * claims, reads its session when it starts (and finds it gone if it was deleted meanwhile).
   */
  readonly #submitted = new Map<string, SessionRecord>()
  readonly #stopListening: () => void
  #markDrained: () => void = () => undefined
  /**
   * Settles when drain() starts, once the queued runs this process must end are ended. From then
   * on a run that is not executing here will not end here (a shared store keeps it queued for
   * another process or the next start, or another process executes it): it is waited for no
   * longer. Such a wait held the drain until the process was killed, its client left without an answer.
   */
  readonly #drained = new Promise<void>((resolve) => (this.#markDrained = resolve))

  constructor(options: RunManagerOptions) {
    this.#options = options
    this.#stopListening = options.coordinator.onQueued((sessionId) => this.#pump(sessionId))
  }

  /** Number of runs this process is executing. */
  get activeCount(): number {
    return this.#executions.size
  }

  /** Accepts a user message as a new run (per onBusy), which starts when its session is free. */
  async submit(input: {
    session: SessionRecord; content: string; onBusy: OnBusy; requestId: string; traceparent?: string | undefined
  }): Promise<{ message: MessageRecord; run: RunRecord }> {
    const { session } = input
    const createdAt = new Date().toISOString()
    const message: MessageRecord = {
      id: newId('msg'), sessionId: session.id, runId: null, role: 'user', content: input.content, createdAt
    }
    const record: RunRecord = {
      id: newId('run'), sessionId: session.id, status: 'queued', requestId: input.requestId, steps: 0, usage: emptyUsage(),
      error: null, messageId: message.id, input: input.content, createdAt, startedAt: null, endedAt: null,
      // Stored with the run: whichever process starts it continues the request's trace after the 202.
      ...(input.traceparent ? { traceparent: input.traceparent } : {})
    }
    message.runId = record.id
    this.#submitted.set(record.id, session)
    const cancellation = await this.#options.coordinator.admit(session, { ...record }, input.onBusy, this.#options.maxActiveRunsPerTenant)
      .catch((err: unknown) => {
        // Deleted between the route's lookup and the run's insert: the session is gone, not broken.
        if (isSessionGone(err)) throw new AgentError('SESSION_NOT_FOUND', `No session ${session.id}`)
        throw err
      })
      .finally(() => this.#submitted.delete(record.id))
    for (const queued of cancellation.dequeued) await this.#endQueued(queued)
    return { message, run: record }
  }

  /**
   * Resolves with the run once it has ended (or paused, with untilPause); null when it is gone.
   * Once this process drains, a run not executing here resolves as stored, ended or not (#drained).
   */
  waitFor(sessionId: string, runId: string, options: { untilPause?: boolean } = {}): Promise<RunRecord | null> {
    const waiting = this.#options.coordinator.waitFor(sessionId, runId, options)
    // A run executing here also ends here: that answers even when the store could not record its end.
    const local = this.#executions.get(runId)
    if (local) return Promise.race([waiting, local.finished])
    const drained = this.#drained.then(() => this.#executions.get(runId)?.finished ?? this.#options.store.getRun(sessionId, runId))
    return Promise.race([waiting, drained])
  }

  /**
   * Runs whose owner is gone (a restart, or a peer that died): one that never started is queued
   * again (with run_recovered when a process had claimed it); one that had started is ended as
   * failed with run_recovered and its open calls sealed.
   */
  async recover(): Promise<{ requeued: number; failed: number }> {
    const { store, events, logger, coordinator } = this.#options
    let requeued = 0
    let failed = 0
    for (const { run, claimed } of await coordinator.orphans()) {
      const session = await store.getSessionById(run.sessionId)
      if (!session) continue
      if (run.status === 'queued') {
        // A run still waiting its turn was not active (SPEC 8): nothing of it is recovered, it just goes on waiting.
        if (claimed) await events.append({
          sessionId: session.id, runId: run.id, channel: 'monitor', type: 'run_recovered', at: new Date().toISOString(),
          requestId: run.requestId, data: { runId: run.id, previousStatus: 'queued', sealedCalls: [] }
        })
        await coordinator.requeue(session, run)
        requeued++
        continue
      }
      const { ended, run: abandoned } = await abandonAfterRestart(session, run, this.#dependencies())
      // Its session may start its next run now (a peer that died left it claimed), unless its
      // end could not be stored either: then the next recovery tries again.
      await coordinator.release(run, ended)
      if (!ended) continue
      failed++
      // Its execution, which would have told the runEnd hooks, is gone: they hear of it from here.
      await this.#runEnded(abandoned)
    }
    if (requeued + failed > 0) logger.warn({ requeued, failed }, 'recovered runs left unfinished by their owner')
    return { requeued, failed }
  }

  /** Cancels the session's active (or else first queued) run; resolves with it once it has stopped. */
  async interrupt(sessionId: string): Promise<RunRecord> {
    const { dequeued, signalled } = await this.#options.coordinator.cancel(sessionId, { onlyFirst: true })
    const [queued] = dequeued
    if (queued) return this.#endQueued(queued)
    const [runId] = signalled
    if (!runId) throw new AgentError('NO_ACTIVE_RUN', `Session ${sessionId} has no active run`)
    const run = await this.waitFor(sessionId, runId)
    if (!run) throw new AgentError('NO_ACTIVE_RUN', `Session ${sessionId} has no active run`)
    return run
  }

  /** Cancels everything the session has running or queued (session deletion); resolves once all have stopped. */
  async cancelSession(sessionId: string): Promise<void> {
    const { dequeued, signalled } = await this.#options.coordinator.cancel(sessionId)
    for (const queued of dequeued) await this.#endQueued(queued)
    await Promise.all(signalled.map((runId) => this.waitFor(sessionId, runId)))
  }

  /** Hands an approval decision to the run waiting on that call (on whichever process runs it). */
  async decide(sessionId: string, callId: string, decision: ApprovalDecision): Promise<void> {
    await this.#options.coordinator.deliver(sessionId, callId, { kind: 'approval', decision })
  }

  /** Hands the result of a client-side tool call to the run waiting on it. */
  async submitToolResult(sessionId: string, callId: string, result: ClientToolResult): Promise<void> {
    // Whether the call's stored end is this result's outcome, made as the run makes it (clientOutcome).
    const endedWithThis = async (call: ToolCallRecord) => {
      const session = await this.#options.store.getSessionById(sessionId)
      const tool = session ? (await this.#options.resolveTools(session)).get(call.name) : undefined
      return tool?.kind === 'client' && endedWith(call, clientOutcome(tool, result))
    }
    await this.#options.coordinator.deliver(sessionId, callId, { kind: 'toolResult', result }, endedWithThis)
  }

  /** Ends the queued runs this process must, gives its running ones up to graceMs, then interrupts them. */
  async drain(graceMs: number): Promise<void> {
    for (const queued of await this.#options.coordinator.drainQueued()) await this.#endQueued(queued)
    this.#markDrained()
    const all = () => [...this.#executions.values()].map((execution) => execution.finished)
    const timer = new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), graceMs).unref())
    if ((await Promise.race([Promise.all(all()), timer])) === 'timeout') {
      for (const execution of this.#executions.values()) execution.controller.abort(new ServiceShutdown())
      await Promise.all(all())
    }
    this.#stopListening()
  }

  #dependencies(): RunDependencies {
    const { store, events, model, logger, retryPolicy, maxSteps, hooks, contextTokens } = this.#options
    return { store, events, model, logger, retryPolicy, maxSteps, hooks, contextTokens, othersRunning: this.#othersRunning }
  }

  /** Records a run that never started as cancelled (done: interrupted). */
  async #endQueued(run: RunRecord, tenant?: string): Promise<RunRecord> {
    const endedAt = new Date().toISOString()
    const ended: RunRecord = { ...run, status: 'cancelled', endedAt }
    try {
      await this.#options.events.commit(run.sessionId, [
        { type: 'run', id: run.id, patch: { status: 'cancelled', endedAt } },
        {
          type: 'event',
          event: {
            sessionId: run.sessionId, runId: run.id, channel: 'progress', type: 'done', at: endedAt, requestId: run.requestId,
            data: { step: 0, reason: 'interrupted', runId: run.id }
          }
        }
      ])
    } catch (err) {
      // A deleted session leaves nothing to record.
      if (!isSessionGone(err)) this.#log(run).error({ err }, 'could not record a cancelled queued run')
    }
    await this.#runEnded(ended, tenant)
    return ended
  }

  /** A logger for lines about a run, bound as the run's own lines are (RunContext): its request ID on each (SPEC 6). */
  #log(run: RunRecord): Logger {
    return this.#options.logger.child({ reqId: run.requestId, sessionId: run.sessionId, runId: run.id })
  }

  /** Tells the operator's runEnd hooks (in the background); a run of a deleted session has no one to tell. */
  async #runEnded(run: RunRecord, tenant?: string): Promise<void> {
    const { hooks, store } = this.#options
    if (!hooks) return
    const owner = tenant ?? (await store.getSessionById(run.sessionId).catch(() => null))?.tenant
    if (owner !== undefined) hooks.runEnd(run, owner)
  }

  /** Starts the session's next run if this process may claim it. */
  #pump(sessionId: string): void {
    void this.#options.coordinator.claimNext(sessionId).then((claimed) => {
      if (claimed) this.#start(claimed.run, claimed.stored)
    }, (err: unknown) => this.#options.logger.error({ err, sessionId }, 'could not claim the next run'))
  }

  #start(record: RunRecord, stored: Promise<unknown> | null): void {
    const { coordinator } = this.#options
    let settle: (run: RunRecord) => void = () => {}
    const execution: Execution = {
      controller: new AbortController(),
      waiting: null,
      finished: new Promise<RunRecord>((resolve) => (settle = resolve))
    }
    this.#executions.set(record.id, execution)
    const detach = coordinator.attach(record.id, {
      cancel: () => execution.controller.abort(),
      signal: (callId, signal) => {
        const waiting = execution.waiting
        if (!waiting || waiting.callId !== callId || waiting.kind !== signal.kind) return false
        waiting.resolve(signal)
        return true
      }
    })
    // A run that started while its admission is committed stops at once if that fails (ClaimedRun.stored).
    const accepted = stored ? stored.then(() => true, () => false) : null
    void accepted?.then((ok) => {
      if (!ok) execution.controller.abort()
    })
    void this.#execute(record, execution, accepted).then(async ({ run, tenant, ended }) => {
      detach()
      this.#executions.delete(record.id)
      await coordinator.release(record, ended).catch((err: unknown) => this.#log(record).error({ err }, 'could not release a run'))
      settle(run)
      // A run that never started told the hooks when it was recorded (#endQueued). One whose end
      // the store did not record is not over yet: the recovery ends it and tells them (recover()),
      // so telling them here too would make two deliveries of one run, the first with an end
      // nobody can read back.
      if (tenant !== null && ended) await this.#runEnded(run, tenant)
    })
  }

  /**
   * Runs the claimed run to its end; with the tenant it ran for (null when its session is gone)
   * and whether its end is in the store (`ended`: false when the store failed to record it).
   * `accepted`: the admission's outcome, for a run claimed before it was stored (null when it was).
   */
  async #execute(
    record: RunRecord, execution: Execution, accepted: Promise<boolean> | null
  ): Promise<{ run: RunRecord; tenant: string | null; ended: boolean }> {
    const { store } = this.#options
    const signal = execution.controller.signal
    // Cancelled while it waited for its turn (a later message interrupted): it ends without starting.
    if (signal.aborted) return { run: await this.#endQueued(record), tenant: null, ended: true }
    let tenant: string | null = null
    // Taken before the first await: a run its admission started has its session at hand.
    const submitted = this.#submitted.get(record.id)
    try {
      const session = submitted ?? (await store.getSessionById(record.sessionId))
      // Deleted while it was queued: nothing to run and nothing to record.
      if (!session) return { run: { ...record, status: 'cancelled', endedAt: new Date().toISOString() }, tenant: null, ended: true }
      tenant = session.tenant
      const trace = this.#options.tracing.startRun(record, session, record.traceparent)
      const { tools, executeTool } = await this.#toolsOf(session, record).catch((err: unknown) => {
        trace.end({ ...record, status: 'failed' })
        throw err
      })
      const run = new RunExecution(session, record, this.#dependencies(), {
        tools,
        executeTool,
        waitForApproval: async (call, s) => {
          const answer = await this.#wait(execution, 'approval', call, s)
          return (answer as Extract<CallSignal, { kind: 'approval' }>).decision
        },
        waitForToolResult: async (call, s) => {
          const answer = await this.#wait(execution, 'toolResult', call, s)
          return (answer as Extract<CallSignal, { kind: 'toolResult' }>).result
        }
      }, signal, trace, accepted)
      const ended = await trace.within(() => run.execute())
      trace.end(ended)
      // A run that was never accepted (its admission failed) tells no hook that it ended.
      return { run: ended, tenant: (await accepted) === false ? null : tenant, ended: run.endRecorded }
    } catch (err) {
      const failed: RunRecord = { ...record, status: 'failed', endedAt: new Date().toISOString() }
      if ((await accepted) === false) return { run: failed, tenant: null, ended: true }
      // It never started (its session or its tools could not be had): it ends as any failed run
      // does, so that its streams end and its session goes on. When the session cannot even be
      // read, the store is what fails: the recovery takes the run up again (RunCoordinator.release).
      this.#log(record).error({ err }, 'run could not start')
      const session = submitted ?? (await store.getSessionById(record.sessionId).catch(() => null))
      if (!session) return { run: failed, tenant, ended: false }
      const ctx = new RunContext(session, { ...record }, this.#dependencies(), signal)
      const ended = await endRun(ctx, 'failed', 'failed', serviceFailure(err))
      return { run: ctx.run, tenant: session.tenant, ended }
    }
  }

  async #toolsOf(session: SessionRecord, record: RunRecord): Promise<{ tools: SessionToolSet; executeTool: ExecuteTool }> {
    const tools = await this.#options.resolveTools(session)
    return { tools, executeTool: await this.#options.toolExecutor(session, tools, record.requestId) }
  }

  #wait(execution: Execution, kind: CallSignal['kind'], call: ToolCallRecord, signal: AbortSignal): Promise<CallSignal> {
    return new Promise<CallSignal>((resolve, reject) => {
      const onAbort = () => {
        execution.waiting = null
        reject(signal.reason ?? new Error('interrupted'))
      }
      if (signal.aborted) return onAbort()
      signal.addEventListener('abort', onAbort, { once: true })
      execution.waiting = {
        callId: call.id,
        kind,
        resolve: (value) => {
          execution.waiting = null
          signal.removeEventListener('abort', onAbort)
          resolve(value)
        }
      }
    })
  }
}
