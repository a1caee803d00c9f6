import type { ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions'
import type { Logger } from 'pino'
import { newId } from '../../ids.ts'
import { classifyModelError } from '../../model/model-errors.ts'
import type { ModelProvider } from '../../model/types.ts'
import { emptyUsage, type Usage } from '../../schemas/common.ts'
import type { RunTrace } from '../../telemetry/tracing.ts'
import type { EventChannel, MessageRecord, SessionRecord, StoreWrite } from '../../store/store.ts'
import { assembleContext, cutText, planContext, truncationText, type Bridge, type ContextPlan, type PlanOptions } from './planner.ts'
import { messageCount, summarise, summaryFailed } from './summariser.ts'
import { byteCounter, memoized, tokenCounterFor, toolDefinitionTokens, type MemoizedCounter, type TokenCounter } from './token-counter.ts'

export interface ContextWindowOptions {
  session: SessionRecord
  /** The server's budget (AGENTD_CONTEXT_TOKENS), when the session sets none. */
  defaultTokens: number
  tools: ChatCompletionTool[]
  model: ModelProvider
  /** Commits a unit of work of the run (the summary, its usage and its token_usage event together). */
  commit(writes: StoreWrite[]): Promise<unknown>
  /** An event of the run as a write of a unit of work. */
  event(channel: EventChannel, type: string, data: Record<string, unknown>): StoreWrite
  /** The session's stored messages before the history that fit() is given: those its newest summary stands for, left unread. */
  historyOffset: number
  runId: string
  requestId: string
  /** The run's trace: the summarising call is one of its model calls, with a chat span like the others. */
  trace: RunTrace
  signal: AbortSignal
  logger: Logger
  emit(channel: EventChannel, type: string, data: Record<string, unknown>): Promise<unknown>
  /** Adds the tokens of a summarising call to the run's usage (the session's is added here). */
  onUsage(usage: Usage): void
}

/**
 * Fits a session's history into its token budget before each model call (SPEC 12): cuts large
 * tool outputs, then replaces older turns with a summary the model writes and that is stored as
 * a `summary` message for later calls to reuse; falls back to truncation when summarising fails.
 * The stored conversation is only ever appended to.
 */
export class ContextWindow {
  readonly #options: ContextWindowOptions
  #counter: MemoizedCounter | null = null

  constructor(options: ContextWindowOptions) {
    this.#options = options
  }

  /** The session's budget in tokens. */
  get budget(): number {
    return this.#options.session.limits.contextTokens ?? this.#options.defaultTokens
  }

  /**
   * The messages to send for this history (which it extends with a new summary message, if it
   * writes one). `harder` after the provider refused a request as too long.
   */
  async fit(history: MessageRecord[], step: number, harder = false): Promise<ChatCompletionMessageParam[]> {
    const { session } = this.#options
    if (!harder) {
      const bytes: PlanOptions = this.#planOptions(byteCounter, false)
      const bound = planContext(history, bytes, this.#options.historyOffset)
      if (bound.tokensBefore <= bytes.budget) return assembleContext(bound, this.#storedBridge(bound.view.summary), bytes).messages
    }
    this.#counter ??= memoized(await tokenCounterFor(session.model))
    await this.#counter.prime(textsOf(history))
    const options = this.#planOptions(this.#counter, harder)
    const plan = planContext(history, options, this.#options.historyOffset)
    const stored = plan.view.summary
    let bridge = this.#storedBridge(stored)
    let method: 'tool_outputs' | 'summary' | 'truncation' | null = plan.cuts.size > 0 ? 'tool_outputs' : null
    let summaryMessageId: string | null = null

    if (plan.older.length > 0) {
      const replacesMessages = plan.kept[0]?.start ?? this.#options.historyOffset + history.length
      const previous = stored?.content ?? null
      const written = await this.#summarise(previous, plan, options)
      if (written) {
        // Cut before it is stored: later calls send the stored summary as it is, so it must fit the room it was given.
        const text = cutText(written.text, this.#counter.count(written.text), plan.bridgeTokens, '[agentd: the summary was cut to fit the context window]')
        const summary: MessageRecord = {
          id: newId('msg'), sessionId: session.id, runId: this.#options.runId, role: 'summary', content: text,
          replacesMessages, createdAt: new Date().toISOString()
        }
        // One token_usage per model call, the summarising one too, so that clients and metrics that
        // sum or count them agree with the run; a reply without usage counts as zero tokens, as a step's does.
        const usage = written.usage ?? emptyUsage()
        this.#options.onUsage(usage)
        await this.#options.commit([
          { type: 'message', message: summary },
          { type: 'usage', sessionId: session.id, usage },
          this.#options.event('monitor', 'token_usage', { ...usage, purpose: 'summary' })
        ])
        history.push(summary)
        bridge = { kind: 'summary', text, messages: replacesMessages }
        summaryMessageId = summary.id
        method = 'summary'
      } else {
        bridge = { kind: 'truncation', text: truncationText(previous, plan.older, this.#counter, plan.bridgeTokens), messages: replacesMessages }
        method = 'truncation'
      }
    }

    const assembled = assembleContext(plan, bridge, options)
    if (assembled.droppedTurns.length > 0 && method !== 'summary') method = 'truncation'
    if (method !== null) {
      await this.#options.emit('monitor', 'context_compacted', {
        step,
        method,
        removedMessages: messageCount(plan.older) + messageCount(assembled.droppedTurns),
        cutToolOutputs: plan.cuts.size,
        tokensBefore: plan.tokensBefore,
        tokensAfter: assembled.tokens,
        budget: options.budget,
        summaryMessageId,
        harder
      })
    }
    return assembled.messages
  }

  /** The summary of the plan's older turns, or null when the call failed (reported as a monitor warn). */
  async #summarise(previous: string | null, plan: ContextPlan, options: PlanOptions): Promise<{ text: string; usage: Usage | null } | null> {
    // Not retried (truncation is the fallback), so it is always attempt 1.
    const span = this.#options.trace.startModelCall(this.#options.session.model, 1)
    try {
      const written = await summarise({
        model: this.#options.model, modelName: this.#options.session.model, previous, turns: plan.older,
        counter: options.counter, inputTokens: Math.floor(options.budget * 0.6), outputTokens: plan.bridgeTokens,
        signal: this.#options.signal, requestId: this.#options.requestId, traceparent: span.traceparent
      })
      span.end({ usage: written.usage })
      return written
    } catch (err) {
      const cause = classifyModelError(err).classified
      span.end({ error: cause, retrying: false })
      if (this.#options.signal.aborted) throw err
      const error = summaryFailed(cause, messageCount(plan.older))
      this.#options.logger.warn({ code: error.code, cause: error.detail?.['cause'] }, 'summarising the history failed, truncating instead')
      await this.#options.emit('monitor', 'error', { severity: 'warn', phase: 'model', message: error.message, detail: error })
      return null
    }
  }

  #planOptions(counter: TokenCounter, harder: boolean): PlanOptions {
    return {
      instructions: this.#options.session.instructions,
      budget: this.budget,
      fixedTokens: toolDefinitionTokens(counter, this.#options.tools),
      counter,
      harder
    }
  }

  /** The stored summary as the bridge of the request, if there is one. */
  #storedBridge(summary: MessageRecord | null): Bridge | null {
    return summary ? { kind: 'summary', text: summary.content ?? '', messages: summary.replacesMessages ?? 0 } : null
  }
}

/** The texts of a history that the planner counts: contents and tool-call arguments. */
function* textsOf(history: MessageRecord[]): Iterable<string> {
  for (const message of history) {
    if (message.content) yield message.content
    for (const call of message.toolCalls ?? []) yield call.arguments
  }
}
