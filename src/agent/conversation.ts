import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions'
import type { MessageRecord } from '../store/store.ts'

/** The stored messages as the Chat Completions conversation, after the session's instructions. */
export function toChatMessages(instructions: string | null, messages: MessageRecord[]): ChatCompletionMessageParam[] {
  const chat: ChatCompletionMessageParam[] = []
  if (instructions) chat.push({ role: 'system', content: instructions })
  for (const message of messages) chat.push(toChatMessage(message))
  return chat
}

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
