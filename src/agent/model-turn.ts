import { classifyModelError } from '../model/model-errors.ts'
import { ModelError } from '../model/types.ts'
import { classified } from '../errors/classified.ts'
import type { ClassifiedError, Usage } from '../schemas/common.ts'
import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions'
import { retryDelayMs, shouldRetry, sleep, waitRefused } from './retry.ts'
import { RunFailure, type RunContext } from './run-context.ts'
import type { SessionToolSet } from '../tools/tool-set.ts'

/** What the model answered in one step. */
export interface ModelAnswer {
  text: string
  /** The reasoning it streamed before its text or calls ('' when none). */
  reasoning: string
  toolCalls: Array<{ name: string; arguments: string }>
  usage: Usage | null
  /** The finish_reason the model gave (`stop`, `tool_calls`, `length`, `content_filter`…); null when it gave none ([DONE] alone). */
  finishReason: string | null
}

interface TextBlock {
  started: boolean
  value: string
}

interface ThinkingBlock extends TextBlock {
  ended: boolean
}

/**
 * One model call with the retry policy of SPEC 5.1, streaming text and reasoning as events. A
 * failure the policy does not retry (or one after the first token) ends the run: RunFailure.
 */
export async function callModel(
  ctx: RunContext,
  tools: SessionToolSet,
  step: number,
  messages: ChatCompletionMessageParam[]
): Promise<ModelAnswer> {
  const { model, retryPolicy } = ctx.deps
  let waitedMs = 0
  for (let attempt = 0; ; attempt++) {
    const text: TextBlock = { started: false, value: '' }
    const reasoning: ThinkingBlock = { started: false, ended: false, value: '' }
    const toolCalls: Array<{ name: string; arguments: string }> = []
    let usage: Usage | null = null
    let finishReason: string | null = null
    let firstTokenSeen = false
    const span = ctx.trace.startModelCall(ctx.session.model, attempt + 1)
    try {
      const request = {
        model: ctx.session.model,
        messages,
        ...(tools.definitions.length > 0 ? { tools: tools.definitions } : {})
      }
      for await (const part of model.stream(request, { signal: ctx.signal, requestId: ctx.run.requestId, traceparent: span.traceparent })) {
        firstTokenSeen = true
        if (part.type === 'text') {
          if (reasoning.started && !reasoning.ended) endThinking(ctx, step, reasoning)
          if (!text.started) ctx.emitSoon('progress', 'text_chunk_start', { step })
          text.started = true
          text.value += part.delta
          ctx.emitSoon('progress', 'text_chunk', { step, delta: part.delta })
        } else if (part.type === 'reasoning') {
          if (!reasoning.started) ctx.emitSoon('progress', 'think_chunk_start', { step })
          reasoning.started = true
          reasoning.value += part.delta
          ctx.emitSoon('progress', 'think_chunk', { step, delta: part.delta })
        } else if (part.type === 'tool_call') {
          toolCalls.push({ name: part.name, arguments: part.arguments })
        } else {
          usage = part.usage
          finishReason = part.finishReason
        }
      }
      span.end({ usage })
      closeBlocks(ctx, step, text, reasoning)
      return { text: text.value, reasoning: reasoning.value, toolCalls, usage, finishReason }
    } catch (err) {
      const error = err instanceof ModelError ? err : classifyModelError(err)
      const retrying = !ctx.signal.aborted && !firstTokenSeen && shouldRetry(error, attempt, retryPolicy)
      span.end({ error: error.classified, retrying })
      if (ctx.signal.aborted) throw err
      if (retrying) {
        const delayMs = retryDelayMs(retryPolicy, attempt, error.retryAfterMs)
        // A provider that asks for longer than the run may wait fails the run now, retryable, with the delay.
        const refused = waitRefused(error, retryPolicy, waitedMs, delayMs)
        if (refused) throw new RunFailure(refused, 'model')
        waitedMs += delayMs
        ctx.log.warn({ code: error.classified.code, status: error.status, attempt: attempt + 1, delayMs }, 'model call failed, retrying')
        await ctx.emit('monitor', 'model_retry', { attempt: attempt + 1, delayMs, code: error.classified.code, status: error.status })
        await sleep(delayMs, ctx.signal)
        continue
      }
      // Close what was opened so a client's text assembly stays balanced.
      closeBlocks(ctx, step, text, reasoning)
      const exhausted = error.classified.retryable && firstTokenSeen === false
      throw new RunFailure({
        ...error.classified,
        fatal: true,
        ...(exhausted ? { message: `${error.classified.message} (gave up after ${attempt} retries)` } : {})
      }, 'model', firstTokenSeen)
    }
  }
}

/**
 * The warning for an answer the model did not end itself: cut at its output-token limit
 * (finish_reason `length`) or stopped by the provider's content filter (`content_filter`). The
 * run goes on with what came (SPEC: a monitor `error` with severity `warn`), but without it a
 * client could not tell a cut or empty answer from a whole one. Null for any other finish.
 */
export function unfinishedAnswer(answer: ModelAnswer): ClassifiedError | null {
  const { finishReason } = answer
  const calls = answer.toolCalls.length
  if (finishReason === 'length') {
    // The cut is at the answer's end: its text when it has no tool calls, else its last call.
    const what = calls === 0
      ? 'its text is kept as it came, cut short'
      : 'its last tool call may be cut; arguments that are not whole JSON are not run, and the model is told they were cut'
    return classified({
      errorType: 'logical', code: 'INVALID_RESPONSE', retryable: false, fatal: false,
      message: `The model's answer was cut at its output limit (finish_reason "length"): ${what}`,
      recommendations: [
        "Raise the model's output limit (max_tokens) on the model server or provider, if it sets one below what the answer needs.",
        'Ask for a shorter answer, or for the work in parts (a large file written in several calls).',
        'Send a follow-up message such as "continue" to have the model go on from where it was cut.'
      ],
      detail: { reason: 'output_truncated', finishReason }
    })
  }
  if (finishReason === 'content_filter') {
    return classified({
      errorType: 'logical', code: 'INVALID_RESPONSE', retryable: false, fatal: false,
      message: answer.text.length > 0 || calls > 0
        ? "The provider's content filter stopped the model's answer (finish_reason \"content_filter\"): what came before it is kept, the rest is missing"
        : "The provider's content filter stopped the model's answer (finish_reason \"content_filter\"): the answer is empty",
      recommendations: [
        "Rephrase the message: the provider's content filter flagged the request or the answer.",
        "Check the provider's content-filter settings for this deployment (Azure OpenAI sets them per deployment) if the content is legitimate."
      ],
      detail: { reason: 'content_filter', finishReason }
    })
  }
  return null
}

// The block events are emitted without waiting, like the deltas between them: they are stored
// and published in order with them, and the step's own commit (or the run's end) waits for all.
function endThinking(ctx: RunContext, step: number, reasoning: ThinkingBlock): void {
  reasoning.ended = true
  ctx.emitSoon('progress', 'think_chunk_end', { step, text: reasoning.value })
}

/** Ends the thinking and text blocks a model call opened (…_chunk_end), at its end or its failure. */
function closeBlocks(ctx: RunContext, step: number, text: TextBlock, reasoning: ThinkingBlock): void {
  if (reasoning.started && !reasoning.ended) endThinking(ctx, step, reasoning)
  if (text.started) ctx.emitSoon('progress', 'text_chunk_end', { step, text: text.value })
}
