import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { undeclaredDataFields, undocumentedEvents, validatorOf } from '../helpers/event-document.ts'
import { readSse, type StreamedEvent } from '../helpers/sse.ts'

t.test('every event a run emits matches the document\'s Event union, in the JSON page and on the SSE stream', async (t) => {
  const validate = validatorOf('Event')
  const { app, devModel } = await buildTestApp(t, { retryPolicy: { baseMs: 1, capMs: 2 } })
  const base = await listen(app)
  const post = (url: string, payload?: object) => app.inject({ method: 'POST', url, ...(payload ? { payload } : {}) })
  const ask = { type: 'client', name: 'ask', description: 'ask the user', parameters: { type: 'object', properties: { q: { type: 'string' } } } }
  const session = (await post('/v1/sessions', { tools: ['fs_read', 'fs_write', ask], approval: { mode: 'tools', tools: ['fs_write'] } })).json()
  const s = `/v1/sessions/${session.id}`

  // One run with a retry, reasoning, a tool that fails, one that needs approval, and a client tool.
  devModel.script(
    { status: 503 },
    { toolCalls: [{ name: 'fs_read', arguments: { path: 'missing.txt' } }] },
    { toolCalls: [{ name: 'fs_write', arguments: { path: 'a.txt', content: 'x' } }] },
    { toolCalls: [{ name: 'ask', arguments: { q: 'colour?' } }] },
    { reasoning: 'let me think', text: 'all done' }
  )
  t.equal((await post(`${s}/messages`, { content: 'go' })).statusCode, 202)
  const stream = readSse(`${base}${s}/events?until=done`, {
    timeoutMs: 20_000,
    stopWhen: (e) => {
      if (e.type === 'permission_required') void post(`${s}/approvals/${e.data.call.id}`, { decision: 'allow' })
      if (e.type === 'tool_result_required') void post(`${s}/tool-results/${e.data.call.id}`, { output: 'blue' })
      return false
    }
  })
  const sse = await stream
  t.equal(sse.events.at(-1)?.type, 'done')
  const types = new Set(sse.events.map((e) => e.type))
  for (const type of ['model_retry', 'think_chunk', 'text_chunk', 'tool:start', 'tool:error', 'error', 'tool_executed', 'tool:end',
    'permission_required', 'permission_decided', 'tool_result_required', 'state_changed', 'step_complete', 'token_usage', 'done']) {
    t.ok(types.has(type), `the run emitted ${type}`)
  }

  const page = (await app.inject({ method: 'GET', url: `${s}/events?limit=1000`, headers: { accept: 'application/json' } })).json()
  t.same(page.data, sse.events, 'the JSON page sends the same events as the stream, field for field')
  for (const event of page.data as StreamedEvent[]) {
    t.ok(validate(event), `${event.seq} ${event.type} matches Event${validate.errors ? `: ${JSON.stringify(validate.errors.slice(0, 3))}` : ''}`)
  }
  t.same(undeclaredDataFields(page.data), [], 'every data field is declared')
})

t.test('a tool\'s own tool:<kind> event matches ToolProgressEvent, and a fixed type with the wrong data matches nothing', async (t) => {
  const validate = validatorOf('Event')
  const base = { seq: 3, sessionId: 'ses_x', runId: 'run_x', channel: 'progress', at: new Date().toISOString(), requestId: 'req_x' }
  t.ok(validate({ ...base, type: 'tool:progress', data: { callId: 'call_1', name: 'fetch', percent: 40 } }), 'tool:progress')
  t.notOk(validate({ ...base, type: 'tool:start', data: { callId: 'call_1', name: 'fetch' } }), 'tool:start needs its call')
  t.notOk(validate({ ...base, type: 'done', data: { step: 1, reason: 'bored', runId: 'run_x' } }), 'done with an unknown reason')
  t.notOk(validate({ ...base, channel: 'monitor', type: 'done', data: { step: 1, reason: 'completed', runId: 'run_x' } }), 'done on the wrong channel')
})

t.test('a compaction\'s context_compacted and the summarising call\'s token_usage carry only fields the document declares', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  devModel.setContextLimit(2400)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [], limits: { contextTokens: 1500 } } })).json()
  const words = 'the quick brown fox jumps over the lazy dog and then '.repeat(19)
  for (let i = 0; i < 12; i++) {
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: `turn ${i}: ${words}` } })
  }
  const events: StreamedEvent[] = (await app.inject({
    method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' }
  })).json().data
  t.ok(events.some((e) => e.type === 'context_compacted' && e.data.method === 'summary'), 'the history was summarised')
  t.ok(events.some((e) => e.type === 'token_usage' && e.data.purpose === 'summary'), 'the summarising call reported its tokens')
  t.same(undocumentedEvents(events), [], 'every event matches the document')
  t.same(undeclaredDataFields(events), [], 'and declares every field it carries')
})
