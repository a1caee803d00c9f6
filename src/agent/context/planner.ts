import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions'
import type { MessageRecord } from '../../store/store.ts'
import { toChatMessage } from '../conversation.ts'
import { chatMessageTokens, MESSAGE_OVERHEAD, REPLY_PRIMING, type TokenCounter } from './token-counter.ts'
import { wholeCharEnd } from '../../whole-chars.ts'

/**
 * Messages that reach the model together or not at all: a user message, an assistant answer, or
 * an assistant's tool calls with every result that answers them (a provider refuses a tool call
 * without its result, and a result without its call).
 */
export interface Turn {
  messages: MessageRecord[]
  /** Position in the stored history of the turn's first message. */
  start: number
}

/** The stored history as the model sees it: the newest summary, then the turns after what it stands for. */
export interface HistoryView {
  summary: MessageRecord | null
  turns: Turn[]
  /** Index in `turns` of the latest user message: it and every turn after it are never summarised. */
  current: number
}

/**
 * Builds the view: the newest summary hides the messages it stands for; other summaries,
 * orphaned results and empty answers are not sent. `offset`: the stored messages before `history[0]`, left unread
 * because the newest summary stands for them (Store.listContextMessages).
 */
export function viewOf(history: MessageRecord[], offset = 0): HistoryView {
  const summary = history.findLast((m) => m.role === 'summary') ?? null
  const from = Math.max(0, (summary?.replacesMessages ?? 0) - offset)
  const turns: Turn[] = []
  const turnOfCall = new Map<string, Turn>()
  for (let i = from; i < history.length; i++) {
    const message = history[i] as MessageRecord
    if (message.role === 'summary') continue
    // An answer with neither text nor tool calls (a content filter's empty answer, or only blank
    // lines) tells the model nothing, and some gateways refuse an assistant message with empty
    // or blank content and no tool calls. Left out, its user message is followed by the next one,
    // as after a run that failed before its answer: two user messages in a row, which the providers take.
    if (message.role === 'assistant' && !message.content?.trim() && !message.toolCalls?.length) continue
    if (message.role === 'tool') {
      turnOfCall.get(message.toolCallId ?? '')?.messages.push(message)
      continue
    }
    const turn: Turn = { messages: [message], start: offset + i }
    turns.push(turn)
    for (const call of message.toolCalls ?? []) turnOfCall.set(call.id, turn)
  }
  const lastUser = turns.findLastIndex((turn) => turn.messages[0]?.role === 'user')
  return { summary, turns, current: lastUser >= 0 ? lastUser : Math.max(0, turns.length - 1) }
}

export interface PlanOptions {
  instructions: string | null
  /** The most tokens the request may hold. */
  budget: number
  /** Tokens of the request outside its messages (the tool definitions). */
  fixedTokens: number
  counter: TokenCounter
  /** The provider refused the last request as too long: aim at half the budget and cut every large output. */
  harder?: boolean
}

/** What to send instead of the stored history, before a summary is written. */
export interface ContextPlan {
  view: HistoryView
  /** Tokens of the request as the view stands (with the stored summary, no cuts). */
  tokensBefore: number
  /** The content to send for tool results that are cut, by message ID. */
  cuts: Map<string, string>
  /** Older turns to be replaced by a new summary (none: keep the stored summary, if any). */
  older: Turn[]
  /** Turns sent as they are (cuts aside); the latest user message and what follows are always among them. */
  kept: Turn[]
  /** The tokens left for the summary or the truncation note that stands for the older turns. */
  bridgeTokens: number
}

/**
 * Plans the history sent to the model so that it fits the budget: large tool outputs are cut
 * first, oldest first; if that is not enough, older turns are set apart to be summarised, keeping
 * as many recent turns as fit in 70% of the budget (50% when compacting harder), so that the next
 * calls do not summarise again at once.
 */
export function planContext(history: MessageRecord[], options: PlanOptions, offset = 0): ContextPlan {
  const { budget, counter } = options
  const view = viewOf(history, offset)
  // An eighth of the budget, and no more than a few pages: a summary is a digest, not a second history.
  const bridgeTokens = Math.max(64, Math.min(4096, Math.floor(budget / 8)))
  const cuts = new Map<string, string>()
  const turnTokens = (turn: Turn) => turn.messages.reduce((sum, m) => sum + chatMessageTokens(counter, sentMessage(m, cuts)), 0)
  const base = baseTokens(options) + (view.summary ? summaryTokens(counter, view.summary.content ?? '') : 0)
  let total = base + view.turns.reduce((sum, turn) => sum + turnTokens(turn), 0)
  const plan: ContextPlan = { view, tokensBefore: total, cuts, older: [], kept: view.turns, bridgeTokens }
  if (total <= budget && !options.harder) return plan

  const outputLimit = Math.max(32, Math.floor(budget / (options.harder ? 40 : 10)))
  for (const message of view.turns.flatMap((turn) => turn.messages)) {
    if (message.role !== 'tool') continue
    const content = message.content ?? ''
    const tokens = counter.count(content)
    if (tokens <= outputLimit) continue
    const cut = cutText(content, tokens, outputLimit, `[agentd: this tool output was cut from ${tokens} to about ${outputLimit} tokens to fit the context window; the whole output stays in the stored conversation]`)
    cuts.set(message.id, cut)
    total -= counter.count(content) - counter.count(cut)
    if (total <= budget && !options.harder) return plan
  }

  const target = Math.floor(budget * (options.harder ? 0.5 : 0.7))
  const currentTokens = view.turns.slice(view.current).reduce((sum, turn) => sum + turnTokens(turn), 0)
  let room = target - baseTokens(options) - bridgeTokens - currentTokens
  let first = view.current
  while (first > 0) {
    const tokens = turnTokens(view.turns[first - 1] as Turn)
    if (tokens > room) break
    room -= tokens
    first--
  }
  plan.older = view.turns.slice(0, first)
  plan.kept = view.turns.slice(first)
  return plan
}

/** What stands for the older turns in the request: a summary the model wrote, or a truncation note. */
export interface Bridge {
  kind: 'summary' | 'truncation'
  text: string
  /** How many stored messages it stands for. */
  messages: number
}

export interface AssembledContext {
  messages: ChatCompletionMessageParam[]
  tokens: number
  /** Turns after the latest user message left out because the request was still too long. */
  droppedTurns: Turn[]
}

/**
 * The request's messages: instructions, the bridge, then the kept turns with their cuts. If that
 * is still over budget (a run whose own steps outgrow the window), the oldest steps after the
 * latest user message are left out, never the user message or the newest step.
 */
export function assembleContext(plan: ContextPlan, bridge: Bridge | null, options: PlanOptions): AssembledContext {
  const { counter, budget } = options
  const head: ChatCompletionMessageParam[] = []
  if (options.instructions) head.push({ role: 'system', content: options.instructions })
  if (bridge) head.push({ role: 'system', content: bridgeContent(bridge) })
  const kept = plan.kept.map((turn) => ({ turn, messages: turn.messages.map((m) => sentMessage(m, plan.cuts)) }))
  const tokensOf = (messages: ChatCompletionMessageParam[]) => messages.reduce((sum, m) => sum + chatMessageTokens(counter, m), 0)
  const fixed = options.fixedTokens + REPLY_PRIMING + tokensOf(head)
  let tokens = fixed + kept.reduce((sum, k) => sum + tokensOf(k.messages), 0)

  const droppedTurns: Turn[] = []
  const userAt = plan.kept.findIndex((turn) => turn === plan.view.turns[plan.view.current])
  if (userAt >= 0 && tokens > budget) {
    const noteTokens = chatMessageTokens(counter, droppedStepsNote(Number.MAX_SAFE_INTEGER))
    // The newest step stays: the model must see the results it is answering.
    while (tokens + noteTokens > budget && userAt + 1 < kept.length - 1) {
      const [gone] = kept.splice(userAt + 1, 1)
      if (!gone) break
      droppedTurns.push(gone.turn)
      tokens -= tokensOf(gone.messages)
    }
  }
  const body = kept.flatMap((k) => k.messages)
  if (droppedTurns.length > 0) {
    const note = droppedStepsNote(droppedTurns.reduce((sum, turn) => sum + turn.messages.length, 0))
    const userMessages = kept[userAt]?.messages.length ?? 1
    body.splice(kept.slice(0, userAt).reduce((sum, k) => sum + k.messages.length, 0) + userMessages, 0, note)
    tokens += chatMessageTokens(counter, note)
  }
  return { messages: [...head, ...body], tokens, droppedTurns }
}

/** The truncation note that stands for older turns when no summary could be written: the previous summary and the most recent excerpts that fit. */
export function truncationText(previous: string | null, older: Turn[], counter: TokenCounter, maxTokens: number): string {
  const lines: string[] = []
  let room = maxTokens - 64 - (previous ? counter.count(previous) : 0)
  for (const message of older.flatMap((turn) => turn.messages).reverse()) {
    if (message.role === 'tool') continue
    const line = transcriptLine(message, 200)
    const tokens = counter.count(line)
    if (tokens > room) break
    room -= tokens
    lines.unshift(line)
  }
  const parts = previous ? [`Summary of what came before:\n${previous}`] : []
  if (lines.length > 0) parts.push(`The most recent of them, cut short:\n${lines.join('\n')}`)
  return parts.join('\n\n')
}

/** One message as a line of a transcript, cut to `maxChars`; a tool result is named by its tool when `toolNames` knows the call. */
export function transcriptLine(message: MessageRecord, maxChars: number, toolNames: ReadonlyMap<string, string> = new Map()): string {
  const clip = (text: string) => (text.length > maxChars ? `${sliceWhole(text, maxChars)}…` : text)
  if (message.role === 'tool') {
    const callId = message.toolCallId ?? ''
    return `${toolNames.get(callId) ?? 'tool'} returned: ${clip(message.content ?? '')}`
  }
  const calls = (message.toolCalls ?? []).map((call) => `${call.name}(${clip(call.arguments)})`)
  const said = message.content ? clip(message.content) : ''
  if (calls.length === 0) return `${message.role}: ${said}`
  return `${message.role}: ${said}${said ? ' ' : ''}[called ${calls.join(', ')}]`
}

/** The text cut to about `maxTokens` tokens, with a note saying so. */
export function cutText(text: string, tokens: number, maxTokens: number, note: string): string {
  if (tokens <= maxTokens) return text
  const keep = Math.floor((text.length * maxTokens) / tokens)
  return `${sliceWhole(text, keep)}\n${note}`
}

/** The first `end` UTF-16 units of the text, one fewer when that would keep half of a character (DeepSeek's and Anthropic's parsers refuse a lone one). */
const sliceWhole = (text: string, end: number): string => text.slice(0, wholeCharEnd(text, end))

function droppedStepsNote(count: number): ChatCompletionMessageParam {
  return {
    role: 'system',
    content: `[agentd: ${count} messages of the earlier steps of this request were left out to fit the context window; their tool calls ran and their results are stored]`
  }
}

function bridgeContent(bridge: Bridge): string {
  const intro = bridge.kind === 'summary'
    ? `Summary of the earlier conversation (${bridge.messages} messages), written to fit the context window:`
    : `[agentd: the earlier conversation (${bridge.messages} messages) was left out to fit the context window; no summary could be written]`
  return bridge.text ? `${intro}\n${bridge.text}` : intro
}

function summaryTokens(counter: TokenCounter, text: string): number {
  return MESSAGE_OVERHEAD + 24 + counter.count(text)
}

function baseTokens(options: PlanOptions): number {
  const instructions = options.instructions ? MESSAGE_OVERHEAD + options.counter.count(options.instructions) : 0
  return options.fixedTokens + REPLY_PRIMING + instructions
}

function sentMessage(message: MessageRecord, cuts: Map<string, string>): ChatCompletionMessageParam {
  const cut = cuts.get(message.id)
  return toChatMessage(cut === undefined ? message : { ...message, content: cut })
}
