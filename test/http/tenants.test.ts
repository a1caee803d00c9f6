import t from 'tap'
import { buildTestApp, type TapTest } from '../helpers/app.ts'
import type { StreamedEvent } from '../helpers/sse.ts'

const KEY_A = 'key-of-tenant-a-0123456789abcdef'
const KEY_B = 'key-of-tenant-b-0123456789abcdef'
const UNKNOWN_SESSION = 'ses_00000000000000000000000000'

type Res = { statusCode: number; headers: Record<string, unknown>; json(): any }

t.test("a tenant cannot see or touch another tenant's session: every route answers 404 SESSION_NOT_FOUND", async (t) => {
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `a:${KEY_A},b:${KEY_B}`, AGENTD_RATE_LIMIT_MAX: '0' } })
  const as = (key: string) => (method: 'GET' | 'POST' | 'DELETE', url: string, payload?: object, headers: Record<string, string> = {}) =>
    app.inject({ method, url, headers: { authorization: `Bearer ${key}`, ...headers }, ...(payload ? { payload } : {}) })
  const asA = as(KEY_A)
  const asB = as(KEY_B)

  const waitFor = async (sessionId: string, type: string) => {
    for (let i = 0; i < 300; i++) {
      const page = (await asA('GET', `/v1/sessions/${sessionId}/events?types=${type}`, undefined, { accept: 'application/json' })).json()
      if (page.data.length > 0) return page.data.at(-1) as StreamedEvent
      await new Promise((resolve) => setTimeout(resolve, 10))
    }
    throw new Error(`no ${type} event`)
  }

  // Tenant a's session waits first for an approval, then for a client tool result, so that each
  // of b's attempts would have succeeded if the session were b's.
  const ask = { type: 'client', name: 'ask', description: 'Ask the user', parameters: { type: 'object', properties: { q: { type: 'string' } } } }
  const session = (await asA('POST', '/v1/sessions', { tools: [ask], approval: { mode: 'always' } })).json()
  devModel.script({ toolCalls: [{ name: 'ask', arguments: { q: 'colour?' } }] }, { text: 'blue it is' })
  const accepted = await asA('POST', `/v1/sessions/${session.id}/messages`, { content: 'pick a colour' })
  t.equal(accepted.statusCode, 202)
  const run = accepted.json().run
  const callId = (await waitFor(session.id, 'permission_required')).data.call.id as string
  const s = `/v1/sessions/${session.id}`

  /** b's answer for a's session must be exactly what it gets for a session that does not exist. */
  async function assertHidden(t: TapTest, label: string, res: Res, twin: Res) {
    t.equal(res.statusCode, 404, `${label}: 404, not 403`)
    t.equal(res.json().error?.code, 'SESSION_NOT_FOUND', `${label}: SESSION_NOT_FOUND`)
    t.equal(res.json().error.message, twin.json().error.message.replace(UNKNOWN_SESSION, session.id), `${label}: same answer as an unknown session`)
  }

  /** Each operation under /v1/sessions/{id}, as b tries it on a's session (and on an unknown one). */
  const attempts: Array<{ operation: string; when: 'approval' | 'tool_result'; send: (base: string) => Promise<Res> }> = [
    { operation: 'GET /v1/sessions/{id}', when: 'approval', send: (base) => asB('GET', base) },
    { operation: 'GET /v1/sessions/{id}/messages', when: 'approval', send: (base) => asB('GET', `${base}/messages`) },
    { operation: 'POST /v1/sessions/{id}/messages', when: 'approval', send: (base) => asB('POST', `${base}/messages`, { content: 'hijack', onBusy: 'interrupt' }) },
    {
      operation: 'POST /v1/sessions/{id}/messages (SSE)', when: 'approval',
      send: (base) => asB('POST', `${base}/messages`, { content: 'hijack', onBusy: 'enqueue' }, { accept: 'text/event-stream' })
    },
    { operation: 'GET /v1/sessions/{id}/runs/{runId}', when: 'approval', send: (base) => asB('GET', `${base}/runs/${run.id}`) },
    { operation: 'GET /v1/sessions/{id}/tool-calls', when: 'approval', send: (base) => asB('GET', `${base}/tool-calls`) },
    { operation: 'GET /v1/sessions/{id}/events', when: 'approval', send: (base) => asB('GET', `${base}/events`, undefined, { accept: 'application/json' }) },
    { operation: 'GET /v1/sessions/{id}/events (SSE)', when: 'approval', send: (base) => asB('GET', `${base}/events`, undefined, { accept: 'text/event-stream' }) },
    { operation: 'POST /v1/sessions/{id}/fork', when: 'approval', send: (base) => asB('POST', `${base}/fork`, {}) },
    { operation: 'POST /v1/sessions/{id}/stream-tokens', when: 'approval', send: (base) => asB('POST', `${base}/stream-tokens`) },
    { operation: 'POST /v1/sessions/{id}/interrupt', when: 'approval', send: (base) => asB('POST', `${base}/interrupt`) },
    { operation: 'POST /v1/sessions/{id}/approvals/{callId}', when: 'approval', send: (base) => asB('POST', `${base}/approvals/${callId}`, { decision: 'allow' }) },
    { operation: 'POST /v1/sessions/{id}/tool-results/{callId}', when: 'tool_result', send: (base) => asB('POST', `${base}/tool-results/${callId}`, { output: 'red' }) },
    { operation: 'DELETE /v1/sessions/{id}', when: 'tool_result', send: (base) => asB('DELETE', base) }
  ]

  t.test('every /v1/sessions/{id} operation of the OpenAPI document is tried here', async (t) => {
    const doc = (await app.inject({ method: 'GET', url: '/openapi.json' })).json() as { paths: Record<string, Record<string, unknown>> }
    const served = Object.entries(doc.paths)
      .filter(([path]) => path.startsWith('/v1/sessions/{id}'))
      .flatMap(([path, operations]) => Object.keys(operations).map((method) => `${method.toUpperCase()} ${path}`))
    const tried = new Set(attempts.map((a) => a.operation))
    for (const operation of served) t.ok(tried.has(operation), `${operation} is tried (add it to the attempts when a route is added)`)
  })

  t.test('while the run waits for an approval', async (t) => {
    const messagesBefore = (await asA('GET', `${s}/messages`)).json().data
    for (const attempt of attempts.filter((a) => a.when === 'approval')) {
      await assertHidden(t, attempt.operation, await attempt.send(s), await attempt.send(`/v1/sessions/${UNKNOWN_SESSION}`))
    }
    const mine = (await asA('GET', s)).json()
    t.equal(mine.status, 'awaiting_approval', "a's run still waits: b neither interrupted nor decided it")
    t.same((await asA('GET', `${s}/messages`)).json().data, messagesBefore, 'b added no message')
    t.equal((await asA('GET', '/v1/sessions')).json().data.length, 1, 'b forked nothing into a')
    t.same((await asB('GET', '/v1/sessions')).json().data, [], 'b owns no session, forked or other')
    t.equal((await asA('POST', `${s}/approvals/${callId}`, { decision: 'allow' })).statusCode, 200, 'a decides its own call')
  })

  t.test('while the run waits for the client tool result', async (t) => {
    await waitFor(session.id, 'tool_result_required')
    for (const attempt of attempts.filter((a) => a.when === 'tool_result')) {
      await assertHidden(t, attempt.operation, await attempt.send(s), await attempt.send(`/v1/sessions/${UNKNOWN_SESSION}`))
    }
    t.equal((await asA('GET', s)).json().status, 'awaiting_tool_result', "a's session is still there and still waits")
    t.equal((await asA('POST', `${s}/tool-results/${callId}`, { output: 'blue' })).statusCode, 200, 'a delivers its own result')
    t.equal((await app.agentd.runs.waitFor(session.id, run.id))?.status, 'completed')
  })

  t.test("a's sessions are absent from b's list, and present in a's", async (t) => {
    const mine = (await asB('POST', '/v1/sessions', { tools: [] })).json()
    t.same((await asB('GET', '/v1/sessions')).json().data.map((x: { id: string }) => x.id), [mine.id])
    t.same((await asA('GET', '/v1/sessions')).json().data.map((x: { id: string }) => x.id), [session.id])
  })
})

t.test('Idempotency-Keys are per tenant: the same key from another tenant is a new request', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `a:${KEY_A},b:${KEY_B}` } })
  const create = (key: string) => app.inject({
    method: 'POST', url: '/v1/sessions', payload: { tools: [] },
    headers: { authorization: `Bearer ${key}`, 'idempotency-key': 'the-same-key' }
  })
  const first = await create(KEY_A)
  t.equal(first.statusCode, 201)
  const other = await create(KEY_B)
  t.equal(other.statusCode, 201)
  t.not(other.json().id, first.json().id, "b does not get a's session")
  t.notOk(other.headers['idempotent-replayed'], "b's request is not a replay")
  const again = await create(KEY_A)
  t.equal(again.json().id, first.json().id, 'a still gets its own answer again')
})
