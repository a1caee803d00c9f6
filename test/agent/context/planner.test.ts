import fc from 'fast-check'
import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions'
import t from 'tap'
import { assembleContext, planContext, truncationText, viewOf, type PlanOptions } from '../../../src/agent/context/planner.ts'
import { byteCounter, chatMessageTokens, estimateCounter, tokenCounterFor } from '../../../src/agent/context/token-counter.ts'
import type { MessageRecord } from '../../../src/store/store.ts'

let seq = 0
const at = '2026-11-23T10:00:00.000Z'
const message = (init: Partial<MessageRecord> & Pick<MessageRecord, 'role'>): MessageRecord => ({
  id: `msg_${++seq}`, sessionId: 'ses_1', runId: 'run_1', content: null, createdAt: at, ...init
})
const user = (content: string) => message({ role: 'user', content })
const answer = (content: string) => message({ role: 'assistant', content })
/** An assistant message calling tools and the tool messages answering each call. */
function toolTurn(outputs: string[]): MessageRecord[] {
  const calls = outputs.map((_, i) => ({ id: `call_${seq}_${i}`, name: 'fs_read', arguments: `{"path":"f${i}.txt"}` }))
  return [message({ role: 'assistant', toolCalls: calls }), ...calls.map((call, i) => message({ role: 'tool', toolCallId: call.id, content: outputs[i] ?? '' }))]
}
const words = (n: number, word = 'lorem') => Array.from({ length: n }, (_, i) => `${word}${i}`).join(' ')

const options = (budget: number, extra: Partial<PlanOptions> = {}): PlanOptions => ({
  instructions: 'You are a careful agent.', budget, fixedTokens: 0, counter: estimateCounter, ...extra
})
const tokensOf = (messages: ChatCompletionMessageParam[]) => messages.reduce((sum, m) => sum + chatMessageTokens(estimateCounter, m), 0)

/** The calls and results of a request pair up: every call answered right after it, no result without its call. */
function pairsIntact(messages: ChatCompletionMessageParam[]): boolean {
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i] as ChatCompletionMessageParam
    if (m.role === 'assistant' && m.tool_calls) {
      const answered = messages.slice(i + 1, i + 1 + m.tool_calls.length).map((r) => (r.role === 'tool' ? r.tool_call_id : null))
      if (m.tool_calls.some((call) => !answered.includes(call.id))) return false
    }
    if (m.role === 'tool') {
      const owner = messages.slice(0, i).findLast((p) => p.role !== 'tool')
      if (owner?.role !== 'assistant' || !owner.tool_calls?.some((call) => call.id === m.tool_call_id)) return false
    }
  }
  return true
}

t.test('a history within the budget is sent whole, after the instructions', async (t) => {
  const history = [user('hello'), answer('hi'), user('read it'), ...toolTurn(['short file']), answer('done')]
  const plan = planContext(history, options(10_000))
  t.same(plan.cuts.size, 0)
  t.same(plan.older, [])
  const { messages, droppedTurns } = assembleContext(plan, null, options(10_000))
  t.same(droppedTurns, [])
  t.same(messages.map((m) => m.role), ['system', 'user', 'assistant', 'user', 'assistant', 'tool', 'assistant'])
  t.equal(messages[0]?.content, 'You are a careful agent.')
})

t.test('large old tool outputs are cut first, with a note the model reads, and then nothing is summarised', async (t) => {
  const big = words(2000)
  const history = [user('read both'), ...toolTurn([big]), ...toolTurn(['small']), answer('read'), user('and now?')]
  const plan = planContext(history, options(3000))
  t.equal(plan.cuts.size, 1, 'only the large output is cut')
  t.same(plan.older, [], 'cutting was enough')
  const { messages, tokens } = assembleContext(plan, null, options(3000))
  t.ok(tokens <= 3000, `${tokens} tokens fit 3000`)
  const tools = messages.filter((m) => m.role === 'tool')
  t.match(tools[0]?.content, /^lorem0 lorem1 .*\n\[agentd: this tool output was cut from \d+ to about 300 tokens/s)
  t.equal(tools[1]?.content, 'small')
  t.equal(history[2]?.content, big, 'the stored message is not rewritten')
})

t.test('when cutting is not enough, older turns are set apart for a summary; the instructions and the latest user message stay', async (t) => {
  const history: MessageRecord[] = []
  for (let i = 0; i < 30; i++) history.push(user(words(40, `q${i}_`)), answer(words(60, `a${i}_`)))
  const latest = user('the latest question')
  history.push(latest)
  const plan = planContext(history, options(2000))
  t.ok(plan.older.length > 0, 'older turns are summarised')
  t.equal(plan.kept.at(-1)?.messages[0], latest)
  t.same([...plan.older, ...plan.kept], plan.view.turns, 'older and kept split the turns at one point')
  const { messages, tokens } = assembleContext(plan, { kind: 'summary', text: 'They talked at length.', messages: plan.kept[0]?.start ?? 0 }, options(2000))
  t.ok(tokens <= 2000 * 0.7 + 100, `${tokens} tokens leave room for the next steps`)
  t.equal(messages[0]?.content, 'You are a careful agent.')
  t.match(messages[1], { role: 'system', content: /^Summary of the earlier conversation \(\d+ messages\).*\nThey talked at length\.$/s })
  t.same(messages.at(-1), { role: 'user', content: 'the latest question' })
})

t.test('a stored summary stands for the messages before the position it names; older summaries are not sent', async (t) => {
  const history = [user('one'), answer('1'), user('two'), answer('2')]
  history.push(message({ role: 'summary', content: 'first summary', replacesMessages: 2 }))
  history.push(user('three'), answer('3'))
  history.push(message({ role: 'summary', content: 'second summary', replacesMessages: 4 }))
  history.push(user('four'))
  const plan = planContext(history, options(10_000))
  t.equal(plan.view.summary?.content, 'second summary')
  const { messages } = assembleContext(plan, { kind: 'summary', text: 'second summary', messages: 4 }, options(10_000))
  t.same(messages.slice(1).map((m) => m.content), [
    'Summary of the earlier conversation (4 messages), written to fit the context window:\nsecond summary', 'three', '3', 'four'
  ])
})

t.test('compacting harder aims at half the budget and cuts every large output', async (t) => {
  const history: MessageRecord[] = []
  for (let i = 0; i < 10; i++) history.push(user(words(20, `q${i}_`)), ...toolTurn([words(100, `out${i}_`)]), answer('ok'))
  history.push(user('go on'))
  const normal = planContext(history, options(4000))
  t.same(normal.older, [], 'the history fits as it is')
  const harder = planContext(history, options(4000, { harder: true }))
  t.ok(harder.cuts.size >= 10, 'every output over 1/40 of the budget is cut')
  t.ok(harder.older.length > 0)
  const { tokens } = assembleContext(harder, { kind: 'truncation', text: '', messages: 0 }, options(4000, { harder: true }))
  t.ok(tokens <= 2100, `${tokens} tokens, about half of 4000`)
})

t.test('a run whose own steps outgrow the window loses its oldest steps, never the user message or the newest step', async (t) => {
  const question = user('do many things')
  const history = [question]
  for (let i = 0; i < 12; i++) history.push(...toolTurn([words(20, `r${i}_`)]))
  const plan = planContext(history, options(600))
  const { messages, droppedTurns, tokens } = assembleContext(plan, null, options(600))
  t.ok(droppedTurns.length > 0)
  t.ok(tokens <= 600, `${tokens} tokens fit`)
  t.same(messages[1], { role: 'user', content: 'do many things' })
  t.match(messages[2], { role: 'system', content: /^\[agentd: \d+ messages of the earlier steps of this request were left out/ })
  t.match(messages.at(-1), { role: 'tool', content: /r11_/ }, 'the newest result is sent')
  t.ok(pairsIntact(messages))
})

t.test('the truncation note keeps the previous summary and the most recent excerpts that fit', async (t) => {
  const history = [user('first question'), answer('first answer'), user(words(500)), answer('last answer')]
  const text = truncationText('what came before', viewOf(history).turns, estimateCounter, 200)
  t.match(text, /^Summary of what came before:\nwhat came before\n\nThe most recent of them, cut short:\n/)
  t.match(text, /assistant: last answer$/)
  t.ok(estimateCounter.count(text) <= 200)
})

t.test('whatever the history and the budget, a tool call and its results are never split and the latest user message stays', async (t) => {
  const turn = fc.oneof(
    fc.record({ kind: fc.constant('user' as const), size: fc.integer({ min: 1, max: 300 }) }),
    fc.record({ kind: fc.constant('answer' as const), size: fc.integer({ min: 1, max: 300 }) }),
    fc.record({ kind: fc.constant('tools' as const), sizes: fc.array(fc.integer({ min: 1, max: 2000 }), { minLength: 1, maxLength: 4 }) })
  )
  fc.assert(fc.property(fc.array(turn, { minLength: 1, maxLength: 40 }), fc.integer({ min: 256, max: 8000 }), fc.boolean(), (turns, budget, harder) => {
    const history: MessageRecord[] = []
    for (const item of turns) {
      if (item.kind === 'user') history.push(user(words(item.size, 'u')))
      else if (item.kind === 'answer') history.push(answer(words(item.size, 'a')))
      else history.push(...toolTurn(item.sizes.map((n) => words(n, 'o'))))
    }
    history.push(user('latest'))
    const opts = options(budget, { harder })
    const plan = planContext(history, opts)
    const bridge = plan.older.length > 0 ? { kind: 'truncation' as const, text: truncationText(null, plan.older, estimateCounter, plan.bridgeTokens), messages: 0 } : null
    const { messages, tokens } = assembleContext(plan, bridge, opts)
    return pairsIntact(messages) &&
      messages.some((m) => m.role === 'user' && m.content === 'latest') &&
      messages[0]?.content === 'You are a careful agent.' &&
      tokens === tokensOf(messages) + 3
  }), { numRuns: 300 })
  t.pass('300 random histories')
})

t.test('a stored summary whose messages a request no longer needs is still the one sent', async (t) => {
  const history = [user('a'), answer('b'), message({ role: 'summary', content: 'S', replacesMessages: 2 }), user('c')]
  const view = viewOf(history)
  t.same(view.turns.map((turn) => turn.messages[0]?.content), ['c'])
  t.equal(view.turns[0]?.start, 3, 'positions count every stored message, the summary too')
})

t.test('OpenAI model names are counted by their tokenizer, other models by the documented estimate', async (t) => {
  const gpt4o = await tokenCounterFor('gpt-4o-mini')
  t.equal(gpt4o.encoding, 'o200k_base')
  t.equal(gpt4o.count('hello world'), 2)
  t.equal(gpt4o.count('a <|endoftext|> b') > 3, true, 'special tokens are counted as text, not refused')
  t.equal((await tokenCounterFor('gpt-4-turbo')).encoding, 'cl100k_base')
  t.equal((await tokenCounterFor('gpt-3.5-turbo')).count('hello world'), 2)
  const llama = await tokenCounterFor('llama3.1:8b')
  t.equal(llama.encoding, 'estimate')
  t.equal(llama.count('hello world'), 4, '11 bytes / 3, rounded up')
  t.equal(llama.count('日本語'), 3, '9 bytes of UTF-8')
})

t.test('bytes bound every tokenizer\'s count, so a history whose bytes fit is sent without counting tokens', async (t) => {
  const counters = [await tokenCounterFor('gpt-4o'), await tokenCounterFor('gpt-4'), estimateCounter]
  fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 200 }), (text) =>
    counters.every((counter) => counter.count(text) <= byteCounter.count(text))), { numRuns: 500 })
  t.pass('500 random Unicode strings')
})
