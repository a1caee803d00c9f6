import type { MessageRecord, MessageToolCall } from './store.ts'

/** The tool calls in these messages (of one run, if given) that have no tool message answering them. */
export function unansweredCalls(messages: readonly MessageRecord[], runId?: string): MessageToolCall[] {
  const answered = new Set(messages.filter((m) => m.role === 'tool').map((m) => m.toolCallId))
  return messages
    .filter((m) => m.role === 'assistant' && (runId === undefined || m.runId === runId))
    .flatMap((m) => m.toolCalls ?? [])
    .filter((call) => !answered.has(call.id))
}
