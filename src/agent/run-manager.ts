import type { Logger } from 'pino'
import { newId } from '../ids.ts'
import type { EventLog } from '../events/event-log.ts'
import type { ModelProvider } from '../model/types.ts'
import type { Tracing } from '../telemetry/tracing.ts'
import { emptyUsage } from '../schemas/common.ts'
import type { MessageRecord, RunRecord, SessionRecord, Store, ToolCallRecord } from '../store/store.ts'
import { AgentError } from './agent-error.ts'
import type { RetryPolicy } from './retry.ts'
import { RunExecution, type ApprovalDecision, type ClientToolResult, type ExecuteTool } from './run-execution.ts'
import type { SessionToolSet } from './tool-set.ts'

export type OnBusy = 'reject' | 'enqueue' | 'interrupt'

export interface RunManagerOptions {
  store: Store
  events: EventLog
  model: ModelProvider
  logger: Logger
  retryPolicy: RetryPolicy
  maxSteps: number
  /** Runs (queued or executing) one tenant may have at once. */
  maxActiveRunsPerTenant: number
  /** Spans per run, model call and tool call (NO_TRACING when off). */
  tracing: Tracing
  /** The tools of a session, resolved from its stored selection. */
  resolveTools(session: SessionRecord): Promise<SessionToolSet>
  /** Builds the executor of server-side tools for one session. */
  toolExecutor(session: SessionRecord, tools: SessionToolSet, requestId: string): Promise<ExecuteTool>
}

interface Waiter<T> {
  callId: string
  resolve(value: T): void
}

/** A run in memory: queued or executing, with what it is waiting for. */
interface LiveRun {
  record: RunRecord
  session: SessionRecord
  controller: AbortController
  /** Settles when the run has ended (any final status). */
  finished: Promise<RunRecord>
  settle(run: RunRecord): void
  approval: Waiter<ApprovalDecision> | null
  toolResult: Waiter<ClientToolResult> | null
  /** The W3C traceparent of the request that submitted it: the run's span continues it after the 202. */
  traceparent: string | undefined
}

interface SessionRuns {
  active: LiveRun | null
  queue: LiveRun[]
  /** Submissions past the busy check whose run is still being stored: they count as busy. */
  reserved: number
}

/**
 * Owns every run of this process: one active run per session, a FIFO of queued ones, and the
 * approvals and client tool results they wait for. Routes call it; it never touches HTTP.
 */
export class RunManager {
  readonly #options: RunManagerOptions
  readonly #sessions = new Map<string, SessionRuns>()
  readonly #byId = new Map<string, LiveRun>()

  constructor(options: RunManagerOptions) {
    this.#options = options
  }

  /** Number of runs that are queued or executing. */
  get activeCount(): number {
    return this.#byId.size
  }

  /** Stores a user message as a new run and starts it (or queues it, per onBusy). */
  async submit(input: { session: SessionRecord; content: string; onBusy: OnBusy; requestId: string; traceparent?: string | undefined }): Promise<{ message: MessageRecord; run: RunRecord }> {
    const { session } = input
    const runs = this.#runsOf(session.id)
    const busy = runs.active !== null || runs.queue.length > 0 || runs.reserved > 0
    if (busy && input.onBusy === 'reject') {
      throw new AgentError('SESSION_BUSY', `Session ${session.id} has an active run; send onBusy "enqueue" or "interrupt", or wait`, {
        activeRunId: runs.active?.record.id ?? runs.queue[0]?.record.id
      })
    }
    const tenantRuns = [...this.#byId.values()].filter((live) => live.session.tenant === session.tenant).length
    if (tenantRuns >= this.#options.maxActiveRunsPerTenant) {
      throw new AgentError('LIMIT_EXCEEDED', `This tenant has ${tenantRuns} runs queued or running, the most it may (AGENTD_MAX_ACTIVE_RUNS_PER_TENANT)`, {
        limit: 'activeRunsPerTenant', max: this.#options.maxActiveRunsPerTenant
      })
    }
    const createdAt = new Date().toISOString()
    const message: MessageRecord = {
      id: newId('msg'), sessionId: session.id, runId: null, role: 'user', content: input.content, createdAt
    }
    const record: RunRecord = {
      id: newId('run'), sessionId: session.id, status: 'queued', requestId: input.requestId, steps: 0, usage: emptyUsage(),
      error: null, messageId: message.id, input: input.content, createdAt, startedAt: null, endedAt: null
    }
    message.runId = record.id
    // Hold the session's place while the run is stored, so that neither a concurrent submit
    // nor the end of the active run (which forgets an idle session) slips in meanwhile.
    runs.reserved++
    try {
      await this.#options.store.createRun(record)
    } catch (err) {
      runs.reserved--
      this.#pump(session.id)
      throw err
    }
    runs.reserved--
    const live = this.#track(session, record, input.traceparent)
    if (busy && input.onBusy === 'interrupt') {
      runs.queue.unshift(live)
      if (runs.active) runs.active.controller.abort()
    } else {
      runs.queue.push(live)
    }
    this.#pump(session.id)
    return { message, run: { ...record } }
  }

  /** Resolves with the run once it has ended. */
  async waitFor(runId: string): Promise<RunRecord | null> {
    const live = this.#byId.get(runId)
    return live ? live.finished : null
  }

  /**
   * After a restart: every run the previous process left unfinished is either queued again (it
   * never started) or ended as failed with a run_recovered event and its open calls sealed.
   */
  async recover(): Promise<{ requeued: number; failed: number }> {
    const { store, events, model, logger, retryPolicy, maxSteps } = this.#options
    let requeued = 0
    let failed = 0
    for (const run of await store.listUnfinishedRuns()) {
      const session = await store.getSessionById(run.sessionId)
      if (!session) continue
      if (run.status === 'queued') {
        await events.append({
          sessionId: session.id, runId: run.id, channel: 'monitor', type: 'run_recovered', at: new Date().toISOString(),
          requestId: run.requestId, data: { runId: run.id, previousStatus: 'queued', sealedCalls: [] }
        })
        this.#runsOf(session.id).queue.push(this.#track(session, run))
        this.#pump(session.id)
        requeued++
        continue
      }
      const execution = RunExecution.forRecovery(session, run, { store, events, model, retryPolicy, logger, maxSteps })
      await execution.abandonAfterRestart()
      failed++
    }
    if (requeued + failed > 0) logger.warn({ requeued, failed }, 'recovered runs left unfinished by the previous process')
    return { requeued, failed }
  }

  /** Cancels the active run of the session; resolves with it once it has stopped. */
  async interrupt(sessionId: string): Promise<RunRecord> {
    const runs = this.#sessions.get(sessionId)
    const live = runs?.active ?? runs?.queue[0]
    if (!runs || !live) throw new AgentError('NO_ACTIVE_RUN', `Session ${sessionId} has no active run`)
    if (runs.active === live) {
      live.controller.abort()
      return live.finished
    }
    return this.#cancelQueued(runs, live)
  }

  /** Cancels everything the session has running or queued (session deletion, shutdown). */
  async cancelSession(sessionId: string): Promise<void> {
    const runs = this.#sessions.get(sessionId)
    if (!runs) return
    for (const queued of [...runs.queue]) await this.#cancelQueued(runs, queued)
    if (runs.active) {
      runs.active.controller.abort()
      await runs.active.finished
    }
  }

  /** Records an approval decision for a call waiting on one. */
  decide(sessionId: string, callId: string, decision: ApprovalDecision): void {
    const waiting = this.#sessions.get(sessionId)?.active?.approval
    if (!waiting || waiting.callId !== callId) {
      throw new AgentError('NOT_AWAITING', `Call ${callId} is not waiting for an approval`, { callId })
    }
    waiting.resolve(decision)
  }

  /** Delivers the result of a client-side tool call the run is waiting on. */
  submitToolResult(sessionId: string, callId: string, result: ClientToolResult): void {
    const waiting = this.#sessions.get(sessionId)?.active?.toolResult
    if (!waiting || waiting.callId !== callId) {
      throw new AgentError('NOT_AWAITING', `Call ${callId} is not waiting for a client tool result`, { callId })
    }
    waiting.resolve(result)
  }

  /** Gives active runs up to graceMs to end, then interrupts them; resolves when all have stopped. */
  async drain(graceMs: number): Promise<void> {
    for (const runs of this.#sessions.values()) {
      for (const queued of [...runs.queue]) await this.#cancelQueued(runs, queued)
    }
    const all = () => [...this.#byId.values()].map((live) => live.finished)
    const timer = new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), graceMs).unref())
    if ((await Promise.race([Promise.all(all()), timer])) === 'timeout') {
      for (const live of this.#byId.values()) live.controller.abort()
      await Promise.all(all())
    }
  }

  #runsOf(sessionId: string): SessionRuns {
    let runs = this.#sessions.get(sessionId)
    if (!runs) {
      runs = { active: null, queue: [], reserved: 0 }
      this.#sessions.set(sessionId, runs)
    }
    return runs
  }

  #track(session: SessionRecord, record: RunRecord, traceparent?: string): LiveRun {
    let settle: (run: RunRecord) => void = () => {}
    const finished = new Promise<RunRecord>((resolve) => (settle = resolve))
    const live: LiveRun = { record, session, controller: new AbortController(), finished, settle, approval: null, toolResult: null, traceparent }
    this.#byId.set(record.id, live)
    return live
  }

  async #cancelQueued(runs: SessionRuns, live: LiveRun): Promise<RunRecord> {
    runs.queue.splice(runs.queue.indexOf(live), 1)
    const endedAt = new Date().toISOString()
    const run = { ...live.record, status: 'cancelled' as const, endedAt }
    try {
      await this.#options.store.updateRun(run.id, { status: 'cancelled', endedAt })
      await this.#options.events.append({
        sessionId: run.sessionId, runId: run.id, channel: 'progress', type: 'done', at: endedAt, requestId: run.requestId,
        data: { step: 0, reason: 'interrupted', runId: run.id }
      })
    } catch (err) {
      this.#options.logger.error({ err, runId: run.id }, 'could not record a cancelled queued run')
    }
    this.#byId.delete(run.id)
    live.settle(run)
    return run
  }

  /** Starts the next queued run of the session when none is active. */
  #pump(sessionId: string): void {
    const runs = this.#sessions.get(sessionId)
    if (!runs || runs.active) return
    const next = runs.queue.shift()
    if (!next) {
      if (runs.reserved === 0) this.#sessions.delete(sessionId)
      return
    }
    runs.active = next
    void this.#execute(next).finally(() => {
      runs.active = null
      this.#byId.delete(next.record.id)
      this.#pump(sessionId)
    })
  }

  async #execute(live: LiveRun): Promise<void> {
    const { store, events, model, logger, retryPolicy, maxSteps } = this.#options
    const signal = live.controller.signal
    let run: RunRecord = live.record
    const trace = this.#options.tracing.startRun(live.record, live.session, live.traceparent)
    try {
      const session = (await store.getSession(live.session.tenant, live.session.id)) ?? live.session
      const tools = await this.#options.resolveTools(session)
      const executeTool = await this.#options.toolExecutor(session, tools, live.record.requestId)
      const execution = new RunExecution(session, live.record, { store, events, model, retryPolicy, logger, maxSteps, trace }, {
        tools,
        executeTool,
        waitForApproval: (call, s) => this.#wait(live, 'approval', call, s),
        waitForToolResult: (call, s) => this.#wait(live, 'toolResult', call, s)
      }, signal)
      run = await trace.within(() => execution.execute())
    } catch (err) {
      logger.error({ err, runId: live.record.id }, 'run could not start')
      run = { ...live.record, status: 'failed', endedAt: new Date().toISOString() }
    } finally {
      trace.end(run)
      live.settle({ ...run })
    }
  }

  #wait<K extends 'approval' | 'toolResult'>(
    live: LiveRun,
    kind: K,
    call: ToolCallRecord,
    signal: AbortSignal
  ): Promise<K extends 'approval' ? ApprovalDecision : ClientToolResult> {
    type Value = K extends 'approval' ? ApprovalDecision : ClientToolResult
    return new Promise<Value>((resolve, reject) => {
      const onAbort = () => {
        live[kind] = null
        reject(signal.reason ?? new Error('interrupted'))
      }
      if (signal.aborted) return onAbort()
      signal.addEventListener('abort', onAbort, { once: true })
      const waiter: Waiter<Value> = {
        callId: call.id,
        resolve: (value) => {
          live[kind] = null
          signal.removeEventListener('abort', onAbort)
          resolve(value)
        }
      }
      ;(live as unknown as Record<K, Waiter<Value> | null>)[kind] = waiter
    })
  }
}
