import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { buildTestApp, createSession, sendAndWait, type TestApp } from '../../helpers/app.ts'
import { undocumentedEvents } from '../../helpers/event-document.ts'
import type { StreamedEvent } from '../../helpers/sse.ts'

type Sent = { role: string; content: string | null; tool_calls?: Array<{ id: string }>; tool_call_id?: string }

const sentence = 'the quick brown fox jumps over the lazy dog and then '
/** About `n` tokens of plain English (one token a word for OpenAI's tokenizers), tagged so it can be found again. */
const prose = (tag: string, n: number) => `${tag}: ${sentence.repeat(Math.ceil(n / 11))}`.trim()

async function eventsOf(ctx: TestApp, sessionId: string): Promise<StreamedEvent[]> {
  const events: StreamedEvent[] = []
  for (let after = 0; ;) {
    const page = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/events?after=${after}&limit=1000`, headers: { accept: 'application/json' } })).json()
    events.push(...page.data)
    if (page.data.length < 1000) return events
    after = page.nextAfter
  }
}

async function messagesOf(ctx: TestApp, sessionId: string): Promise<Array<{ role: string; content: string | null; replacesMessages?: number }>> {
  return (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/messages` })).json().data
}

const isSummaryRequest = (messages: Sent[]) => messages[0]?.role === 'system' && /^You summarise/.test(messages[0].content ?? '')

/** Every call in the request is answered right after it, and no result comes without its call. */
function pairsIntact(messages: Sent[]): boolean {
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i] as Sent
    if (m.role === 'assistant' && m.tool_calls) {
      const answered = messages.slice(i + 1, i + 1 + m.tool_calls.length).map((r) => r.tool_call_id)
      if (m.tool_calls.some((call) => !answered.includes(call.id))) return false
    }
    if (m.role === 'tool') {
      const owner = messages.slice(0, i).findLast((p) => p.role !== 'tool')
      if (!owner?.tool_calls?.some((call) => call.id === m.tool_call_id)) return false
    }
  }
  return true
}

t.test('a session driven past ten times its window keeps answering, with summaries it writes once and reuses', async (t) => {
  const ctx = await buildTestApp(t)
  ctx.devModel.setContextLimit(2400)
  const sessionId = await createSession(ctx, { instructions: 'Answer briefly.', tools: [], limits: { contextTokens: 1500 } })
  const turns = 40
  for (let i = 0; i < turns; i++) {
    const { run, message } = await sendAndWait(ctx, sessionId, prose(`turn ${i}`, 200))
    t.equal(run.status, 'completed', `turn ${i} completes`)
    t.match(message.content, new RegExp(`^You said: turn ${i}:`), `turn ${i} is answered`)
  }

  const messages = await messagesOf(ctx, sessionId)
  const conversation = messages.filter((m) => m.role !== 'summary')
  t.equal(conversation.length, turns * 2, 'GET …/messages still returns every message')
  t.same(conversation.map((m) => m.role), Array.from({ length: turns }, () => ['user', 'assistant']).flat())
  const storedTokens = conversation.reduce((sum, m) => sum + (m.content ?? '').split(' ').length, 0)
  t.ok(storedTokens > 10 * 1500, `the conversation holds ${storedTokens} words, over ten windows of 1500 tokens`)

  const summaries = messages.filter((m) => m.role === 'summary')
  t.ok(summaries.length > 0, 'summaries are stored as messages')
  for (const summary of summaries) {
    t.match(summary, { content: /^Summary: the user said turn \d+/, replacesMessages: Number })
    t.ok(messages.indexOf(summary) > (summary.replacesMessages ?? 0), 'a summary stands for messages stored before it')
  }

  const requests = ctx.devModel.requests.map((r) => r.body.messages as Sent[])
  const summaryRequests = requests.filter(isSummaryRequest)
  t.equal(summaryRequests.length, summaries.length, 'one summary request per stored summary')
  t.ok(summaries.length < turns / 2, `${summaries.length} summaries for ${turns} runs: later calls reuse them`)
  const last = requests.at(-1) as Sent[]
  t.match(last[0], { role: 'system', content: 'Answer briefly.' }, 'the instructions always stay')
  t.match(last[1], { role: 'system', content: /^Summary of the earlier conversation \(\d+ messages\)/ })
  t.match(last.at(-1), { role: 'user', content: /^turn 39:/ }, 'the latest user message always stays')

  const events = await eventsOf(ctx, sessionId)
  t.same(undocumentedEvents(events), [], 'every event, context_compacted included, matches the OpenAPI document')
  const compactions = events.filter((e) => e.type === 'context_compacted')
  t.equal(compactions.filter((e) => e.data.method === 'summary').length, summaries.length)
  const usages = events.filter((e) => e.type === 'token_usage')
  t.equal(usages.filter((e) => e.data.purpose === 'summary').length, summaries.length, 'each summarising call reports its tokens')
  const session = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}` })).json()
  t.equal(session.usage.totalTokens, usages.reduce((sum, e) => sum + e.data.totalTokens, 0), 'and the session usage counts them')
  for (const e of compactions) {
    t.equal(e.channel, 'monitor')
    t.match(e.data, { step: 1, removedMessages: Number, tokensBefore: Number, tokensAfter: Number, budget: 1500 })
    t.ok(e.data.tokensAfter <= 1500 && e.data.tokensBefore > 1500, `${e.data.tokensBefore} → ${e.data.tokensAfter} tokens`)
  }

  const fork = (await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${sessionId}/fork`, payload: {} })).json()
  const forked = await messagesOf(ctx, fork.id)
  t.same(forked.map((m) => [m.role, m.replacesMessages]), messages.map((m) => [m.role, m.replacesMessages]), 'a fork keeps the summaries and what they stand for')
  const before = ctx.devModel.requests.length
  t.equal((await sendAndWait(ctx, fork.id, 'short')).run.status, 'completed')
  const forkRequests = ctx.devModel.requests.slice(before).map((r) => r.body.messages as Sent[])
  t.equal(forkRequests.length, 1, 'the fork reuses the stored summary instead of summarising again')
  t.equal(forkRequests[0]?.[1]?.content, last[1]?.content)
})

t.test('when the summary call fails, the run truncates instead, says so in a monitor warn, and goes on', async (t) => {
  const ctx = await buildTestApp(t)
  ctx.devModel.setContextLimit(2400)
  const sessionId = await createSession(ctx, { tools: [], limits: { contextTokens: 1500 } })
  for (let i = 0; i < 2; i++) t.equal((await sendAndWait(ctx, sessionId, prose(`early ${i}`, 250))).run.status, 'completed')

  ctx.devModel.script({ status: 500 })
  const { run, message } = await sendAndWait(ctx, sessionId, prose('late', 700))
  t.equal(run.status, 'completed', 'the run goes on')
  t.match(message.content, /^You said: late:/)

  const events = (await eventsOf(ctx, sessionId)).filter((e) => e.runId === run.id)
  const warn = events.find((e) => e.type === 'error')
  t.match(warn?.data, {
    severity: 'warn', phase: 'model',
    detail: { code: 'SUMMARY_FAILED', fatal: false, errorType: 'runtime', detail: { cause: { code: 'SERVER_ERROR' } } }
  })
  t.match(warn?.data.message, /^Summarising 4 earlier messages failed \(SERVER_ERROR: .*\); they were truncated instead$/)
  t.notOk(events.some((e) => e.type === 'model_retry'), 'the summary is not retried: truncation is the fallback')
  t.match(events.find((e) => e.type === 'context_compacted')?.data, { method: 'truncation', removedMessages: 4, summaryMessageId: null })

  const sent = ctx.devModel.requests.at(-1)?.body.messages as Sent[]
  t.match(sent[0], { role: 'system', content: /^\[agentd: the earlier conversation \(4 messages\) was left out to fit the context window; no summary could be written\]\nThe most recent of them, cut short:\nuser: early 1: the quick.*\nassistant: You said: early 1: the quick/s })
  t.match(sent.at(-1), { role: 'user', content: /^late:/ })
  t.notOk((await messagesOf(ctx, sessionId)).some((m) => m.role === 'summary'), 'a truncation is not stored')

  const next = await sendAndWait(ctx, sessionId, prose('later', 700))
  t.equal(next.run.status, 'completed')
  t.ok((await messagesOf(ctx, sessionId)).some((m) => m.role === 'summary'), 'the next compaction summarises again')
})

t.test('large tool outputs are cut before anything is summarised, and a tool call is never sent without its result', async (t) => {
  const ctx = await buildTestApp(t)
  ctx.devModel.setContextLimit(4000)
  const sessionId = await createSession(ctx, { tools: ['fs_read'], limits: { contextTokens: 2000 } })
  const workspace = join(ctx.dir, 'workspaces', sessionId)
  mkdirSync(workspace, { recursive: true })
  writeFileSync(join(workspace, 'big.txt'), prose('big file', 1500))
  writeFileSync(join(workspace, 'small.txt'), 'a small file')
  for (let i = 0; i < 12; i++) {
    const { run } = await sendAndWait(ctx, sessionId, `round ${i}: call fs_read {"path":"big.txt"} call fs_read {"path":"small.txt"}`)
    t.equal(run.status, 'completed', `round ${i} completes`)
  }

  const requests = ctx.devModel.requests.map((r) => r.body.messages as Sent[]).filter((m) => !isSummaryRequest(m))
  t.equal(requests.length, 24, 'two model calls a round')
  t.ok(requests.every(pairsIntact), 'every request pairs each tool call with its results')
  const events = await eventsOf(ctx, sessionId)
  const compactions = events.filter((e) => e.type === 'context_compacted')
  t.equal(compactions[0]?.data.method, 'tool_outputs', 'the first compaction only cuts tool outputs')
  t.ok(compactions.some((e) => e.data.method === 'summary'), 'later, older turns are summarised')
  const cut = requests.at(-1)?.filter((m) => m.role === 'tool' && /this tool output was cut/.test(m.content ?? '')) ?? []
  t.ok(cut.length > 0, 'the model reads a note where an output was cut')
  const stored = (await messagesOf(ctx, sessionId)).filter((m) => m.role === 'tool')
  t.equal(stored.length, 24)
  t.notOk(stored.some((m) => /this tool output was cut/.test(m.content ?? '')), 'stored tool results are whole')
})

t.test('when the provider still refuses the request as too long, the loop compacts harder once and retries', async (t) => {
  const ctx = await buildTestApp(t)
  // The dev model counts about 1.2 of its tokens per word here; the budget counts one.
  const sessionId = await createSession(ctx, { tools: [], limits: { contextTokens: 3000 } })
  for (let i = 0; i < 5; i++) t.equal((await sendAndWait(ctx, sessionId, prose(`part ${i}`, 250))).run.status, 'completed')
  ctx.devModel.setContextLimit(3200)

  const { run } = await sendAndWait(ctx, sessionId, prose('final', 250))
  t.equal(run.status, 'completed')
  const requests = ctx.devModel.requests.map((r) => r.body.messages as Sent[])
  t.ok(requests.at(-3)?.some((m) => m.content?.startsWith('part 0:')), 'the first attempt sent the whole history')
  t.ok(isSummaryRequest(requests.at(-2) ?? []), 'then a summary was written')
  t.notOk(requests.at(-1)?.some((m) => m.content?.startsWith('part 0:')), 'and the retry sent it instead of the oldest turns')
  const events = (await eventsOf(ctx, sessionId)).filter((e) => e.runId === run.id)
  t.match(events.find((e) => e.type === 'context_compacted')?.data, { method: 'summary', harder: true })
  t.notOk(events.some((e) => e.type === 'error'))
})

t.test('when even the harder compaction is refused, the run fails with CONTEXT_LENGTH_EXCEEDED and a recommendation', async (t) => {
  const ctx = await buildTestApp(t)
  ctx.devModel.setContextLimit(100)
  const sessionId = await createSession(ctx, { tools: [], limits: { contextTokens: 5000 } })
  const { run } = await sendAndWait(ctx, sessionId, prose('too long for this model', 400))
  t.equal(run.status, 'failed')
  t.match(run.error, { code: 'CONTEXT_LENGTH_EXCEEDED', errorType: 'runtime', fatal: true })
  t.ok(run.error.recommendations.some((r: string) => /limits\.contextTokens/.test(r)), 'recommends lowering limits.contextTokens')
  const types = (await eventsOf(ctx, sessionId)).map((e) => e.type)
  t.same(types.slice(-3), ['error', 'state_changed', 'done'])
  t.equal(ctx.devModel.requests.length, 2, 'one retry, not more')
})

t.test('limits.contextTokens is validated like every other limit', async (t) => {
  const ctx = await buildTestApp(t)
  const res = await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: { limits: { contextTokens: 10 } } })
  t.equal(res.statusCode, 400)
  t.match(res.json().error, { code: 'VALIDATION_ERROR', details: { fields: [{ field: /contextTokens/ }] } })
  const ok = await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: { limits: { contextTokens: 32000 } } })
  t.same(ok.json().limits, { contextTokens: 32000 })
})
