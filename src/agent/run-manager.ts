import type { Logger } from 'pino'
import { newId } from '../ids.ts'
import type { EventLog } from '../events/event-log.ts'
import type { ModelProvider } from '../model/types.ts'
import { emptyUsage } from '../schemas/common.ts'
import type { MessageRecord, RunRecord, SessionRecord, Store, ToolCallRecord } from '../store/store.ts'
import { AgentError } from './agent-error.ts'
import { abandonAfterRestart } from './recovery.ts'
import type { RetryPolicy } from './retry.ts'
import type { ApprovalDecision, CallSignal, ClientToolResult, OnBusy, RunCoordinator } from './run-coordinator.ts'
import { RunExecution, type ExecuteTool, type RunDependencies } from './run-execution.ts'
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
  /** Runs (queued or executing) one tenant may have at once. */
  maxActiveRunsPerTenant: number
  /** The tools of a session, resolved from its stored selection. */
  resolveTools(session: SessionRecord): Promise<SessionToolSet>
  /** Builds the executor of server-side tools for one session. */
  toolExecutor(session: SessionRecord, tools: SessionToolSet, requestId: string): Promise<ExecuteTool>
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
  readonly #stopListening: () => void

  constructor(options: RunManagerOptions) {
    this.#options = options
    this.#stopListening = options.coordinator.onQueued((sessionId) => this.#pump(sessionId))
  }

  /** Number of runs this process is executing. */
  get activeCount(): number {
    return this.#executions.size
  }

  /** Accepts a user message as a new run (per onBusy), which starts when its session is free. */
  async submit(input: { session: SessionRecord; content: string; onBusy: OnBusy; requestId: string }): Promise<{ message: MessageRecord; run: RunRecord }> {
    const { session } = input
    const createdAt = new Date().toISOString()
    const message: MessageRecord = {
      id: newId('msg'), sessionId: session.id, runId: null, role: 'user', content: input.content, createdAt
    }
    const record: RunRecord = {
      id: newId('run'), sessionId: session.id, status: 'queued', requestId: input.requestId, steps: 0, usage: emptyUsage(),
      error: null, messageId: message.id, input: input.content, createdAt, startedAt: null, endedAt: null
    }
    message.runId = record.id
    const cancellation = await this.#options.coordinator.admit(session, { ...record }, input.onBusy, this.#options.maxActiveRunsPerTenant)
      .catch(async (err: unknown) => {
        // Deleted between the route's lookup and the run's insert: the session is gone, not broken.
        if (!(err instanceof AgentError) && !(await this.#options.store.getSessionById(session.id).catch(() => null))) {
          throw new AgentError('SESSION_NOT_FOUND', `No session ${session.id}`)
        }
        throw err
      })
    for (const queued of cancellation.dequeued) await this.#endQueued(queued)
    return { message, run: record }
  }

  /** Resolves with the run once it has ended (or paused, with untilPause); null when it is gone. */
  waitFor(sessionId: string, runId: string, options: { untilPause?: boolean } = {}): Promise<RunRecord | null> {
    const waiting = this.#options.coordinator.waitFor(sessionId, runId, options)
    // A run executing here also ends here: that answers even when the store could not record its end.
    const local = this.#executions.get(runId)
    return local ? Promise.race([waiting, local.finished]) : waiting
  }

  /**
   * Runs whose owner is gone (a restart, or a peer that died): one that never started is queued
   * again; one that had started is ended as failed with run_recovered and its open calls sealed.
   */
  async recover(): Promise<{ requeued: number; failed: number }> {
    const { store, events, logger, coordinator } = this.#options
    let requeued = 0
    let failed = 0
    for (const run of await coordinator.orphans()) {
      const session = await store.getSessionById(run.sessionId)
      if (!session) continue
      if (run.status === 'queued') {
        await events.append({
          sessionId: session.id, runId: run.id, channel: 'monitor', type: 'run_recovered', at: new Date().toISOString(),
          requestId: run.requestId, data: { runId: run.id, previousStatus: 'queued', sealedCalls: [] }
        })
        await coordinator.requeue(session, run)
        requeued++
        continue
      }
      await abandonAfterRestart(session, run, this.#dependencies())
      // Its session may start its next run now (a peer that died left it claimed).
      await coordinator.release(run)
      failed++
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
    await this.#options.coordinator.deliver(sessionId, callId, { kind: 'toolResult', result })
  }

  /** Ends the queued runs this process must, gives its running ones up to graceMs, then interrupts them. */
  async drain(graceMs: number): Promise<void> {
    for (const queued of await this.#options.coordinator.drainQueued()) await this.#endQueued(queued)
    const all = () => [...this.#executions.values()].map((execution) => execution.finished)
    const timer = new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), graceMs).unref())
    if ((await Promise.race([Promise.all(all()), timer])) === 'timeout') {
      for (const execution of this.#executions.values()) execution.controller.abort()
      await Promise.all(all())
    }
    this.#stopListening()
  }

  #dependencies(): RunDependencies {
    const { store, events, model, logger, retryPolicy, maxSteps } = this.#options
    return { store, events, model, logger, retryPolicy, maxSteps }
  }

  /** Records a run that never started as cancelled (done: interrupted). */
  async #endQueued(run: RunRecord): Promise<RunRecord> {
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
      // The session may be gone (deleted meanwhile): nothing is left to record.
      if (await this.#options.store.getSessionById(run.sessionId).catch(() => null)) {
        this.#options.logger.error({ err, runId: run.id }, 'could not record a cancelled queued run')
      }
    }
    return ended
  }

  /** Starts the session's next run if this process may claim it. */
  #pump(sessionId: string): void {
    void this.#options.coordinator.claimNext(sessionId).then((run) => {
      if (run) this.#start(run)
    }, (err: unknown) => this.#options.logger.error({ err, sessionId }, 'could not claim the next run'))
  }

  #start(record: RunRecord): void {
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
    void this.#execute(record, execution).then(async (run) => {
      detach()
      this.#executions.delete(record.id)
      await coordinator.release(record).catch((err: unknown) => this.#options.logger.error({ err, runId: record.id }, 'could not release a run'))
      settle(run)
    })
  }

  async #execute(record: RunRecord, execution: Execution): Promise<RunRecord> {
    const { store, logger } = this.#options
    const signal = execution.controller.signal
    try {
      const session = await store.getSessionById(record.sessionId)
      // Deleted while it was queued: nothing to run and nothing to record.
      if (!session) return { ...record, status: 'cancelled', endedAt: new Date().toISOString() }
      const tools = await this.#options.resolveTools(session)
      const executeTool = await this.#options.toolExecutor(session, tools, record.requestId)
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
      }, signal)
      return await run.execute()
    } catch (err) {
      logger.error({ err, runId: record.id }, 'run could not start')
      return { ...record, status: 'failed', endedAt: new Date().toISOString() }
    }
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
