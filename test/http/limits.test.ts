import { writeFileSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { readSse } from '../helpers/sse.ts'

t.test('sessions per tenant', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_MAX_SESSIONS_PER_TENANT: '2' } })
  const first = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })
  const third = await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })
  t.equal(third.statusCode, 429)
  t.match(third.json().error, { code: 'LIMIT_EXCEEDED', retryable: true, details: { limit: 'sessionsPerTenant', max: 2 } })
  t.match(third.headers['retry-after'], /^[1-9][0-9]*$/, 'a 429 says when to come back (Retry-After)')
  t.equal((await app.inject({ method: 'POST', url: `/v1/sessions/${first.id}/fork` })).statusCode, 429, 'a fork is a session too')
  await app.inject({ method: 'DELETE', url: `/v1/sessions/${first.id}` })
  t.equal((await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).statusCode, 201, 'room again after a delete')
})

t.test('sessions per tenant hold when many are created at once', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_MAX_SESSIONS_PER_TENANT: '3' } })
  const first = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  // Room for two more; eight creations and four forks at once.
  const answers = await Promise.all([
    ...Array.from({ length: 8 }, () => app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })),
    ...Array.from({ length: 4 }, () => app.inject({ method: 'POST', url: `/v1/sessions/${first.id}/fork` }))
  ])
  t.equal(answers.filter((a) => a.statusCode === 201).length, 2, 'two got in')
  const refused = answers.filter((a) => a.statusCode !== 201)
  t.ok(refused.every((a) => a.statusCode === 429 && a.json().error.code === 'LIMIT_EXCEEDED'), 'the others: 429 LIMIT_EXCEEDED')
  t.match(refused[0]?.json().error, { details: { limit: 'sessionsPerTenant', max: 3 } })
  t.equal((await app.inject({ method: 'GET', url: '/v1/sessions?limit=100' })).json().data.length, 3, 'the tenant holds three')
  const ready = await app.inject({ method: 'GET', url: '/readyz' })
  t.equal(ready.statusCode, 200, 'a refusal at the limit is not the store failing')
})

t.test('active runs per tenant', async (t) => {
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_MAX_ACTIVE_RUNS_PER_TENANT: '1' } })
  const a = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const b = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ text: 'slow', delayMs: 300 }, { text: 'later' })
  const running = (await app.inject({ method: 'POST', url: `/v1/sessions/${a.id}/messages`, payload: { content: 'x' } })).json()
  const refused = await app.inject({ method: 'POST', url: `/v1/sessions/${b.id}/messages`, payload: { content: 'y' } })
  t.equal(refused.statusCode, 429)
  t.match(refused.json().error, { code: 'LIMIT_EXCEEDED', details: { limit: 'activeRunsPerTenant' } })
  t.match(refused.headers['retry-after'], /^[1-9][0-9]*$/, 'a 429 says when to come back (Retry-After)')
  await app.agentd.runs.waitFor(a.id, running.run.id)
  t.equal((await app.inject({ method: 'POST', url: `/v1/sessions/${b.id}/messages?wait=true`, payload: { content: 'y' } })).statusCode, 200)
})

t.test('open event streams per key', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_MAX_STREAMS_PER_KEY: '1' } })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const first = readSse(`${base}/v1/sessions/${session.id}/events`, { timeoutMs: 600 })
  await new Promise((r) => setTimeout(r, 100))
  const second = await readSse(`${base}/v1/sessions/${session.id}/events`, { timeoutMs: 600 })
  t.equal(second.status, 429)
  t.equal(JSON.parse(second.body).error.code, 'LIMIT_EXCEEDED')
  t.match(second.headers['retry-after'], /^[1-9][0-9]*$/, 'a 429 says when to come back (Retry-After)')
  const post = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, headers: { accept: 'text/event-stream' }, payload: { content: 'x' } })
  t.equal(post.statusCode, 429, 'a streamed POST is refused before its run is created')
  const runs = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
  t.equal(runs.length, 0, 'no run was started')
  t.equal((await first).status, 200)
  await new Promise((r) => setTimeout(r, 50))
  const third = await readSse(`${base}/v1/sessions/${session.id}/events`, { timeoutMs: 200 })
  t.equal(third.status, 200, 'a closed stream frees its slot')
})

t.test('maxTokens per run ends the run with a classified error and done', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [], limits: { maxTokens: 5 } } })).json()
  devModel.script({ text: 'a fairly long answer that costs more than five tokens in total' })
  const res = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'talk' } })).json()
  t.equal(res.run.status, 'failed')
  t.match(res.run.error, { code: 'MAX_TOKENS_EXCEEDED', errorType: 'logical', fatal: true })
  const done = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?types=done`, headers: { accept: 'application/json' } })).json().data
  t.equal(done[0].data.reason, 'failed')
})

t.test('tool output is capped with a note', async (t) => {
  const { app, devModel, dir } = await buildTestApp(t, { env: { AGENTD_TOOL_MAX_OUTPUT_BYTES: '2048' } })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  const workspace = join(dir, 'workspaces', session.id)
  mkdirSync(workspace, { recursive: true })
  writeFileSync(join(workspace, 'big.txt'), 'line of text\n'.repeat(10_000))
  devModel.script({ toolCalls: [{ name: 'fs_read', arguments: { path: 'big.txt' } }] }, { text: 'read' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'read it' } })
  const last = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  const result = last.messages.filter((m) => m.role === 'tool').at(-1)?.content ?? ''
  t.ok(Buffer.byteLength(result) < 4096, `the model got ${Buffer.byteLength(result)} bytes, not 130 000`)
  t.match(result, /cut|truncat|more/i, 'with a note that it was cut')
})
