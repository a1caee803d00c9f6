import type { ClassifiedError, Usage } from '../../schemas/common.ts'
import { classifyModelError, createModelError } from '../../model/model-errors.ts'
import type { ModelProvider } from '../../model/types.ts'
import { classified } from '../../errors/classified.ts'
import { cutText, transcriptLine, type Turn } from './planner.ts'
import type { TokenCounter } from './token-counter.ts'

/**
 * The instructions of the summarising call. The dev model recognises a request by its first
 * words ("You summarise"), so they stay at the start.
 */
export const SUMMARY_INSTRUCTIONS = [
  'You summarise the earlier part of a conversation between a user and an AI agent that uses tools,',
  'so that the agent can go on without it. Keep what the agent needs: the user\'s goals and constraints,',
  'decisions made, facts learned from tool results (file names, values, errors), and work still open.',
  'Write plain sentences, no preamble, in the language of the conversation.'
].join(' ')

export interface SummariseRequest {
  model: ModelProvider
  modelName: string
  /** The summary these turns follow, folded into the new one. */
  previous: string | null
  turns: Turn[]
  counter: TokenCounter
  /** The most tokens the transcript sent to the summarising call may take. */
  inputTokens: number
  /** The length to ask for. */
  outputTokens: number
  signal: AbortSignal
  requestId: string
  /** The W3C traceparent of the summary's chat span, sent upstream like every model call's. */
  traceparent?: string | undefined
}

/** Asks the model for a summary of older turns; throws a ModelError when it fails or writes nothing. */
export async function summarise(request: SummariseRequest): Promise<{ text: string; usage: Usage | null }> {
  const { counter } = request
  const messages = request.turns.flatMap((turn) => turn.messages)
  const toolNames = new Map(messages.flatMap((m) => m.toolCalls ?? []).map((call) => [call.id, call.name]))
  const lines = messages.map((m) => transcriptLine(m, 4000, toolNames))
  // Every line gets an equal share of the room, so a long transcript loses the middles of long messages, not whole turns.
  const share = Math.max(16, Math.floor(request.inputTokens / Math.max(1, lines.length + (request.previous ? 1 : 0))))
  const clip = (text: string) => cutText(text, counter.count(text), share, '[…]')
  const transcript = [
    ...(request.previous ? [`Earlier summary: ${clip(request.previous)}`] : []),
    ...lines.map(clip)
  ].join('\n')
  let text = ''
  let usage: Usage | null = null
  try {
    const parts = request.model.stream({
      model: request.modelName,
      messages: [
        { role: 'system', content: SUMMARY_INSTRUCTIONS },
        { role: 'user', content: `Summarise in at most ${Math.floor(request.outputTokens * 0.75)} words:\n\n${transcript}` }
      ],
      maxTokens: request.outputTokens
    }, { signal: request.signal, requestId: request.requestId, traceparent: request.traceparent })
    for await (const part of parts) {
      if (part.type === 'text') text += part.delta
      else if (part.type === 'finish') usage = part.usage
    }
  } catch (err) {
    throw classifyModelError(err)
  }
  if (text.trim() === '') throw createModelError('INVALID_RESPONSE', 'The model answered the summary request with no text.')
  return { text: text.trim(), usage }
}

/** The classified failure of a summary (SPEC 12): not fatal, the loop truncates instead. */
export function summaryFailed(cause: ClassifiedError, messages: number): ClassifiedError {
  return classified({
    errorType: cause.errorType, code: 'SUMMARY_FAILED', retryable: true,
    message: `Summarising ${messages} earlier messages failed (${cause.code}: ${cause.message}); they were truncated instead`,
    recommendations: [
      'Nothing to do for the run: it goes on with the older messages truncated, and the next compaction tries to summarise again.',
      ...cause.recommendations
    ],
    detail: { cause }
  })
}

/** Stored messages that a bridge stands for. */
export function messageCount(turns: Turn[]): number {
  return turns.reduce((sum, turn) => sum + turn.messages.length, 0)
}
