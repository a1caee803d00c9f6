import { setImmediate } from 'node:timers/promises'
import type { ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions'
import { toolsJson } from '../../model/request-json.ts'
import { wholeCharEnd } from '../../whole-chars.ts'

/** Counts tokens of text the way one model family does, or estimates them. */
export interface TokenCounter {
  /** The tokenizer in use: a tiktoken encoding for OpenAI models, else 'estimate'. */
  readonly encoding: 'o200k_base' | 'cl100k_base' | 'estimate'
  count(text: string): number
}

/**
 * What every chat message costs beyond its text (role, separators), as OpenAI documents for
 * its chat format; also the priming of the answer, counted once per request.
 */
export const MESSAGE_OVERHEAD = 4
export const REPLY_PRIMING = 3

/** Model names that OpenAI's o200k_base encoding tokenizes (GPT-4o, 4.1, 4.5, 5, o-series, gpt-oss). */
const o200kModels = /^(?:azure\/|openai\/)?(?:gpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|chatgpt-4o|o1|o3|o4)/i
/** Model names of the older cl100k_base encoding (GPT-4, GPT-3.5 and OpenAI's embeddings). */
const cl100kModels = /^(?:azure\/|openai\/)?(?:gpt-4|gpt-3\.5|gpt-35|text-embedding)/i

/**
 * The counter for a model: the real tokenizer for OpenAI model names (gpt-tokenizer, loaded on
 * first use), the estimate for every other model.
 */
export async function tokenCounterFor(model: string): Promise<TokenCounter> {
  if (o200kModels.test(model)) return encodingCounter('o200k_base', (await import('gpt-tokenizer/encoding/o200k_base')).countTokens)
  if (cl100kModels.test(model)) return encodingCounter('cl100k_base', (await import('gpt-tokenizer/encoding/cl100k_base')).countTokens)
  return estimateCounter
}

/**
 * The estimate for models whose tokenizer agentd does not ship (Llama, Qwen, Mistral, …): one token
 * per three bytes of UTF-8, rounded up. English runs about four bytes a token in those tokenizers,
 * so this overcounts (the window is not overrun); CJK text runs about three bytes a token.
 */
export const estimateCounter: TokenCounter = {
  encoding: 'estimate',
  count: (text) => Math.ceil(Buffer.byteLength(text, 'utf8') / 3)
}

/**
 * An upper bound of every tokenizer's count: a token covers at least one byte. A history whose
 * bytes fit the budget fits it in tokens, so most calls need no tokenizer at all.
 */
export const byteCounter: TokenCounter = {
  encoding: 'estimate',
  count: (text) => Buffer.byteLength(text, 'utf8')
}

function encodingCounter(
  encoding: 'o200k_base' | 'cl100k_base',
  countTokens: (text: string, options: { disallowedSpecial: Set<string> }) => number
): TokenCounter {
  // Text that spells a special token (`<|endoftext|>`) is counted as plain text, as the provider reads it.
  const options = { disallowedSpecial: new Set<string>() }
  return { encoding, count: countInPieces((text) => countTokens(text, options)) }
}

/**
 * Text a tokenizer is given at once. Its byte-pair merges take time quadratic in a stretch without
 * a space: 4 KiB of Chinese or emoji held the event loop 20-600 ms in one count, 256 characters
 * well under a millisecond.
 */
export const PIECE_CHARS = 256

/**
 * A tokenizer's count of a text made PIECE_CHARS at a time, each piece ending before a space or
 * line break where there is one in its second half: the tokenizers start a word's token with the
 * space before it, so such a cut changes nothing. A cut inside a word can only count more tokens.
 */
export function countInPieces(count: (text: string) => number): (text: string) => number {
  return (text) => {
    if (text.length <= PIECE_CHARS) return count(text)
    let n = 0
    for (let at = 0; at < text.length;) {
      const end = pieceEnd(text, at, PIECE_CHARS)
      n += count(text.slice(at, end))
      at = end
    }
    return n
  }
}

/**
 * Where a piece of at most `maxChars` starting at `at` ends: before the last space or line break
 * of its second half, else at `maxChars`, one sooner where that would split a surrogate pair.
 */
function pieceEnd(text: string, at: number, maxChars: number): number {
  const end = at + maxChars
  if (end >= text.length) return text.length
  for (let i = end - 1; i > at + maxChars / 2; i--) {
    const c = text.charCodeAt(i)
    if (c === 0x20 || c === 0x0a) return i
  }
  return wholeCharEnd(text, end)
}

/**
 * Text counted in one turn of the event loop; a longer text is counted a slice at a time, between
 * turns. 1 KiB of rare Chinese characters (each two or three tokens) takes a few ms to count.
 */
const SLICE_CHARS = 1024

/** How long priming counts short texts before it lets the event loop take a turn. */
const TURN_MS = 4

/** A counter that remembers counts, and can count a history without holding the event loop. */
export interface MemoizedCounter extends TokenCounter {
  /**
   * Counts these texts ahead of time, so that the planner's synchronous counts find them
   * remembered: short ones TURN_MS of the event loop at a time, a long one a slice per turn.
   * Tokenizing a 2 MB message in one go holds every other request of the process for a second or
   * more, and so did 20 000 short messages (~0.3 s), which a session whose summaries keep failing
   * counts at every run.
   */
  prime(texts: Iterable<string>): Promise<void>
}

/** A counter that remembers the counts of texts it has seen: a history is counted again before every model call. */
export function memoized(counter: TokenCounter): MemoizedCounter {
  const seen = new Map<string, number>()
  return {
    encoding: counter.encoding,
    count(text) {
      let n = seen.get(text)
      if (n === undefined) {
        n = counter.count(text)
        seen.set(text, n)
      }
      return n
    },
    async prime(texts) {
      let turnStarted = performance.now()
      for (const text of texts) {
        if (seen.has(text)) continue
        if (text.length <= SLICE_CHARS) {
          seen.set(text, counter.count(text))
          if (performance.now() - turnStarted > TURN_MS) {
            await setImmediate()
            turnStarted = performance.now()
          }
          continue
        }
        // Slices end before a space where there is one near (pieceEnd), so few tokens are split;
        // a token split at a slice's end can only be counted more.
        let n = 0
        for (let at = 0; at < text.length;) {
          const end = pieceEnd(text, at, SLICE_CHARS)
          n += counter.count(text.slice(at, end))
          at = end
          await setImmediate()
        }
        turnStarted = performance.now()
        seen.set(text, n)
      }
    }
  }
}

/** Tokens one chat message takes in a request. */
export function chatMessageTokens(counter: TokenCounter, message: ChatCompletionMessageParam): number {
  let tokens = MESSAGE_OVERHEAD + counter.count(textOf(message.content))
  if (message.role === 'assistant') {
    for (const call of message.tool_calls ?? []) {
      if (call.type === 'function') tokens += MESSAGE_OVERHEAD + counter.count(call.function.name) + counter.count(call.function.arguments)
    }
  }
  return tokens
}

/** Tokens the tool definitions of a request take (sent as JSON Schema with every call). */
export function toolDefinitionTokens(counter: TokenCounter, tools: ChatCompletionTool[]): number {
  if (tools.length === 0) return 0
  // The same JSON the request carries, made once per list (and per definition).
  return counter.count(toolsJson(tools))
}

function textOf(content: unknown): string {
  if (typeof content === 'string') return content
  if (!Array.isArray(content)) return ''
  return content.map((part: { type?: string; text?: string }) => (part.type === 'text' ? (part.text ?? '') : '')).join('')
}
