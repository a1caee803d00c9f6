import t from 'tap'
import { buildTestApp } from '../helpers/app.ts'

const KEY_A = 'key-of-tenant-a-0123456789abcdef'
const KEY_B = 'key-of-tenant-b-0123456789abcdef'

t.test("GET /v1/sessions/{id}/tool-calls pages a session's calls with input, state, result or error, duration, run and request", async (t) => {
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `a:${KEY_A},b:${KEY_B}` } })
  const asA = { authorization: `Bearer ${KEY_A}` }
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', headers: asA, payload: {} })).json()
  devModel.script(
    { toolCalls: [{ name: 'fs_write', arguments: { path: 'a.txt', content: 'one' } }, { name: 'fs_read', arguments: { path: 'missing.txt' } }] },
    { toolCalls: [{ name: 'fs_read', arguments: { path: 'a.txt' } }] },
    { text: 'done' }
  )
  const { run } = (await app.inject({
    method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, headers: { ...asA, 'x-request-id': 'req-audit-1' }, payload: { content: 'work' }
  })).json()
  t.equal(run.status, 'completed')

  const url = `/v1/sessions/${session.id}/tool-calls`
  const first = await app.inject({ method: 'GET', url: `${url}?limit=2`, headers: asA })
  t.equal(first.statusCode, 200)
  const page1 = first.json()
  t.equal(page1.data.length, 2)
  t.type(page1.nextCursor, 'string')
  t.match(page1.data[0], {
    id: /^call_/, sessionId: session.id, runId: run.id, requestId: 'req-audit-1', step: 1, name: 'fs_write',
    input: { path: 'a.txt', content: 'one' }, state: 'completed', startedAt: String, endedAt: String, durationMs: Number
  })
  t.ok('result' in page1.data[0], 'a completed call has its result')
  t.match(page1.data[1], { name: 'fs_read', state: 'failed', error: { errorType: 'logical', code: 'NOT_FOUND' } })
  t.notOk('result' in page1.data[1], 'a failed call has its error, no result')

  const page2 = (await app.inject({ method: 'GET', url: `${url}?limit=2&cursor=${page1.nextCursor}`, headers: asA })).json()
  t.equal(page2.data.length, 1)
  t.match(page2.data[0], { name: 'fs_read', step: 2, state: 'completed', result: { content: 'one' } })
  t.equal(page2.nextCursor, null, 'the last page says so')

  const other = await app.inject({ method: 'GET', url, headers: { authorization: `Bearer ${KEY_B}` } })
  t.equal(other.statusCode, 404, "another tenant's session is not found")
  t.equal(other.json().error.code, 'SESSION_NOT_FOUND')
  t.equal((await app.inject({ method: 'GET', url })).statusCode, 401, 'no key, no audit')
})

t.test('a cursor the API did not return and a bad limit are 400 VALIDATION_ERROR', async (t) => {
  const { app } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  const empty = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json()
  t.same(empty, { data: [], nextCursor: null })
  for (const query of ['cursor=not-a-cursor', 'limit=0', 'limit=101', 'colour=blue']) {
    const res = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls?${query}` })
    t.equal(res.statusCode, 400, query)
    t.equal(res.json().error.code, 'VALIDATION_ERROR', query)
  }
  t.equal((await app.inject({ method: 'GET', url: '/v1/sessions/ses_00000000000000000000000000/tool-calls' })).statusCode, 404)
})

/** A session with one client tool whose run waits for it; resolves once tool_result_required is stored. */
async function awaitingClientTool(app: import('fastify').FastifyInstance, devModel: { script(...steps: unknown[]): void }) {
  const spec = { type: 'client', name: 'read_sensor', description: 'Reads a sensor', parameters: { type: 'object', properties: {} } }
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [spec] } })).json()
  devModel.script({ toolCalls: [{ name: 'read_sensor', arguments: {} }] }, { text: 'read it' })
  const { run } = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'read' } })).json()
  for (let i = 0; i < 500; i++) {
    const required = (await app.inject({
      method: 'GET', url: `/v1/sessions/${session.id}/events?types=tool_result_required`, headers: { accept: 'application/json' }
    })).json().data[0]
    if (required) return { session, run, callId: required.data.call.id as string }
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
  throw new Error('the run never asked for the client tool')
}

t.test("a client tool's output is cut like any tool's, with a note, in what the model reads and in the audit", async (t) => {
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_TOOL_MAX_OUTPUT_BYTES: '2000' } })
  const { session, run, callId } = await awaitingClientTool(app, devModel)
  const posted = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/tool-results/${callId}`, payload: { output: { samples: 'x'.repeat(200_000) } } })
  t.equal(posted.statusCode, 200)
  t.equal((await app.agentd.runs.waitFor(session.id, run.id))?.status, 'completed')
  const note = /\[output truncated: showing the first \d+ of 200\d{3} bytes\]$/
  const sent = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  const toolMessage = sent.messages.find((m) => m.role === 'tool')
  t.ok(toolMessage && toolMessage.content.length < 3000, `the model read ${toolMessage?.content.length} characters, not 200 000`)
  t.match(toolMessage?.content, note)
  const audited = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json().data[0]
  t.match(audited, { id: callId, state: 'completed', result: note })
})

t.test("a client tool's {ok: false} output is the tool's logical failure, classified with the client's own code and advice", async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const { session, run, callId } = await awaitingClientTool(app, devModel)
  const failure = { ok: false, code: 'NOT_FOUND', error: 'no sensor named s9', recommendations: ['List the sensors with list_sensors first.'], sensor: 's9' }
  const posted = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/tool-results/${callId}`, payload: { output: failure } })
  t.equal(posted.statusCode, 200)
  t.equal((await app.agentd.runs.waitFor(session.id, run.id))?.status, 'completed', 'the run goes on, as after any non-fatal tool error')
  const expected = {
    errorType: 'logical', code: 'NOT_FOUND', message: 'no sensor named s9', retryable: true,
    recommendations: ['List the sensors with list_sensors first.'], detail: { sensor: 's9' }
  }
  const sent = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  t.match(JSON.parse(sent.messages.find((m) => m.role === 'tool')?.content ?? 'null'), { ok: false, error: 'no sensor named s9', errorType: 'logical', code: 'NOT_FOUND' })
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=tool:error`, headers: { accept: 'application/json' } })).json().data
  t.match(events[0]?.data, { call: { id: callId, state: 'failed' }, error: expected })
  const audited = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json().data[0]
  t.match(audited, { id: callId, state: 'failed', error: expected })
})
