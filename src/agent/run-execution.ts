import type { Logger } from 'pino'
import { newId } from '../ids.ts'
import type { EventLog } from '../events/event-log.ts'
import { classifyModelError } from '../model/model-errors.ts'
import { ModelError, type ModelProvider } from '../model/types.ts'
import { addUsage, emptyUsage, type ClassifiedError, type Usage } from '../schemas/common.ts'
import type {
  EventChannel, EventRecord, MessageRecord, MessageToolCall, RunRecord, RunStatus, SessionRecord, SessionStatus, Store, ToolCallRecord
} from '../store/store.ts'
import { NO_RUN_TRACE, type RunTrace } from '../telemetry/tracing.ts'
import { classified, classifyException, deniedByUser, toModelToolResult, toolInterrupted, toolNotFound, validationFailure } from './classify.ts'
import { toChatMessages } from './conversation.ts'
import { retryDelayMs, shouldRetry, sleep, type RetryPolicy } from './retry.ts'
import type { SessionToolSet } from './tool-set.ts'

/** How a tool call that the service runs is executed (the isolation runtime). */
export type ExecuteTool = (
  call: ToolCallRecord,
  signal: AbortSignal,
  /** A tool's custom progress event (ToolContext.emit), published as `tool:<type>`. */
  emit: (type: string, data: Record<string, unknown>) => Promise<unknown>
) => Promise<{ ok: true; result: unknown } | { ok: false; error: ClassifiedError }>

export interface ApprovalDecision {
  decision: 'allow' | 'deny'
  note: string | null
}

export type ClientToolResult = { output: unknown } | { error: string }

export interface RunDependencies {
  store: Store
  events: EventLog
  model: ModelProvider
  retryPolicy: RetryPolicy
  logger: Logger
  /** Server upper bounds; the session's limits may lower them. */
  maxSteps: number
  /** This run's span, under which model and tool calls get theirs; none for a recovered run. */
  trace?: RunTrace
}

/** What the run manager gives one run: its tools and how to wait for people and clients. */
export interface RunHooks {
  tools: SessionToolSet
  executeTool: ExecuteTool
  waitForApproval(call: ToolCallRecord, signal: AbortSignal): Promise<ApprovalDecision>
  waitForToolResult(call: ToolCallRecord, signal: AbortSignal): Promise<ClientToolResult>
}

type DoneReason = 'completed' | 'interrupted' | 'failed' | 'max_steps'

/** Raised inside the loop to end the run as failed with a classified error. */
class RunFailure extends Error {
  readonly error: ClassifiedError
  readonly phase: 'model' | 'tool' | 'system'
  constructor(error: ClassifiedError, phase: 'model' | 'tool' | 'system') {
    super(error.message)
    this.error = error
    this.phase = phase
  }
}

const FINAL: ReadonlySet<RunStatus> = new Set(['completed', 'failed', 'cancelled'])
const now = () => new Date().toISOString()

/**
 * One run of the agent loop: call the model, stream its text as events, run the tools it
 * asks for, feed their results back, and repeat until the model answers without tools,
 * maxSteps is reached, the run is interrupted, or a fatal error ends it. Every message,
 * tool-call state and event is committed before the next thing happens.
 */
export class RunExecution {
  readonly run: RunRecord
  readonly #session: SessionRecord
  readonly #deps: RunDependencies
  readonly #hooks: RunHooks
  readonly #signal: AbortSignal
  readonly #log: Logger
  readonly #trace: RunTrace
  #steps = 0
  #usage: Usage = emptyUsage()

  constructor(session: SessionRecord, run: RunRecord, deps: RunDependencies, hooks: RunHooks, signal: AbortSignal) {
    this.#session = session
    this.run = run
    this.#deps = deps
    this.#hooks = hooks
    this.#signal = signal
    this.#log = deps.logger.child({ reqId: run.requestId, sessionId: session.id, runId: run.id })
    this.#trace = deps.trace ?? NO_RUN_TRACE
  }

  /** An execution that only ends a run left over by a previous process (see abandonAfterRestart). */
  static forRecovery(session: SessionRecord, run: RunRecord, deps: RunDependencies): RunExecution {
    const noTools: RunHooks = {
      tools: { names: [], definitions: [], get: () => undefined },
      executeTool: async () => { throw new Error('a recovered run executes no tools') },
      waitForApproval: async () => { throw new Error('a recovered run waits for nothing') },
      waitForToolResult: async () => { throw new Error('a recovered run waits for nothing') }
    }
    return new RunExecution(session, run, deps, noTools, new AbortController().signal)
  }

  /** The first failure of an event emitted without waiting (emitSoon); the next awaited emit throws it. */
  #unsentError: unknown = null

  /** Emits an event of this run; resolves once it (and every event emitted before it) is committed. */
  async emit(channel: EventChannel, type: string, data: Record<string, unknown>): Promise<EventRecord> {
    const record = await this.#deps.events.append({
      sessionId: this.#session.id, runId: this.run.id, channel, type, at: now(), requestId: this.run.requestId, data
    })
    if (this.#unsentError !== null) {
      const err = this.#unsentError
      this.#unsentError = null
      throw err
    }
    return record
  }

  /**
   * Emits without waiting for the commit, for the stream of text deltas: the loop reads the next
   * chunk while this one is stored. It is still committed before it is published, in order; a
   * failure surfaces at the next awaited emit (at the latest, the end of the text).
   */
  #emitSoon(channel: EventChannel, type: string, data: Record<string, unknown>): void {
    this.emit(channel, type, data).catch((err: unknown) => {
      this.#unsentError ??= err
    })
  }

  /** Moves the run (and its session) to a new status, with a state_changed event. */
  async setStatus(status: RunStatus): Promise<void> {
    const from = this.run.status
    if (from === status) return
    this.run.status = status
    const patch: Partial<RunRecord> = { status }
    if (status === 'running' && !this.run.startedAt) patch.startedAt = this.run.startedAt = now()
    if (FINAL.has(status)) patch.endedAt = this.run.endedAt = now()
    // Queued together, these commit together: one group commit instead of three.
    await Promise.all([
      this.#deps.store.updateRun(this.run.id, patch),
      this.#deps.store.updateSession(this.#session.id, { status: sessionStatusOf(status) }),
      this.emit('monitor', 'state_changed', { from, to: status })
    ])
  }

  /** Runs the loop to its end; never throws. */
  async execute(): Promise<RunRecord> {
    let reason: DoneReason = 'completed'
    try {
      await Promise.all([
        this.setStatus('running'),
        this.#deps.store.addMessage({
          id: this.run.messageId, sessionId: this.#session.id, runId: this.run.id, role: 'user', content: this.run.input, createdAt: now()
        })
      ])
      reason = await this.#loop()
      await this.#close(reason === 'max_steps' ? 'failed' : 'completed', reason, reason === 'max_steps' ? maxStepsError(this.#maxSteps) : null, 'system')
    } catch (err) {
      if (this.#signal.aborted) {
        await this.#end('cancelled', 'interrupted', null)
      } else {
        const failure = err instanceof RunFailure ? err : new RunFailure(classifyException(err, 'system', { fatal: true }), 'system')
        if (!(err instanceof RunFailure)) this.#log.error({ err }, 'run failed unexpectedly')
        await this.#end('failed', 'failed', failure.error, failure.phase)
      }
    }
    return this.run
  }

  get #maxSteps(): number {
    return Math.min(this.#session.limits.maxSteps ?? this.#deps.maxSteps, this.#deps.maxSteps)
  }

  async #loop(): Promise<DoneReason> {
    const { store } = this.#deps
    const history = await store.listMessages(this.#session.id)
    const messages = toChatMessages(this.#session.instructions, history)
    for (let step = 1; step <= this.#maxSteps; step++) {
      const started = Date.now()
      this.#steps = step
      const answer = await this.#callModel(step, messages)
      const usage = answer.usage ?? emptyUsage()
      this.#usage = addUsage(this.#usage, usage)
      this.run.steps = step
      this.run.usage = this.#usage

      const toolCalls: MessageToolCall[] = answer.toolCalls.map((call) => ({ id: newId('call'), name: call.name, arguments: call.arguments }))
      const assistant: MessageRecord = {
        id: newId('msg'), sessionId: this.#session.id, runId: this.run.id, role: 'assistant',
        content: answer.text.length > 0 ? answer.text : null, createdAt: now()
      }
      if (toolCalls.length > 0) assistant.toolCalls = toolCalls
      await Promise.all([
        store.updateRun(this.run.id, { steps: step, usage: this.#usage }),
        store.addSessionUsage(this.#session.id, usage),
        this.emit('monitor', 'token_usage', { ...usage }),
        store.addMessage(assistant)
      ])
      messages.push(...toChatMessages(null, [assistant]))

      for (const call of toolCalls) {
        const tool = await this.#runToolCall(step, call)
        messages.push(...toChatMessages(null, [tool]))
      }
      this.#emitSoon('monitor', 'step_complete', { step, durationMs: Date.now() - started, usage })

      const maxTokens = this.#session.limits.maxTokens
      if (maxTokens !== undefined && this.#usage.totalTokens > maxTokens) {
        throw new RunFailure(maxTokensError(maxTokens, this.#usage.totalTokens), 'system')
      }
      if (toolCalls.length === 0) return 'completed'
    }
    return 'max_steps'
  }

  /** One model call with the retry policy of SPEC 5.1, streaming text and reasoning as events. */
  async #callModel(step: number, messages: ReturnType<typeof toChatMessages>) {
    const { model, retryPolicy } = this.#deps
    for (let attempt = 0; ; attempt++) {
      const text = { started: false, value: '' }
      const reasoning = { started: false, ended: false, value: '' }
      const toolCalls: Array<{ name: string; arguments: string }> = []
      let usage: Usage | null = null
      let firstTokenSeen = false
      const span = this.#trace.startModelCall(this.#session.model, attempt + 1)
      try {
        const request = {
          model: this.#session.model,
          messages,
          ...(this.#hooks.tools.definitions.length > 0 ? { tools: this.#hooks.tools.definitions } : {})
        }
        for await (const part of model.stream(request, { signal: this.#signal, requestId: this.run.requestId, traceparent: span.traceparent })) {
          firstTokenSeen = true
          if (part.type === 'text') {
            if (reasoning.started && !reasoning.ended) await this.#endThinking(step, reasoning)
            if (!text.started) await this.emit('progress', 'text_chunk_start', { step })
            text.started = true
            text.value += part.delta
            this.#emitSoon('progress', 'text_chunk', { step, delta: part.delta })
          } else if (part.type === 'reasoning') {
            if (!reasoning.started) await this.emit('progress', 'think_chunk_start', { step })
            reasoning.started = true
            reasoning.value += part.delta
            this.#emitSoon('progress', 'think_chunk', { step, delta: part.delta })
          } else if (part.type === 'tool_call') {
            toolCalls.push({ name: part.name, arguments: part.arguments })
          } else {
            usage = part.usage
          }
        }
        span.end({ usage })
        await this.#closeBlocks(step, text, reasoning)
        return { text: text.value, toolCalls, usage }
      } catch (err) {
        const error = err instanceof ModelError ? err : classifyModelError(err)
        const retrying = !this.#signal.aborted && !firstTokenSeen && shouldRetry(error, attempt, retryPolicy)
        span.end({ error: error.classified, retrying })
        if (this.#signal.aborted) throw err
        if (retrying) {
          const delayMs = retryDelayMs(retryPolicy, attempt, error.retryAfterMs)
          this.#log.warn({ code: error.classified.code, status: error.status, attempt: attempt + 1, delayMs }, 'model call failed, retrying')
          await this.emit('monitor', 'model_retry', { attempt: attempt + 1, delayMs, code: error.classified.code, status: error.status })
          await sleep(delayMs, this.#signal)
          continue
        }
        // Close what was opened so a client's text assembly stays balanced.
        await this.#closeBlocks(step, text, reasoning)
        const exhausted = error.classified.retryable && firstTokenSeen === false
        throw new RunFailure({
          ...error.classified,
          fatal: true,
          ...(exhausted ? { message: `${error.classified.message} (gave up after ${attempt} retries)` } : {})
        }, 'model')
      }
    }
  }

  async #endThinking(step: number, reasoning: { ended: boolean; value: string }): Promise<void> {
    reasoning.ended = true
    await this.emit('progress', 'think_chunk_end', { step, text: reasoning.value })
  }

  /** Ends the thinking and text blocks a model call opened (…_chunk_end), at its end or its failure. */
  async #closeBlocks(step: number, text: { started: boolean; value: string }, reasoning: { started: boolean; ended: boolean; value: string }): Promise<void> {
    if (reasoning.started && !reasoning.ended) await this.#endThinking(step, reasoning)
    if (text.started) await this.emit('progress', 'text_chunk_end', { step, text: text.value })
  }

  /** Runs one tool call through approval, the client or the runtime; returns the tool message. */
  async #runToolCall(step: number, call: MessageToolCall): Promise<MessageRecord> {
    const { store } = this.#deps
    const startedAt = Date.now()
    const span = this.#trace.startToolCall(call.name, call.id)
    const parsed = parseArguments(call.arguments)
    const record: ToolCallRecord = {
      id: call.id, sessionId: this.#session.id, runId: this.run.id, step, name: call.name,
      input: parsed.ok ? parsed.value : call.arguments, state: 'pending', startedAt: new Date(startedAt).toISOString(),
      endedAt: null, durationMs: null
    }
    const save = async () => store.saveToolCall(record)
    await Promise.all([save(), this.emit('progress', 'tool:start', { call: snapshot(record) })])

    let outcome: { ok: true; result: unknown } | { ok: false; error: ClassifiedError }
    try {
      const tool = this.#hooks.tools.get(call.name)
      const approval = tool && parsed.ok ? await this.#approve(record) : null
      if (!tool) {
        outcome = { ok: false, error: toolNotFound(call.name, this.#hooks.tools.names) }
      } else if (!parsed.ok) {
        outcome = { ok: false, error: invalidArguments(call.name, parsed.message) }
      } else if (approval?.decision === 'deny') {
        outcome = { ok: false, error: deniedByUser(call.name, approval.note) }
      } else if (tool.kind === 'client') {
        const invalid = tool.check(parsed.value)
        outcome = invalid ? { ok: false, error: invalid } : await this.#awaitClient(record)
      } else {
        record.state = 'executing'
        await save()
        outcome = await this.#hooks.executeTool(record, this.#signal, (type, data) =>
          this.emit('progress', `tool:${type}`, { callId: record.id, name: record.name, ...data }))
      }
    } catch (err) {
      if (this.#signal.aborted) {
        span.end({ ok: false, error: toolInterrupted(call.name) })
        await this.#sealCall(record, toolInterrupted(call.name), startedAt)
        throw err
      }
      outcome = { ok: false, error: classifyException(err, 'tool') }
    }
    span.end(outcome)
    if (this.#signal.aborted && !outcome.ok && outcome.error.errorType === 'aborted') {
      await this.#sealCall(record, outcome.error, startedAt)
      throw new Error('interrupted')
    }

    record.endedAt = now()
    record.durationMs = Date.now() - startedAt
    const message = toolMessage(this.#session.id, this.run.id, record.id, outcome.ok ? outcome.result : toModelToolResult(outcome.error))
    // The call's final state, its events and its answer commit together.
    const writes: Array<Promise<unknown>> = []
    if (outcome.ok) {
      record.state = 'completed'
      record.result = outcome.result
      writes.push(save(), this.emit('monitor', 'tool_executed', { call: snapshot(record), durationMs: record.durationMs, ok: true }))
    } else {
      record.state = outcome.error.code === 'DENIED_BY_USER' ? 'denied' : 'failed'
      record.error = outcome.error
      writes.push(
        save(),
        this.emit('progress', 'tool:error', { call: snapshot(record), error: outcome.error }),
        this.emit('monitor', 'error', { severity: 'warn', phase: 'tool', message: outcome.error.message, detail: outcome.error }),
        this.emit('monitor', 'tool_executed', { call: snapshot(record), durationMs: record.durationMs, ok: false })
      )
    }
    writes.push(this.emit('progress', 'tool:end', { call: snapshot(record) }), this.#deps.store.addMessage(message))
    await Promise.all(writes)
    return message
  }

  /** Waits for a person's decision when the session's approval policy covers this call; allows it otherwise. */
  async #approve(record: ToolCallRecord): Promise<ApprovalDecision> {
    const { approval } = this.#session
    const needed = approval.mode === 'always' || (approval.mode === 'tools' && (approval.tools ?? []).includes(record.name))
    if (!needed) return { decision: 'allow', note: null }
    record.state = 'approval_required'
    await this.#deps.store.saveToolCall(record)
    await this.setStatus('awaiting_approval')
    await this.emit('control', 'permission_required', { call: snapshot(record) })
    const { decision, note } = await this.#hooks.waitForApproval(record, this.#signal)
    await this.emit('control', 'permission_decided', { callId: record.id, decision, note })
    await this.setStatus('running')
    return { decision, note }
  }

  async #awaitClient(record: ToolCallRecord): Promise<{ ok: true; result: unknown } | { ok: false; error: ClassifiedError }> {
    record.state = 'executing'
    await this.#deps.store.saveToolCall(record)
    await this.setStatus('awaiting_tool_result')
    await this.emit('control', 'tool_result_required', { call: snapshot(record) })
    const answer = await this.#hooks.waitForToolResult(record, this.#signal)
    await this.setStatus('running')
    if ('error' in answer) {
      return {
        ok: false,
        error: classified({
          errorType: 'runtime', code: 'UNKNOWN', message: `The client's ${record.name} failed: ${answer.error}`,
          recommendations: [`The client reported an error from ${record.name}; check its input or try another way.`]
        })
      }
    }
    return { ok: true, result: answer.output }
  }

  /** Gives an unfinished call its final, sealed result so the history never holds a call without an answer. */
  async #sealCall(record: ToolCallRecord, error: ClassifiedError, startedAt: number): Promise<void> {
    record.state = 'sealed'
    record.error = error
    record.endedAt = now()
    record.durationMs = Date.now() - startedAt
    await this.#deps.store.saveToolCall(record)
    await this.#deps.store.addMessage(toolMessage(this.#session.id, this.run.id, record.id, toModelToolResult(error)))
    await this.emit('progress', 'tool:end', { call: snapshot(record) })
  }

  /** Records the end of the run: its error (if any), its final status, then done, committed together. */
  async #close(status: RunStatus, reason: DoneReason, error: ClassifiedError | null, phase: 'model' | 'tool' | 'system'): Promise<void> {
    const writes: Array<Promise<unknown>> = []
    if (error) {
      this.run.error = error
      writes.push(
        this.#deps.store.updateRun(this.run.id, { error }),
        this.emit('monitor', 'error', { severity: 'error', phase, message: error.message, detail: error })
      )
    }
    writes.push(this.setStatus(status), this.emit('progress', 'done', { step: this.#steps, reason, runId: this.run.id }))
    await Promise.all(writes)
  }

  /** Ends the run after a failure or interrupt; a store that fails here too is logged, never thrown. */
  async #end(status: RunStatus, reason: DoneReason, error: ClassifiedError | null, phase: 'model' | 'tool' | 'system' = 'system'): Promise<void> {
    try {
      await this.#sealOpenCalls()
      await this.#close(status, reason, error, phase)
    } catch (err) {
      this.#log.error({ err, status, reason }, 'could not record the end of the run')
      this.run.status = status
      this.run.error = error
      this.run.endedAt ??= now()
    }
  }

  /** After an interrupt mid-step: every call of this run without a tool message gets one. */
  async #sealOpenCalls(): Promise<void> {
    for (const { call, record } of await this.#openCalls()) {
      await this.#sealCall(record, toolInterrupted(call.name), Date.parse(record.startedAt))
    }
  }

  /** This run's tool calls that have no tool message yet, with their stored state (or a new one). */
  async #openCalls(): Promise<Array<{ call: MessageToolCall; record: ToolCallRecord }>> {
    const { store } = this.#deps
    const messages = await store.listMessages(this.#session.id)
    const open: Array<{ call: MessageToolCall; record: ToolCallRecord }> = []
    for (const call of unansweredCalls(messages, this.run.id)) {
      const existing = await store.getToolCall(this.#session.id, call.id)
      open.push({
        call,
        record: existing ?? {
          id: call.id, sessionId: this.#session.id, runId: this.run.id, step: this.#steps, name: call.name,
          input: call.arguments, state: 'pending', startedAt: now(), endedAt: null, durationMs: null
        }
      })
    }
    return open
  }

  /**
   * Ends a run that a previous process left unfinished (crash, kill -9): announces it with
   * run_recovered, seals every call that never got its result, and fails the run.
   */
  async abandonAfterRestart(): Promise<void> {
    const { store } = this.#deps
    const previousStatus = this.run.status
    this.#steps = this.run.steps
    try {
      const messages = await store.listMessages(this.#session.id)
      if (!messages.some((m) => m.id === this.run.messageId)) {
        await store.addMessage({
          id: this.run.messageId, sessionId: this.#session.id, runId: this.run.id, role: 'user', content: this.run.input, createdAt: now()
        })
      }
      const open = await this.#openCalls()
      await this.emit('monitor', 'run_recovered', { runId: this.run.id, previousStatus, sealedCalls: open.map((o) => o.call.id) })
      for (const { call, record } of open) await this.#sealCall(record, unfinishedCallError(call.name), Date.parse(record.startedAt))
    } catch (err) {
      this.#log.error({ err }, 'could not seal the calls of a recovered run')
    }
    await this.#end('failed', 'failed', classified({
      errorType: 'exception', code: 'UNKNOWN', fatal: true, retryable: true,
      message: `The service stopped while this run was ${previousStatus}; the run was ended when it restarted`,
      recommendations: ['Send the message again to continue; the conversation holds everything committed before the stop.']
    }))
  }
}

/** The tool calls in these messages (of one run, if given) that have no tool message answering them. */
export function unansweredCalls(messages: MessageRecord[], runId?: string): MessageToolCall[] {
  const answered = new Set(messages.filter((m) => m.role === 'tool').map((m) => m.toolCallId))
  return messages
    .filter((m) => m.role === 'assistant' && (runId === undefined || m.runId === runId))
    .flatMap((m) => m.toolCalls ?? [])
    .filter((call) => !answered.has(call.id))
}

/** The sealed result of a call that cannot finish any more (restart, fork). */
export function unfinishedCallError(toolName: string, because = 'the service stopped while it ran'): ClassifiedError {
  return classified({
    errorType: 'aborted', code: 'UNKNOWN', retryable: false,
    message: `${toolName} did not finish: ${because}`,
    recommendations: [`Its effects are unknown; check the state before calling ${toolName} again.`]
  })
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

function parseArguments(text: string): { ok: true; value: unknown } | { ok: false; message: string } {
  if (text.trim() === '') return { ok: true, value: {} }
  try {
    return { ok: true, value: JSON.parse(text) }
  } catch (err) {
    return { ok: false, message: (err as Error).message }
  }
}

function invalidArguments(toolName: string, reason: string): ClassifiedError {
  return classified({
    errorType: 'validation', code: 'VALIDATION_ERROR',
    message: `The arguments of ${toolName} are not valid JSON: ${reason}`,
    recommendations: [`Call ${toolName} again with its arguments as one JSON object matching its parameters schema.`]
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

/** A tool message answering one call; content is the result as the model will read it. */
export function toolMessage(sessionId: string, runId: string, callId: string, content: unknown): MessageRecord {
  return {
    id: newId('msg'), sessionId, runId, role: 'tool', toolCallId: callId,
    content: typeof content === 'string' ? content : JSON.stringify(content ?? null), createdAt: now()
  }
}

/** The ToolCallSnapshot of SPEC 4. */
export function snapshot(call: ToolCallRecord): Record<string, unknown> {
  const view: Record<string, unknown> = {
    id: call.id, name: call.name, input: call.input, state: call.state, startedAt: call.startedAt,
    endedAt: call.endedAt, durationMs: call.durationMs
  }
  if (call.result !== undefined) view.result = call.result
  if (call.error !== undefined) view.error = call.error
  return view
}
