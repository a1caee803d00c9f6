import { newId } from '../ids.ts'
import { addUsage, emptyUsage, type ClassifiedError, type Usage } from '../schemas/common.ts'
import { isSessionGone, type MessageRecord, type MessageToolCall, type RunRecord, type SessionRecord, type StoreWrite } from '../store/store.ts'
import { classified, classifyException } from '../errors/classified.ts'
import { ContextWindow } from './context/context-window.ts'
import { callModel, unfinishedAnswer } from './model-turn.ts'
import { keepReasoning } from './conversation.ts'
import { msSince, now, RunContext, RunFailure, type RunDependencies } from './run-context.ts'
import { closeRun, endRun, type DoneReason } from './run-end.ts'
import type { RunTrace } from '../telemetry/tracing.ts'
import { commitStart, runToolCall, startToolCall, type ToolCallHooks } from './tool-call.ts'
import { takeTurn } from './turn-share.ts'

export type { RunDependencies } from './run-context.ts'
export type { ExecuteTool, ToolCallHooks as RunHooks } from './tool-call.ts'

/**
 * One run of the agent loop: call the model (model-turn.ts), run the tools it asks for
 * (tool-call.ts), feed their results back, and repeat until the model answers without tools,
 * maxSteps is reached, the run is interrupted, or a fatal error ends it. Every message,
 * tool-call state and event is committed, in order, and a tool runs only once its start is
 * committed; the units nothing irreversible waits for (the run's start, a tool's answer) are
 * committed while the run goes on (RunContext.commitSoon), and a failure of theirs fails the run
 * at its next commit, before anything later is stored.
 */
export class RunExecution {
  readonly #ctx: RunContext
  readonly #hooks: ToolCallHooks
  readonly #accepted: Promise<boolean> | null
  #endRecorded = true
  #usage: Usage = emptyUsage()

  /**
   * `accepted`: the outcome of the run's admission when it started before it was stored
   * (ClaimedRun.stored); omitted when it was stored.
   */
  constructor(
    session: SessionRecord, run: RunRecord, deps: RunDependencies, hooks: ToolCallHooks, signal: AbortSignal, trace?: RunTrace,
    accepted: Promise<boolean> | null = null
  ) {
    this.#ctx = new RunContext(session, run, deps, signal, trace, accepted)
    this.#accepted = accepted
    this.#hooks = hooks
  }

  get run(): RunRecord {
    return this.#ctx.run
  }

  /** Once execute() has resolved: whether the run's end is in the store (or there was nothing to record). */
  get endRecorded(): boolean {
    return this.#endRecorded
  }

  /** Runs the loop to its end; never throws. */
  async execute(): Promise<RunRecord> {
    const ctx = this.#ctx
    try {
      // The history is read before the run's first unit is handed over, so that it never holds
      // the message that unit stores, whatever the store's timing.
      const { messages: history, offset } = await ctx.deps.store.listContextMessages(ctx.session.id)
      const message: MessageRecord = {
        id: ctx.run.messageId, sessionId: ctx.session.id, runId: ctx.run.id, role: 'user', content: ctx.run.input, createdAt: now()
      }
      // The first model call goes out while the run's start is committed.
      ctx.commitSoon([...ctx.statusChange('running'), { type: 'message', message }])
      history.push(message)
      const { reason, answer } = await this.#loop(history, offset)
      // Alone, the answer's text is committed (and sent) before the run's end is: the end's writes
      // (the message, the run and session updates, four events) would otherwise delay its frames
      // (README, Decisions: first text 0.94-0.99 of before, e2e 1.00-1.05). With other runs in the
      // process the two share a group commit instead: split there, they cost 4-11 % more CPU a run.
      if (!ctx.deps.othersRunning?.()) await ctx.commitEmitted()
      const failed = reason === 'max_steps'
      await closeRun(ctx, failed ? 'failed' : 'completed', reason, failed ? maxStepsError(this.#maxSteps) : null, 'system', answer)
    } catch (err) {
      if (this.#accepted && !(await this.#accepted)) {
        // Its admission failed, and its client got that error: the run never existed.
        ctx.log.debug('run ended: its admission could not be committed')
        ctx.run.status = 'cancelled'
        ctx.run.endedAt ??= now()
        return ctx.run
      }
      if (isSessionGone(err)) {
        // The session was deleted under the run: nothing is left to record or to tell.
        ctx.log.debug('run ended: its session was deleted')
        ctx.run.status = 'cancelled'
        ctx.run.endedAt ??= now()
        return ctx.run
      }
      if (ctx.signal.aborted) {
        // Stopped by its process's shutdown rather than by a person: the run says so, for whoever
        // waits for it on another process (PostgreSQL) to answer as this one does (503, not kept).
        const error = ctx.signal.reason instanceof ServiceShutdown ? shutdownError() : null
        this.#endRecorded = await endRun(ctx, 'cancelled', 'interrupted', error)
      } else {
        const failure = err instanceof RunFailure ? err : new RunFailure(serviceFailure(err), 'system')
        if (!(err instanceof RunFailure)) ctx.log.error({ err }, 'run failed unexpectedly')
        this.#endRecorded = await endRun(ctx, 'failed', 'failed', failure.error, failure.phase)
      }
    }
    return ctx.run
  }

  get #maxSteps(): number {
    const { session, deps } = this.#ctx
    return Math.min(session.limits.maxSteps ?? deps.maxSteps, deps.maxSteps)
  }

  /**
   * Runs the steps; a final answer comes back as writes (`answer`) for the run's end to commit with it.
   * `history`: the stored messages from `offset` on, those before it being stood for by the newest summary.
   */
  async #loop(history: MessageRecord[], offset: number): Promise<{ reason: DoneReason; answer?: StoreWrite[] }> {
    const ctx = this.#ctx
    const context = new ContextWindow({
      session: ctx.session, defaultTokens: ctx.deps.contextTokens, tools: this.#hooks.tools.definitions, model: ctx.deps.model,
      historyOffset: offset, runId: ctx.run.id, requestId: ctx.run.requestId, trace: ctx.trace, signal: ctx.signal, logger: ctx.log,
      commit: (writes) => ctx.commit(writes),
      event: (channel, type, data) => ctx.event(channel, type, data),
      emit: (channel, type, data) => ctx.emit(channel, type, data),
      onUsage: (usage) => { this.#usage = addUsage(this.#usage, usage) }
    })
    for (let step = 1; step <= this.#maxSteps; step++) {
      // Many runs start in one turn when a group commit settles their admissions together: they
      // take turns (turn-share.ts) so that the runs already streaming are not held up. Later
      // steps do not: under steady load their turns are short anyway, and taking turns there
      // cost batching (CPU per run) for little of the tail.
      const turn = step === 1 ? takeTurn() : undefined
      if (turn) await turn
      const started = Date.now()
      ctx.step = step
      const answer = await callModel(ctx, this.#hooks.tools, step, await context.fit(history, step)).catch(async (err: unknown) => {
        // The provider counts differently than the budget did: compact harder, once, before the run
        // fails; not once an answer has streamed, which a second one would follow.
        if (!(err instanceof RunFailure) || err.error.code !== 'CONTEXT_LENGTH_EXCEEDED' || err.afterOutput) throw err
        return callModel(ctx, this.#hooks.tools, step, await context.fit(history, step, true))
      })
      const usage = answer.usage ?? emptyUsage()
      this.#usage = addUsage(this.#usage, usage)
      ctx.run.steps = step
      ctx.run.usage = this.#usage

      const toolCalls: MessageToolCall[] = answer.toolCalls.map((call) => ({ id: newId('call'), name: call.name, arguments: call.arguments }))
      const assistant: MessageRecord = {
        id: newId('msg'), sessionId: ctx.session.id, runId: ctx.run.id, role: 'assistant',
        content: answer.text.length > 0 ? answer.text : null, createdAt: now()
      }
      if (toolCalls.length > 0) assistant.toolCalls = toolCalls
      if (answer.reasoning) keepReasoning(assistant, answer.reasoning)
      // An answer cut at the output limit or stopped by a content filter goes on as it came, with a warning.
      const unfinished = unfinishedAnswer(answer)
      // Arguments cut at the output limit are refused to the model as cut, not as its own mistake.
      const cut = answer.finishReason === 'length'
      // A step's result is one unit of work: its progress, its usage, the model's answer and the
      // start of its first tool call (the others start as their turn comes).
      const first = toolCalls[0] ? startToolCall(ctx, this.#hooks, step, toolCalls[0], cut) : null
      const result: StoreWrite[] = [
        { type: 'run', id: ctx.run.id, patch: { steps: step, usage: this.#usage } },
        { type: 'usage', sessionId: ctx.session.id, usage },
        ctx.event('monitor', 'token_usage', { ...usage }),
        { type: 'message', message: assistant },
        ...(unfinished ? [ctx.event('monitor', 'error', { severity: 'warn', phase: 'model', message: unfinished.message, detail: unfinished })] : []),
        ...(first?.writes ?? [])
      ]
      const maxTokens = ctx.session.limits.maxTokens
      const overTokens = maxTokens !== undefined && this.#usage.totalTokens > maxTokens
      if (toolCalls.length === 0 && !overTokens) {
        // The final answer ends the run: it is committed with the run's end, one unit of work.
        history.push(assistant)
        return { reason: 'completed', answer: [...result, ctx.event('monitor', 'step_complete', { step, durationMs: msSince(started), usage })] }
      }
      if (first) await commitStart(ctx, first, result)
      else await ctx.commit(result)
      history.push(assistant)

      for (const call of toolCalls) {
        const start = first?.call === call ? first : startToolCall(ctx, this.#hooks, step, call, cut)
        if (start !== first) await commitStart(ctx, start)
        history.push(await runToolCall(ctx, this.#hooks, start))
      }
      ctx.emitSoon('monitor', 'step_complete', { step, durationMs: msSince(started), usage })
      if (overTokens) throw new RunFailure(maxTokensError(maxTokens, this.#usage.totalTokens), 'system')
    }
    return { reason: 'max_steps' }
  }
}

/**
 * The run's error when the service itself failed (a store write, a bug): classified like any
 * exception, but its message stays in the logs (with the request ID), never in what clients
 * read: a store's error text can hold SQL and file paths.
 */
export function serviceFailure(err: unknown): ClassifiedError {
  const error = classifyException(err, 'system', { fatal: true })
  return { ...error, message: 'The service failed while running this run (details are in its logs under the request ID); the run was ended' }
}

/** Why a drain aborts the runs still going when its grace period has passed (RunManager.drain). */
export class ServiceShutdown extends Error {
  constructor() {
    super('the service is shutting down')
    this.name = 'ServiceShutdown'
  }
}

function shutdownError(): ClassifiedError {
  return classified({
    errorType: 'aborted', code: 'SERVICE_SHUTDOWN', fatal: true, retryable: true,
    message: 'The process running this run shut down (its grace period, AGENTD_SHUTDOWN_GRACE_MS, passed) and cancelled it',
    recommendations: ['Send the message again; the conversation holds everything committed before the stop.']
  })
}

function maxStepsError(maxSteps: number): ClassifiedError {
  return classified({
    errorType: 'logical', code: 'MAX_STEPS_EXCEEDED', fatal: true, retryable: false,
    message: `The run reached its limit of ${maxSteps} steps before the model finished`,
    recommendations: ['Send a follow-up message to continue, or raise limits.maxSteps for the session (up to AGENTD_MAX_STEPS).']
  })
}

function maxTokensError(maxTokens: number, used: number): ClassifiedError {
  return classified({
    errorType: 'logical', code: 'MAX_TOKENS_EXCEEDED', fatal: true, retryable: false,
    message: `The run used ${used} tokens, over its limit of ${maxTokens}`,
    recommendations: ['Raise limits.maxTokens for the session, or fork it from an earlier event to shorten the conversation.']
  })
}
