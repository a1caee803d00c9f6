import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions'
import type { MessageRecord, MessageToolCall } from '../store/store.ts'

/** One stored message as a Chat Completions message. */
export function toChatMessage(message: MessageRecord): ChatCompletionMessageParam {
  if (message.role === 'user') return { role: 'user', content: message.content ?? '' }
  if (message.role === 'tool') return { role: 'tool', tool_call_id: message.toolCallId ?? '', content: message.content ?? '' }
  const calls = message.toolCalls ?? []
  return calls.length > 0
    ? {
        role: 'assistant',
        content: message.content,
        tool_calls: calls.map((call) => ({ id: call.id, type: 'function', function: { name: call.name, arguments: sentArguments(call) } }))
      }
    : { role: 'assistant', content: message.content ?? '' }
}

/** The arguments sent for each stored call, worked out once per call object (a run sends its history at every step). */
const sentArgumentsOf = new WeakMap<MessageToolCall, string>()

/**
 * A call's arguments as sent back to the model: `{}` when they are not a JSON object (the tool
 * refused them, and its result says why). Servers that render past calls through a chat template
 * (vLLM until it learnt to coerce them) parse them, and refused every later request of the session.
 */
function sentArguments(call: MessageToolCall): string {
  let sent = sentArgumentsOf.get(call)
  if (sent === undefined) {
    sent = isJsonObject(call.arguments) ? call.arguments : '{}'
    sentArgumentsOf.set(call, sent)
  }
  return sent
}

function isJsonObject(text: string): boolean {
  try {
    const value: unknown = JSON.parse(text)
    return typeof value === 'object' && value !== null && !Array.isArray(value)
  } catch {
    return false
  }
}
