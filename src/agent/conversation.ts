import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions'
import type { MessageRecord } from '../store/store.ts'

/** One stored message as a Chat Completions message. */
export function toChatMessage(message: MessageRecord): ChatCompletionMessageParam {
  if (message.role === 'user') return { role: 'user', content: message.content ?? '' }
  if (message.role === 'tool') return { role: 'tool', tool_call_id: message.toolCallId ?? '', content: message.content ?? '' }
  const calls = message.toolCalls ?? []
  return calls.length > 0
    ? {
        role: 'assistant',
        content: message.content,
        tool_calls: calls.map((call) => ({ id: call.id, type: 'function', function: { name: call.name, arguments: call.arguments } }))
      }
    : { role: 'assistant', content: message.content ?? '' }
}
