import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions'
import type { MessageRecord, MessageToolCall } from '../store/store.ts'
import { REASONING } from '../model/types.ts'

/**
 * The reasoning of the run's own answers, in memory only: the store does not keep it, so an
 * answer read back from it (a later run) has none.
 */
const reasoningOf = new WeakMap<MessageRecord, string>()

/** Keeps an answer's reasoning for the run's later requests (REASONING). */
export function keepReasoning(message: MessageRecord, reasoning: string): void {
  reasoningOf.set(message, reasoning)
}

/** One stored message as a Chat Completions message. */
export function toChatMessage(message: MessageRecord): ChatCompletionMessageParam {
  if (message.role === 'user') return { role: 'user', content: message.content ?? '' }
  if (message.role === 'tool') return { role: 'tool', tool_call_id: sentCallId(message.toolCallId ?? ''), content: sentResult(message.content) }
  const calls = message.toolCalls ?? []
  const reasoning = reasoningOf.get(message)
  const sent: ChatCompletionMessageParam = calls.length > 0
    ? {
        role: 'assistant',
        // The blank lines models often write before their calls: gateways to Anthropic's models
        // refuse a blank text ("text content blocks must contain non-whitespace text").
        content: message.content?.trim() ? message.content : null,
        tool_calls: calls.map((call) => ({ id: sentCallId(call.id), type: 'function', function: { name: call.name, arguments: sentArguments(call) } }))
      }
    : { role: 'assistant', content: message.content ?? '' }
  if (reasoning !== undefined) Object.assign(sent, { [REASONING]: reasoning })
  return sent
}

/**
 * A tool result as sent: an empty (or blank) one in words. Gateways to Anthropic's models
 * (LiteLLM, Databricks) refuse an empty text with a 400 "text content blocks must be non-empty",
 * which failed the run and every later one of the session; an MCP tool's empty content or a
 * webhook's "" is such a result. The stored message keeps what the tool returned.
 */
function sentResult(content: string | null): string {
  return content === null || content.trim() === '' ? EMPTY_RESULT : content
}

const EMPTY_RESULT = '(the tool returned an empty result)'

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

/**
 * The ID a stored call goes to the model with: 9 letters and digits, worked out from agentd's own
 * (`call_` and 26 characters), which stays the call's ID everywhere else. Mistral's API, and vLLM
 * and other servers with Mistral's tokenizer, refuse any other form ("Tool call id was call_… but
 * must be a-z, A-Z, 0-9, with a length of 9"), which failed every step after a tool call; OpenAI
 * and the others take any string. The same call always gets the same ID (a provider's prompt cache
 * sees the same history at every step); two calls of one history share one with a chance of about
 * n² / 10^16 (53 bits of two mixed FNV-1a hashes).
 */
export function sentCallId(id: string): string {
  let a = 0x811c9dc5
  let b = 0x01000193
  for (let i = 0; i < id.length; i++) {
    const c = id.charCodeAt(i)
    a = Math.imul(a ^ c, 0x01000193)
    b = Math.imul(b ^ c, 0x811c9dc5 | 1)
  }
  let value = (mix(a) >>> 11) * 2 ** 32 + mix(b)
  let sent = ''
  for (let i = 0; i < 9; i++) {
    sent += ID_ALPHABET[value % 62]
    value = Math.floor(value / 62)
  }
  return sent
}

const ID_ALPHABET = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'

/** MurmurHash3's finaliser: every bit of the hash depends on every bit of its input. */
function mix(h: number): number {
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b)
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35)
  return (h ^ (h >>> 16)) >>> 0
}
