import { createServer, request as httpRequest, type ClientRequest } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { FastifyInstance } from 'fastify'
import t from 'tap'
import { startDevModel, type DevModel } from '../../src/model/dev-model.ts'
import { createOpenAIProvider } from '../../src/model/provider.ts'
import { buildTestApp, listen } from '../helpers/app.ts'
import { readSse } from '../helpers/sse.ts'

interface Sample {
  name: string
  labels: Record<string, string>
  value: number
}

/** Parses the Prometheus text format into samples (comments skipped). */
function parseMetrics(text: string): Sample[] {
  const samples: Sample[] = []
  for (const line of text.split('\n')) {
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line)
    if (!match) continue
    const labels: Record<string, string> = {}
    for (const pair of (match[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1] as string] = pair[2] as string
    samples.push({ name: match[1] as string, labels, value: Number(match[3]) })
  }
  return samples
}

/** The value of the one sample with this name and exactly these labels; undefined when absent. */
function valueOf(samples: Sample[], name: string, labels: Record<string, string> = {}): number | undefined {
  const wanted = JSON.stringify(Object.entries(labels).sort())
  return samples.find((s) => s.name === name && JSON.stringify(Object.entries(s.labels).sort()) === wanted)?.value
}

async function scrape(app: FastifyInstance): Promise<{ text: string; samples: Sample[] }> {
  const res = await app.inject({ method: 'GET', url: '/metrics' })
  if (res.statusCode !== 200) throw new Error(`/metrics answered ${res.statusCode}`)
  return { text: res.body, samples: parseMetrics(res.body) }
}

async function newSession(app: FastifyInstance): Promise<string> {
  return (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json().id
}

async function runToEnd(app: FastifyInstance, sessionId: string): Promise<{ id: string; status: string; usage: { inputTokens: number; outputTokens: number } }> {
  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${sessionId}/messages?wait=true`, payload: { content: 'go' } })
  return res.json().run
}

/** An OpenAI-compatible server whose answers carry no usage, as some do: the dev model behind a proxy that drops stream_options. */
async function withoutUsage(t: { teardown(fn: () => unknown): void }, devModel: DevModel): Promise<string> {
  const server = createServer(async (req, res) => {
    const chunks: Buffer[] = []
    for await (const chunk of req) chunks.push(chunk as Buffer)
    const body = JSON.parse(Buffer.concat(chunks).toString('utf8'))
    delete body.stream_options
    const upstream = await fetch(`${devModel.url.replace(/\/v1$/, '')}${req.url}`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body)
    })
    res.writeHead(upstream.status, { 'content-type': upstream.headers.get('content-type') ?? 'application/json' })
    res.end(Buffer.from(await upstream.arrayBuffer()))
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => server.close())
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`
}

async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 3000
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

t.test('/metrics answers in the Prometheus text format with the process metrics under agentd_', async (t) => {
  const { app } = await buildTestApp(t)
  const res = await app.inject({ method: 'GET', url: '/metrics' })
  t.equal(res.statusCode, 200)
  t.equal(res.headers['content-type'], 'text/plain; version=0.0.4; charset=utf-8')
  const samples = parseMetrics(res.body)
  t.ok(valueOf(samples, 'agentd_process_cpu_user_seconds_total') !== undefined, 'default process metrics carry the prefix')
  t.match(res.body, /^# TYPE agentd_http_request_duration_seconds histogram$/m)
  for (const status of ['completed', 'failed', 'cancelled']) t.equal(valueOf(samples, 'agentd_runs_total', { status }), 0, `runs ${status} start at 0`)
  t.equal(valueOf(samples, 'agentd_runs_active'), 0)
  t.equal(valueOf(samples, 'agentd_sse_connections'), 0)
})

t.test('runs, retries, model errors, tool errors and tokens are counted exactly, once per run', async (t) => {
  const { app, devModel } = await buildTestApp(t, { retryPolicy: { maxRetries: 2 } })
  const usage = { input: 0, output: 0 }
  const expectRuns = async (completed: number, failed: number, cancelled: number, step: string) => {
    const { samples } = await scrape(app)
    t.same(
      ['completed', 'failed', 'cancelled'].map((status) => valueOf(samples, 'agentd_runs_total', { status })),
      [completed, failed, cancelled],
      `runs by status after ${step}`
    )
    return samples
  }

  devModel.script({ text: 'fine' })
  const completed = await runToEnd(app, await newSession(app))
  t.equal(completed.status, 'completed')
  usage.input += completed.usage.inputTokens
  usage.output += completed.usage.outputTokens
  await expectRuns(1, 0, 0, 'a completed run')

  devModel.script({ status: 401 })
  t.equal((await runToEnd(app, await newSession(app))).status, 'failed')
  let samples = await expectRuns(1, 1, 0, 'a 401')
  t.equal(valueOf(samples, 'agentd_model_errors_total', { code: 'AUTHENTICATION_ERROR' }), 1, 'the run-failing model error by code')
  t.equal(valueOf(samples, 'agentd_model_retries_total', { code: 'AUTHENTICATION_ERROR' }), undefined, 'a 401 is not retried')

  devModel.script({ status: 429, headers: { 'retry-after-ms': '10' } }, { text: 'recovered' })
  const retried = await runToEnd(app, await newSession(app))
  t.equal(retried.status, 'completed')
  usage.input += retried.usage.inputTokens
  usage.output += retried.usage.outputTokens
  samples = await expectRuns(2, 1, 0, 'a retried run')
  t.equal(valueOf(samples, 'agentd_model_retries_total', { code: 'RATE_LIMITED' }), 1, 'one retry, by code')
  t.equal(valueOf(samples, 'agentd_model_errors_total', { code: 'RATE_LIMITED' }), undefined, 'a retry that recovers is no model error')

  // A session without tools: any tool the model names is unknown.
  devModel.script({ toolCalls: [{ name: 'no_such_tool', arguments: {} }] }, { text: 'done anyway' })
  const withToolError = await runToEnd(app, await newSession(app))
  t.equal(withToolError.status, 'completed')
  usage.input += withToolError.usage.inputTokens
  usage.output += withToolError.usage.outputTokens
  samples = await expectRuns(3, 1, 0, 'a run with a tool error')
  t.equal(valueOf(samples, 'agentd_tool_errors_total', { errorType: 'validation', code: 'TOOL_NOT_FOUND' }), 1, 'the tool error by errorType and code')

  const sessionId = await newSession(app)
  devModel.script({ hang: true, afterChunks: 1, text: 'never finishes' })
  const accepted = await app.inject({ method: 'POST', url: `/v1/sessions/${sessionId}/messages`, payload: { content: 'go' } })
  t.equal(accepted.statusCode, 202)
  await until(async () => {
    const page = await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/events?types=text_chunk`, headers: { accept: 'application/json' } })
    return page.json().data.length > 0
  }, 'the hanging run to stream text')
  t.equal(valueOf((await scrape(app)).samples, 'agentd_runs_active'), 1, 'the hanging run is active')
  t.equal((await app.inject({ method: 'POST', url: `/v1/sessions/${sessionId}/interrupt` })).json().status, 'cancelled')
  samples = await expectRuns(3, 1, 1, 'an interrupted run')

  t.equal(valueOf(samples, 'agentd_runs_active'), 0)
  // completed: 1 call; failed: 0; retried: 1 (the 429 never completed); tool error: 2; cancelled: 0.
  t.equal(valueOf(samples, 'agentd_model_calls_total'), 4, 'one per completed model call')
  t.ok(usage.input > 0 && usage.output > 0)
  t.equal(valueOf(samples, 'agentd_tokens_total', { kind: 'input' }), usage.input, 'input tokens are the sum over runs')
  t.equal(valueOf(samples, 'agentd_tokens_total', { kind: 'output' }), usage.output, 'output tokens are the sum over runs')
})

t.test('a queued run cancelled before it starts counts as one cancelled run', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const sessionId = await newSession(app)
  devModel.script({ text: 'slow', delayMs: 300 }, { text: 'fresh' })
  const first = (await app.inject({ method: 'POST', url: `/v1/sessions/${sessionId}/messages`, payload: { content: 'a' } })).json()
  const queued = (await app.inject({ method: 'POST', url: `/v1/sessions/${sessionId}/messages`, payload: { content: 'b', onBusy: 'enqueue' } })).json()
  await app.inject({ method: 'DELETE', url: `/v1/sessions/${sessionId}` })
  await app.agentd.runs.waitFor(sessionId, first.run.id)
  await app.agentd.runs.waitFor(sessionId, queued.run.id)
  const { samples } = await scrape(app)
  t.equal(valueOf(samples, 'agentd_runs_total', { status: 'cancelled' }), 2, 'the active and the queued run, each once')
  t.equal(valueOf(samples, 'agentd_runs_total', { status: 'completed' }), 0)
})

t.test('agentd_sse_connections follows open streams; SSE responses stay out of the latency histogram', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const base = await listen(app)
  const sessionId = await newSession(app)

  let req: ClientRequest | undefined
  await new Promise<void>((resolve, reject) => {
    req = httpRequest(`${base}/v1/sessions/${sessionId}/events`, { headers: { accept: 'text/event-stream' } })
    req.on('response', (res) => res.once('data', () => resolve()))
    req.on('error', reject)
    req.end()
  })
  t.equal(valueOf((await scrape(app)).samples, 'agentd_sse_connections'), 1, 'one stream open')
  req?.destroy()
  await until(async () => valueOf((await scrape(app)).samples, 'agentd_sse_connections') === 0, 'the stream to close')
  t.pass('0 after the client left')

  // This stream is ended by the server after done, so it would reach onResponse if not excluded.
  devModel.script({ text: 'streamed' })
  const streamed = await readSse(`${base}/v1/sessions/${sessionId}/messages`, { method: 'POST', body: { content: 'go' } })
  t.equal(streamed.events.at(-1)?.type, 'done')
  t.ok(streamed.endedByServer)
  await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/events`, headers: { accept: 'application/json' } })

  const { samples } = await scrape(app)
  const counted = (route: string, method: string, status: string) =>
    valueOf(samples, 'agentd_http_request_duration_seconds_count', { method, route, status_code: status })
  t.equal(counted('/v1/sessions/:id/messages', 'POST', '200'), undefined, 'the SSE answer to a message is not a latency sample')
  t.equal(counted('/v1/sessions/:id/events', 'GET', '200'), 1, 'only the JSON page of events is, not the streams')
  t.equal(counted('/v1/sessions', 'POST', '201'), 1)
})

t.test('request latency is labelled by route pattern and status, never by raw URL', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const sessionId = await newSession(app)
  devModel.script({ text: 'ok' })
  const run = await runToEnd(app, sessionId)
  await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}` })
  await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}` })
  await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/runs/${run.id}` })
  await app.inject({ method: 'GET', url: '/v1/sessions/ses_doesnotexist' })
  await app.inject({ method: 'GET', url: '/no/such/route/xyz123' })

  const { text, samples } = await scrape(app)
  const count = (labels: Record<string, string>) => valueOf(samples, 'agentd_http_request_duration_seconds_count', labels)
  t.equal(count({ method: 'GET', route: '/v1/sessions/:id', status_code: '200' }), 2)
  t.equal(count({ method: 'GET', route: '/v1/sessions/:id', status_code: '404' }), 1, 'a missing session is the same route, status 404')
  t.equal(count({ method: 'GET', route: '/v1/sessions/:id/runs/:runId', status_code: '200' }), 1)
  t.equal(count({ method: 'POST', route: '/v1/sessions/:id/messages', status_code: '200' }), 1)
  t.equal(count({ method: 'GET', route: 'unmatched', status_code: '404' }), 1, 'unknown routes share one label')
  t.ok(valueOf(samples, 'agentd_http_request_duration_seconds_bucket', { method: 'GET', route: '/v1/sessions/:id', status_code: '200', le: '+Inf' }) === 2)
  for (const raw of [sessionId, run.id, 'ses_doesnotexist', 'xyz123']) t.notOk(text.includes(raw), `${raw} appears nowhere`)
  t.notMatch(text, /["/](ses|run|msg|call)_[A-Za-z0-9]/, 'no ID in any label')
})

t.test('a URL the router refuses before any hook runs is counted and logged like any answered request', async (t) => {
  const logLines: string[] = []
  const { app } = await buildTestApp(t, { logLines })
  const malformed = await app.inject({ method: 'GET', url: '/v1/sessions/%zz', headers: { 'x-request-id': 'bad-url' } })
  const long = await app.inject({ method: 'GET', url: `/v1/sessions/${'a'.repeat(300)}`, headers: { 'x-request-id': 'long-param' } })
  t.same([malformed.statusCode, long.statusCode], [400, 400])

  const { text, samples } = await scrape(app)
  t.equal(valueOf(samples, 'agentd_http_request_duration_seconds_count', { method: 'GET', route: 'unmatched', status_code: '400' }), 2, 'both, under the one label of unmatched routes')
  t.notOk(text.includes('%zz') || text.includes('aaaa'), 'the raw URL appears nowhere')
  for (const id of ['bad-url', 'long-param']) {
    const completed = logLines.map((line) => JSON.parse(line)).filter((line) => line.reqId === id && line.msg === 'request completed')
    t.equal(completed.length, 1, `${id}: one 'request completed' line`)
    t.equal(completed[0]?.res?.statusCode, 400, `${id}: with its status`)
    t.type(completed[0]?.responseTime, 'number', `${id}: and its response time`)
  }
})

t.test("the latency buckets reach the minutes a ?wait=true answer may take, and the millisecond of most others", async (t) => {
  const { app } = await buildTestApp(t)
  await app.inject({ method: 'GET', url: '/healthz' })
  const { samples } = await scrape(app)
  const bounds = samples
    .filter((s) => s.name === 'agentd_http_request_duration_seconds_bucket' && s.labels.route === '/healthz')
    .map((s) => s.labels.le)
  t.ok(bounds.includes('0.001'), 'a bucket at 1 ms')
  for (const le of ['30', '60', '300']) t.ok(bounds.includes(le), `a bucket at ${le} s`)
  t.equal(bounds.at(-1), '+Inf')
})

t.test('each app has its own registry: two apps in one process count separately', async (t) => {
  const one = await buildTestApp(t)
  const two = await buildTestApp(t)
  one.devModel.script({ text: 'only here' })
  await runToEnd(one.app, await newSession(one.app))
  t.equal(valueOf((await scrape(one.app)).samples, 'agentd_runs_total', { status: 'completed' }), 1)
  t.equal(valueOf((await scrape(two.app)).samples, 'agentd_runs_total', { status: 'completed' }), 0)
})

t.test('with API keys, /metrics is open by default and takes a key when AGENTD_METRICS_PUBLIC=false', async (t) => {
  const key = 'metrics-test-key-0123456789'
  const open = await buildTestApp(t, { env: { AGENTD_API_KEYS: `acme:${key}` } })
  t.equal((await open.app.inject({ method: 'GET', url: '/metrics' })).statusCode, 200, 'public by default')
  t.equal((await open.app.inject({ method: 'GET', url: '/v1/sessions' })).statusCode, 401, '/v1 still takes a key')

  const closed = await buildTestApp(t, { env: { AGENTD_API_KEYS: `acme:${key}`, AGENTD_METRICS_PUBLIC: 'false' } })
  const denied = await closed.app.inject({ method: 'GET', url: '/metrics' })
  t.equal(denied.statusCode, 401)
  t.equal(denied.json().error.code, 'UNAUTHORIZED')
  const allowed = await closed.app.inject({ method: 'GET', url: '/metrics', headers: { authorization: `Bearer ${key}` } })
  t.equal(allowed.statusCode, 200)
  t.match(allowed.body, /^agentd_runs_total\{status="completed"\} 0$/m)
})

t.test('a failed summary, which the run survives by truncating, is not counted as a model error that failed a run', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  devModel.setContextLimit(2400)
  const sessionId = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [], limits: { contextTokens: 1500 } } })).json().id
  const words = (tag: string, n: number) => `${tag}: ${'the quick brown fox jumps over the lazy dog and then '.repeat(Math.ceil(n / 11))}`.trim()
  const send = async (content: string) =>
    (await app.inject({ method: 'POST', url: `/v1/sessions/${sessionId}/messages?wait=true`, payload: { content } })).json().run
  for (let i = 0; i < 2; i++) t.equal((await send(words(`early ${i}`, 250))).status, 'completed')
  devModel.script({ status: 500 })
  t.equal((await send(words('late', 700))).status, 'completed', 'the summary failed and the run went on')

  const { samples } = await scrape(app)
  t.equal(valueOf(samples, 'agentd_runs_total', { status: 'failed' }), 0)
  t.same(samples.filter((s) => s.name === 'agentd_model_errors_total'), [], 'no model error failed a run')
})

t.test('a summarising call whose answer carries no usage is counted as a model call, like the others', async (t) => {
  const devModel = await startDevModel({ host: '127.0.0.1', port: 0 })
  t.teardown(() => devModel.close())
  const model = createOpenAIProvider({ kind: 'dev', apiKey: 'test-key', baseURL: await withoutUsage(t, devModel) })
  t.teardown(() => model.close())
  const { app } = await buildTestApp(t, { devModel, app: { model } })
  const sessionId = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [], limits: { contextTokens: 1500 } } })).json().id
  const words = (tag: string, n: number) => `${tag}: ${'the quick brown fox jumps over the lazy dog and then '.repeat(Math.ceil(n / 11))}`.trim()
  for (const content of [words('early 0', 250), words('early 1', 250), words('late', 700)]) {
    const res = await app.inject({ method: 'POST', url: `/v1/sessions/${sessionId}/messages?wait=true`, payload: { content } })
    t.equal(res.json().run.status, 'completed')
  }
  const summaries = devModel.requests.filter((request) => String(request.body.messages[0]?.content).startsWith('You summarise'))
  t.ok(summaries.length > 0, 'the history was summarised')
  t.ok(devModel.requests.every((request) => request.body.stream_options === undefined), 'no answer carried usage')

  const { samples } = await scrape(app)
  t.equal(valueOf(samples, 'agentd_model_calls_total'), devModel.requests.length, 'every model call, the summarising ones included')
})
