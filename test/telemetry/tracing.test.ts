import { createServer } from 'node:http'
import { connect, type AddressInfo } from 'node:net'
import t from 'tap'
import { loadConfig } from '../../src/config.ts'
import { buildTestApp, listen } from '../helpers/app.ts'
import { startOtlpReceiver, type ReceivedSpan } from '../helpers/otlp-receiver.ts'
import { readSse } from '../helpers/sse.ts'

const CLIENT_TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736'
const CLIENT_SPAN_ID = '00f067aa0ba902b7'
const CLIENT_TRACEPARENT = `00-${CLIENT_TRACE_ID}-${CLIENT_SPAN_ID}-01`
const SPAN_KIND_SERVER = 2
const STATUS_ERROR = 2

async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 5000
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

const byName = (spans: ReceivedSpan[], name: string) => spans.filter((span) => span.name === name)

t.test('a run with a model retry and two tool calls is one trace: request → invoke_agent → chat / execute_tool', async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const logLines: string[] = []
  const { app, devModel } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_SERVICE_NAME: 'agentd-test' }, logLines })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { model: 'dev-large' } })).json()
  devModel.script(
    { status: 503 },
    { toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }, { name: 'fs_read', arguments: { path: 'missing.txt' } }] },
    { text: 'All done' }
  )

  const res = await app.inject({
    method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'look around' },
    headers: { traceparent: CLIENT_TRACEPARENT, 'x-request-id': 'trace-req-1' }
  })
  t.equal(res.statusCode, 200)
  const { run } = res.json()
  t.equal(run.status, 'completed')
  const messages = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data as Array<{ toolCalls?: Array<{ id: string }> }>
  const calls = messages.flatMap((m) => m.toolCalls ?? [])
  await app.close()

  const spans = receiver.spans.filter((span) => span.traceId === CLIENT_TRACE_ID)
  t.ok(spans.every((span) => span.serviceName === 'agentd-test'), 'OTEL_SERVICE_NAME names the service')

  const [request] = byName(spans, 'POST /v1/sessions/:id/messages')
  t.ok(request, 'the request has a span named by its route')
  t.equal(request?.parentSpanId, CLIENT_SPAN_ID, "the request span continues the client's traceparent")
  t.equal(request?.kind, SPAN_KIND_SERVER)
  t.match(request?.attributes, { 'http.request.method': 'POST', 'http.route': '/v1/sessions/:id/messages', 'http.response.status_code': 200, 'agentd.request.id': 'trace-req-1' })

  const [agent] = byName(spans, 'invoke_agent')
  t.equal(agent?.parentSpanId, request?.spanId, 'the run nests under the request that created it')
  t.match(agent?.attributes, {
    'gen_ai.operation.name': 'invoke_agent', 'gen_ai.request.model': 'dev-large', 'gen_ai.conversation.id': session.id,
    'gen_ai.usage.input_tokens': run.usage.inputTokens, 'gen_ai.usage.output_tokens': run.usage.outputTokens,
    'agentd.run.id': run.id, 'agentd.run.status': 'completed', 'agentd.request.id': 'trace-req-1'
  })
  t.ok(run.usage.inputTokens > 0, 'the run used tokens')

  const chats = byName(spans, 'chat dev-large')
  t.equal(chats.length, 3, 'one span per model call attempt: the 503, the tool calls, the answer')
  t.ok(chats.every((span) => span.parentSpanId === agent?.spanId), 'model calls nest under invoke_agent')
  const [failed, toolStep, answer] = chats.sort((a, b) => (BigInt(a.startTimeUnixNano) < BigInt(b.startTimeUnixNano) ? -1 : 1))
  t.match(failed?.attributes, {
    'gen_ai.operation.name': 'chat', 'gen_ai.request.model': 'dev-large', 'agentd.model.attempt': 1,
    'error.type': 'SERVER_ERROR', 'agentd.error.type': 'runtime', 'agentd.model.retrying': true
  })
  t.equal(failed?.status.code, STATUS_ERROR, 'the failed attempt is an error span')
  t.equal(toolStep?.attributes['agentd.model.attempt'], 2, 'the retry is the second attempt of the step')
  t.equal(answer?.attributes['agentd.model.attempt'], 1, 'the next step starts again at 1')
  t.ok(Number(toolStep?.attributes['gen_ai.usage.input_tokens']) > 0 && Number(answer?.attributes['gen_ai.usage.output_tokens']) > 0, 'token usage per call')
  t.notOk(toolStep?.attributes['error.type'], 'a successful call has no error.type')

  const [list] = byName(spans, 'execute_tool fs_list')
  const [read] = byName(spans, 'execute_tool fs_read')
  t.equal(list?.parentSpanId, agent?.spanId, 'tool calls nest under invoke_agent')
  t.match(list?.attributes, { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': 'fs_list', 'gen_ai.tool.call.id': calls[0]?.id })
  t.notOk(list?.attributes['error.type'])
  t.match(read?.attributes, { 'gen_ai.tool.name': 'fs_read', 'gen_ai.tool.call.id': calls[1]?.id, 'error.type': 'NOT_FOUND', 'agentd.error.type': 'logical' })
  t.equal(read?.status.code, STATUS_ERROR, 'the classified tool error is an error span')

  const upstream = devModel.requests.map((r) => r.headers.traceparent)
  t.same(upstream, [failed, toolStep, answer].map((span) => `00-${CLIENT_TRACE_ID}-${span?.spanId}-01`), 'each model request carries its chat span as traceparent')
  t.ok(devModel.requests.every((r) => r.headers['x-request-id'] === 'trace-req-1'), 'beside X-Request-Id')

  const runLines = logLines.map((line) => JSON.parse(line) as Record<string, unknown>).filter((line) => line.reqId === 'trace-req-1')
  t.ok(runLines.some((line) => line.msg === 'model call failed, retrying' && line.traceId === CLIENT_TRACE_ID), 'run log lines carry the trace ID')
  t.ok(runLines.some((line) => line.msg === 'run submitted' && line.traceId === CLIENT_TRACE_ID), 'request log lines carry the trace ID')
})

t.test('without a client traceparent each request starts its own trace, and a 404 is traced too', async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const { app } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: `${receiver.url}/v1/traces` } })
  t.equal((await app.inject({ method: 'GET', url: '/v1/sessions/ses_missing' })).statusCode, 404)
  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200)
  await app.close()

  const [missing] = byName(receiver.spans, 'GET /v1/sessions/:id')
  const [health] = byName(receiver.spans, 'GET /healthz')
  t.equal(missing?.attributes['http.response.status_code'], 404)
  t.equal(missing?.parentSpanId, '', 'a root span')
  t.not(missing?.traceId, health?.traceId, 'separate traces')
})

t.test('with the receiver down, runs are unaffected and the failed export is logged once', async (t) => {
  const receiver = await startOtlpReceiver()
  await receiver.close()
  // Read by the exporter itself: without it the exporter retries a refused connection for 10 s.
  process.env.OTEL_EXPORTER_OTLP_TIMEOUT = '500'
  t.teardown(() => delete process.env.OTEL_EXPORTER_OTLP_TIMEOUT)
  const logLines: string[] = []
  const { app, devModel } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url }, logLines })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }] }, { text: 'Listed' })

  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'list' } })
  t.equal(res.statusCode, 200)
  t.equal(res.json().run.status, 'completed')
  t.equal(res.json().message.content, 'Listed')
  const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events`, headers: { accept: 'application/json' } })).json().data
  t.same(events.filter((e: { type: string }) => e.type.startsWith('tool')).map((e: { type: string }) => e.type), ['tool:start', 'tool_executed', 'tool:end'])

  const started = Date.now()
  await app.close()
  t.ok(Date.now() - started < 3500, 'closing is bounded even though the spans cannot be sent')
  const warnings = logLines.map((line) => JSON.parse(line) as Record<string, unknown>).filter((line) => line.msg === 'trace export failed; runs go on without it')
  t.equal(warnings.length, 1, 'the failure is logged, once')
})

t.test('a streamed message is traced too: its request span ends with the stream', async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const { app } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url } })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const res = await readSse(`${base}/v1/sessions/${session.id}/messages`, {
    method: 'POST', body: { content: 'hi' }, headers: { traceparent: CLIENT_TRACEPARENT }
  })
  t.equal(res.status, 200)
  t.equal(res.events.at(-1)?.type, 'done')
  await app.close()

  const [request] = byName(receiver.spans, 'POST /v1/sessions/:id/messages')
  const [agent] = byName(receiver.spans, 'invoke_agent')
  t.equal(request?.traceId, CLIENT_TRACE_ID)
  t.equal(request?.attributes['http.response.status_code'], 200)
  t.equal(agent?.parentSpanId, request?.spanId)
})

t.test('closing the app interrupts a run and still sends its spans', async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const { app, devModel } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url } })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  devModel.script({ hang: true })
  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'hi' } })
  t.equal(res.statusCode, 202)
  await waitFor(() => devModel.requests.length === 1)
  await app.close()

  const [agent] = byName(receiver.spans, 'invoke_agent')
  t.equal(agent?.attributes['agentd.run.status'], 'cancelled', 'the run span is sent after the drain ended the run')
  const [chat] = byName(receiver.spans, 'chat gpt-4o-mini')
  t.equal(chat?.parentSpanId, agent?.spanId)
  t.equal(chat?.attributes['agentd.model.retrying'], false, 'an interrupted call is not retried')
})

t.test('a backend that never answers delays neither runs nor /healthz, and closing stays bounded', async (t) => {
  const receiver = await startOtlpReceiver({ hang: true })
  t.teardown(() => receiver.close())
  const { app } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url } })
  // A full batch (512 spans) is sent at once, so this export is in flight, unanswered, while the runs go on.
  for (let i = 0; i < 520; i++) await app.inject({ method: 'GET', url: '/healthz' })
  await waitFor(() => receiver.exports > 0)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  for (let i = 0; i < 3; i++) {
    const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: `hi ${i}` } })
    t.equal(res.json().run.status, 'completed')
  }
  const before = performance.now()
  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200)
  t.ok(performance.now() - before < 100, '/healthz answers at once')
  const started = Date.now()
  await app.close()
  t.ok(Date.now() - started < 4000, `closed in ${Date.now() - started} ms: the flush is given up after 3 s`)
})

t.test('without an OTLP endpoint there is no tracing: no traceparent upstream, no trace IDs in logs', async (t) => {
  const logLines: string[] = []
  const { app, devModel } = await buildTestApp(t, { logLines })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const res = await app.inject({
    method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hi' }, headers: { traceparent: CLIENT_TRACEPARENT }
  })
  t.equal(res.statusCode, 200)
  t.equal(devModel.requests.length, 1)
  t.equal(devModel.requests[0]?.headers.traceparent, undefined)
  t.ok(logLines.length > 0)
  t.notOk(logLines.some((line) => line.includes('traceId')))
})

t.test('the endpoints come from the standard OpenTelemetry variables', async (t) => {
  const base = { AGENTD_DB: ':memory:' }
  t.equal(loadConfig(base).tracing.endpoint, null, 'off by default')
  t.equal(loadConfig({ ...base, OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318/' }).tracing.endpoint, 'http://collector:4318/v1/traces')
  t.equal(loadConfig({
    ...base, OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318', OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'https://traces.example/otlp'
  }).tracing.endpoint, 'https://traces.example/otlp', 'the traces URL wins, as given')
  t.equal(loadConfig({ ...base, OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318', OTEL_SDK_DISABLED: 'true' }).tracing.endpoint, null)
  t.equal(loadConfig(base).tracing.serviceName, 'agentd')
  t.throws(() => loadConfig({ ...base, OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4318' }), /OTEL_EXPORTER_OTLP_ENDPOINT="collector:4318" is invalid: expected an http\(s\):\/\/ OTLP\/HTTP base URL/)
})

async function waitFor(condition: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!condition()) {
    if (Date.now() > deadline) throw new Error('condition not met in time')
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

t.test("a summarising model call is a chat span of the run and carries its traceparent upstream", async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const { app, devModel } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url } })
  devModel.setContextLimit(2400)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [], limits: { contextTokens: 1500 } } })).json()
  const words = (tag: string, n: number) => `${tag}: ${'the quick brown fox jumps over the lazy dog and then '.repeat(Math.ceil(n / 11))}`.trim()
  const send = (content: string, headers: Record<string, string> = {}) =>
    app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content }, headers })
  for (let i = 0; i < 2; i++) t.equal((await send(words(`early ${i}`, 250))).json().run.status, 'completed')
  const before = devModel.requests.length
  const res = await send(words('late', 700), { traceparent: CLIENT_TRACEPARENT })
  t.equal(res.json().run.status, 'completed')
  const upstream = devModel.requests.slice(before)
  await app.close()

  const summary = upstream.find((r) => /^You summarise/.test((r.body.messages as Array<{ content: string }>)[0]?.content ?? ''))
  t.ok(summary, 'the run summarised its history')
  const spans = receiver.spans.filter((span) => span.traceId === CLIENT_TRACE_ID)
  const [agent] = byName(spans, 'invoke_agent')
  const chats = byName(spans, `chat ${session.model}`)
  t.equal(chats.length, 2, 'one chat span for the summary, one for the answer')
  t.ok(chats.every((span) => span.parentSpanId === agent?.spanId), 'both nest under invoke_agent')
  t.match(summary?.headers.traceparent, new RegExp(`^00-${CLIENT_TRACE_ID}-`), 'the summary request continues the trace')
  t.ok(chats.some((span) => summary?.headers.traceparent === `00-${CLIENT_TRACE_ID}-${span.spanId}-01`), 'as its chat span')
})

t.test("a provider's huge error message is cut in the spans' status, not exported whole with every span", async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const { app, devModel } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url } })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  devModel.script({ status: 400, body: { error: { message: `bad request ${'x'.repeat(300_000)}`, type: 'invalid_request_error' } } })
  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hi' } })
  t.equal(res.json().run.status, 'failed')
  await app.close()

  const failed = receiver.spans.filter((span) => span.name === 'invoke_agent' || span.name.startsWith('chat '))
  t.equal(failed.length, 2, 'the run and its model call')
  for (const span of failed) {
    t.equal(span.status.code, STATUS_ERROR)
    t.match(span.status.message, /^The model provider answered 400: bad request x+/, `${span.name} still says what failed`)
    t.ok((span.status.message ?? '').length <= 1100, `${span.name}'s status message is bounded (${span.status.message?.length} chars)`)
  }
})

t.test('a request its client leaves before the answer has no status code in its span, and says it was aborted', async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const { app, devModel } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url } })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  devModel.script({ delayMs: 500, text: 'late' })
  const controller = new AbortController()
  const left = fetch(`${base}/v1/sessions/${session.id}/messages?wait=true`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ content: 'hi' }), signal: controller.signal
  }).catch(() => 'left')
  setTimeout(() => controller.abort(), 100)
  t.equal(await left, 'left')
  // The run goes on without its client: its answer is stored once it ends.
  const answered = async () => (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data.length === 2
  for (let i = 0; i < 100 && !(await answered()); i++) await new Promise((r) => setTimeout(r, 20))
  await app.close()

  const [request] = byName(receiver.spans, 'POST /v1/sessions/:id/messages')
  t.ok(request, 'the request is traced')
  t.notOk('http.response.status_code' in (request?.attributes ?? {}), 'no status code: none was sent (it said 200)')
  t.equal(request?.attributes['error.type'], 'aborted')
  t.equal(byName(receiver.spans, 'invoke_agent')[0]?.attributes['agentd.run.status'], 'completed', 'the run went on')
})

t.test("a tool name the model made up is cut in its span, whose name stays execute_tool", async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const { app, devModel } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url } })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  const madeUp = `no_such_tool_${'x'.repeat(50_000)}`
  devModel.script({ toolCalls: [{ name: madeUp, arguments: {} }, { name: 'fs_list', arguments: { path: '.' } }] }, { text: 'ok' })
  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hi' } })
  t.equal(res.json().run.status, 'completed')
  const audit = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json().data
  t.equal(audit[0]?.name, madeUp, 'the audit keeps the name whole')
  await app.close()

  const tools = receiver.spans.filter((span) => span.attributes['gen_ai.operation.name'] === 'execute_tool')
  t.same(tools.map((span) => span.name).sort(), ['execute_tool', 'execute_tool fs_list'], "a real tool's span is named by it, a made-up one's is not")
  const [unknown] = tools.filter((span) => span.name === 'execute_tool')
  t.equal(unknown?.attributes['gen_ai.tool.name'], madeUp.slice(0, 64), 'the made-up name is cut to 64 characters')
  t.match(unknown?.attributes, { 'gen_ai.tool.call.id': audit[0]?.id, 'error.type': 'TOOL_NOT_FOUND' })
})

t.test("a queued run continues its request's trace when it starts", async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const { app, devModel } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url } })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json().id as string
  devModel.script({ text: 'first', delayMs: 200 }, { text: 'second' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session}/messages`, payload: { content: 'first' } })
  const queued = await app.inject({
    method: 'POST', url: `/v1/sessions/${session}/messages`, payload: { content: 'second', onBusy: 'enqueue' }, headers: { traceparent: CLIENT_TRACEPARENT }
  })
  t.equal(queued.json().run.status, 'queued')
  t.notOk('traceparent' in queued.json().run, 'the traceparent is not part of the run as the API shows it')
  await app.agentd.runs.waitFor(session, queued.json().run.id)
  await app.close()
  const run = byName(receiver.spans, 'invoke_agent').find((span) => span.attributes['agentd.run.id'] === queued.json().run.id)
  t.equal(run?.traceId, CLIENT_TRACE_ID, "the run's span is in the trace of the request that queued it")
})

t.test('a URL the router refuses before any hook runs is traced too', async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const { app } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url } })
  const malformed = await app.inject({ method: 'GET', url: '/v1/sessions/%zz', headers: { 'x-request-id': 'bad-url', traceparent: CLIENT_TRACEPARENT } })
  const long = await app.inject({ method: 'GET', url: `/v1/sessions/${'a'.repeat(300)}`, headers: { 'x-request-id': 'long-param' } })
  t.same([malformed.statusCode, long.statusCode], [400, 400])
  await app.close()

  const byRequest = (id: string) => receiver.spans.find((span) => span.attributes['agentd.request.id'] === id)
  t.match(byRequest('bad-url'), { traceId: CLIENT_TRACE_ID, parentSpanId: CLIENT_SPAN_ID, attributes: { 'http.request.method': 'GET', 'http.response.status_code': 400 } })
  t.match(byRequest('long-param')?.attributes, { 'http.response.status_code': 400 })
  t.equal(receiver.spans.filter((span) => span.attributes['agentd.request.id'] === 'bad-url').length, 1, 'one span per request')
})

t.test('a body too slow, answered 408 on the socket, is a 408 in its span, not a client that left', async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const { app } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url }, app: { requestTimeoutMs: 300 } })
  const port = Number(new URL(await listen(app)).port)
  const answer = await new Promise<string>((resolve) => {
    const socket = connect(port, '127.0.0.1')
    let received = ''
    socket.on('data', (data) => (received += String(data)))
    socket.on('error', () => undefined)
    socket.on('close', () => resolve(received))
    socket.write('POST /v1/sessions HTTP/1.1\r\nHost: x\r\nX-Request-Id: slow-span\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{')
  })
  t.match(answer, /^HTTP\/1\.1 408/)
  await app.close()

  const span = receiver.spans.find((s) => s.attributes['agentd.request.id'] === 'slow-span')
  t.equal(span?.attributes['http.response.status_code'], 408)
  t.equal(span?.attributes['error.type'], undefined, 'not aborted')
})

t.test("a stream's lines keep its own trace ID, once, even when another trace's run ends it", async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const logLines: string[] = []
  const { app, devModel } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url }, logLines })
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const watching = readSse(`${base}/v1/sessions/${session.id}/events?until=done`, { headers: { 'x-request-id': 'watcher' } })
  await until(async () => app.streams.count === 1, 'the watcher to be streaming')
  devModel.script({ text: 'hello there' })
  const res = await app.inject({
    method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hi' }, headers: { traceparent: CLIENT_TRACEPARENT }
  })
  t.equal(res.statusCode, 200)
  t.equal((await watching).events.at(-1)?.type, 'done')
  await until(async () => logLines.some((line) => line.includes('"reqId":"watcher"') && line.includes('request completed')), "the watcher's last line")

  t.same(logLines.filter((line) => (line.match(/"traceId":/g) ?? []).length > 1), [], 'no line has two trace IDs')
  const watcher = logLines.map((line) => JSON.parse(line)).filter((line) => line.reqId === 'watcher')
  const [first] = watcher
  t.not(first?.traceId, CLIENT_TRACE_ID, "the watcher's request is a trace of its own")
  t.same(watcher.filter((line) => line.traceId !== first?.traceId).map((line) => line.msg), [], 'which every one of its lines names')
})

t.test("a backend that refuses spans with a long answer is logged with the start of it, not all of it", async (t) => {
  const backend = createServer((req, res) => {
    req.resume()
    req.on('end', () => res.writeHead(400, { 'content-type': 'text/plain' }).end(`refused: ${'E'.repeat(200_000)}`))
  })
  await new Promise<void>((resolve) => backend.listen(0, '127.0.0.1', resolve))
  t.teardown(() => backend.close())
  const logLines: string[] = []
  const { app } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${(backend.address() as AddressInfo).port}` }, logLines })
  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200)
  await app.close()

  const [warning] = logLines.filter((line) => line.includes('trace export failed'))
  t.ok(warning, 'the failure is logged')
  t.match(JSON.parse(warning ?? '{}').err, { message: 'Bad Request', data: /^refused: E+…$/ }, "with the start of the backend's answer")
  t.ok((warning ?? '').length < 8000, `the line is bounded (${warning?.length} characters)`)
})

t.test("every log line of a request carries its trace ID, Fastify's 'incoming request' first of all", async (t) => {
  const receiver = await startOtlpReceiver()
  t.teardown(() => receiver.close())
  const logLines: string[] = []
  const { app } = await buildTestApp(t, { env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url }, logLines })
  t.equal((await app.inject({ method: 'GET', url: '/healthz', headers: { 'x-request-id': 'logged-1', traceparent: CLIENT_TRACEPARENT } })).statusCode, 200)
  t.equal((await app.inject({ method: 'GET', url: '/v1/sessions/%zz', headers: { 'x-request-id': 'logged-2', traceparent: CLIENT_TRACEPARENT } })).statusCode, 400)
  await app.close()

  for (const id of ['logged-1', 'logged-2']) {
    const lines = logLines.map((line) => JSON.parse(line) as Record<string, unknown>).filter((line) => line.reqId === id)
    t.ok(lines.some((line) => line.msg === 'incoming request'), `${id}: Fastify logged the request`)
    t.same(lines.filter((line) => line.traceId !== CLIENT_TRACE_ID).map((line) => line.msg), [], `${id}: every line has the trace ID`)
  }
  t.equal(receiver.spans.filter((span) => span.attributes['agentd.request.id'] === 'logged-1').length, 1, 'one span per request')
})
