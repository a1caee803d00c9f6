import { connect } from 'node:net'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { assertRawEnvelope, parseRawAnswer } from '../helpers/raw-http.ts'
import { readSse } from '../helpers/sse.ts'

/** Sends `head`, then one byte of `trickle` every 100 ms; resolves with what came back and when the server closed. */
function trickle(port: number, head: string, trickle: string): Promise<{ answer: string; closedAfterMs: number }> {
  return new Promise((resolve) => {
    const started = Date.now()
    const socket = connect(port, '127.0.0.1')
    let answer = ''
    let sent = 0
    socket.write(head)
    const timer = setInterval(() => socket.write(trickle[sent++ % trickle.length] as string), 100)
    socket.on('data', (data) => (answer += String(data)))
    socket.on('error', () => undefined)
    socket.on('close', () => {
      clearInterval(timer)
      resolve({ answer, closedAfterMs: Date.now() - started })
    })
    setTimeout(() => socket.destroy(), 10_000)
  })
}

t.test('a client that sends its request too slowly is answered 408 and closed; answers and streams may take their time', async (t) => {
  // 600 ms here; REQUEST_TIMEOUT_MS (30 s) in the service. Before, a body sent a byte every few
  // seconds held its connection for good.
  const { app, devModel } = await buildTestApp(t, { app: { requestTimeoutMs: 600 } })
  const base = await listen(app)
  const port = Number(new URL(base).port)

  const slowBody = await trickle(port, 'POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{', ' ')
  t.match(slowBody.answer, /^HTTP\/1\.1 408/, 'a body that trickles: 408')
  t.ok(slowBody.closedAfterMs < 3000, `closed after ${slowBody.closedAfterMs} ms`)
  const slowHeaders = await trickle(port, 'GET /healthz HTTP/1.1\r\n', 'X-Slow: yes\r\n')
  t.match(slowHeaders.answer, /^HTTP\/1\.1 408/, 'headers that trickle: 408')
  t.match(slowHeaders.answer, /\r\nx-request-id: req_\w+\r\n/i, 'with a request ID')
  t.ok(slowHeaders.closedAfterMs < 3000, `closed after ${slowHeaders.closedAfterMs} ms`)

  // The limit is on receiving the request, not on the answer.
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const streamed = readSse(`${base}/v1/sessions/${session.id}/events?until=done`, { timeoutMs: 10_000 })
  devModel.script({ text: 'an answer that takes its time', delayMs: 1500 })
  const waited = await fetch(`${base}/v1/sessions/${session.id}/messages?wait=true`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ content: 'hi' })
  })
  t.equal(waited.status, 200, '?wait=true answers after 1.5 s')
  t.equal(((await waited.json()) as { run: { status: string } }).run.status, 'completed')
  const stream = await streamed
  t.ok(stream.endedByServer, 'a stream open for 1.5 s ran to its done')
  t.equal(stream.events.at(-1)?.type, 'done')
})

t.test('the 408 of a body too slow carries the request ID, and is logged and counted like any answer', async (t) => {
  const logLines: string[] = []
  const { app } = await buildTestApp(t, { logLines, app: { requestTimeoutMs: 300 } })
  const port = Number(new URL(await listen(app)).port)
  const slowBody = await trickle(port, 'POST /v1/sessions HTTP/1.1\r\nHost: x\r\nX-Request-Id: slow-body-1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{', ' ')
  t.match(slowBody.answer, /^HTTP\/1\.1 408/)
  t.match(slowBody.answer, /\r\nx-request-id: slow-body-1\r\n/i, 'the request ID is echoed')

  const metrics = (await app.inject({ method: 'GET', url: '/metrics' })).body
  t.match(metrics, /^agentd_http_request_duration_seconds_count\{method="POST",route="\/v1\/sessions",status_code="408"\} 1$/m, 'counted by route, with its status')
  const completed = logLines.map((line) => JSON.parse(line)).filter((line) => line.reqId === 'slow-body-1' && line.msg === 'request completed')
  t.equal(completed.length, 1, "one 'request completed' line")
  t.equal(completed[0]?.res?.statusCode, 408)
})

t.test('the 408s of headers and of a body too slow are the error envelope REQUEST_TIMEOUT (SPEC 5.2)', async (t) => {
  const { app } = await buildTestApp(t, { app: { requestTimeoutMs: 300 } })
  const port = Number(new URL(await listen(app)).port)

  const slowHeaders = await trickle(port, 'GET /healthz HTTP/1.1\r\n', 'X-Slow: yes\r\n')
  const headersError = assertRawEnvelope(t, slowHeaders.answer, 408, 'REQUEST_TIMEOUT', true)
  t.match(headersError?.requestId, /^req_\w+$/, 'headers too slow: a generated request ID')

  const slowBody = await trickle(port, 'POST /v1/sessions HTTP/1.1\r\nHost: x\r\nX-Request-Id: slow-env-1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{', ' ')
  const bodyError = assertRawEnvelope(t, slowBody.answer, 408, 'REQUEST_TIMEOUT', true)
  t.equal(bodyError?.requestId, 'slow-env-1', 'body too slow: the client\'s request ID')
  t.match(slowBody.answer, /\r\ncache-control: no-store\r\n/i, 'a /v1 answer: not cached')
})

t.test('the 408 of a body too slow carries the CORS headers a browser needs to read it, as any answer does', async (t) => {
  const ORIGIN = 'https://app.example'
  const EXPOSED = 'X-Request-Id, Retry-After, Idempotent-Replayed, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset'
  const slowBody = async (origins: string, origin: string) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_CORS_ORIGINS: origins }, app: { requestTimeoutMs: 300 } })
    const port = Number(new URL(await listen(app)).port)
    const { answer } = await trickle(port, `POST /v1/sessions HTTP/1.1\r\nHost: x\r\nOrigin: ${origin}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{`, ' ')
    // What @fastify/cors sends on an answer Fastify gives, for the same request.
    const normal = await app.inject({ method: 'GET', url: '/no/such/route', headers: { origin } })
    const cors = (headers: Record<string, unknown>) => Object.fromEntries(Object.entries(headers).filter(([name]) => /^(access-control-|vary$)/.test(name)))
    return { answer, headers: cors(parseRawAnswer(answer).headers), normal: cors(normal.headers) }
  }

  const listed = await slowBody(ORIGIN, ORIGIN)
  t.match(listed.answer, /^HTTP\/1\.1 408 /)
  t.equal(listed.headers['access-control-allow-origin'], ORIGIN, 'a listed origin is echoed')
  t.equal(listed.headers['vary'], 'Origin', 'the answer depends on the Origin')
  t.equal(listed.headers['access-control-expose-headers'], EXPOSED, 'X-Request-Id and Retry-After are readable')
  t.same(listed.headers, listed.normal, 'the same CORS headers as a 404 Fastify answers')

  const unlisted = await slowBody(ORIGIN, 'https://evil.example')
  t.notOk(unlisted.headers['access-control-allow-origin'], 'an unlisted origin gets no grant')
  t.same(unlisted.headers, unlisted.normal, 'the same CORS headers as a 404 Fastify answers')

  const any = await slowBody('*', ORIGIN)
  t.equal(any.headers['access-control-allow-origin'], '*', '* grants every origin')
  t.same(any.headers, any.normal, 'the same CORS headers as a 404 Fastify answers')

  const off = await slowBody('', ORIGIN)
  t.match(off.answer, /^HTTP\/1\.1 408 /)
  t.same(off.headers, {}, 'CORS off: no CORS header')
})

t.test('a client that leaves halfway through its body is not logged as a store failure', async (t) => {
  const logLines: string[] = []
  const { app } = await buildTestApp(t, { logLines })
  const port = Number(new URL(await listen(app)).port)
  await new Promise<void>((resolve) => {
    const socket = connect(port, '127.0.0.1')
    socket.on('error', () => undefined)
    socket.on('close', () => resolve())
    socket.write('POST /v1/sessions HTTP/1.1\r\nHost: x\r\nX-Request-Id: left-1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{', () => {
      setTimeout(() => socket.destroy(), 50)
    })
  })
  const lines = () => logLines.map((line) => JSON.parse(line)).filter((line) => line.reqId === 'left-1')
  for (let i = 0; i < 100 && !lines().some((line) => line.err || line.code); i++) await new Promise((resolve) => setTimeout(resolve, 10))
  t.ok(lines().length > 1, 'the abandoned request is logged')
  t.same(lines().filter((line) => /store/i.test(line.msg)).map((line) => line.msg), [], 'and nothing blames the store')
  t.equal((await app.inject({ method: 'GET', url: '/readyz' })).statusCode, 200)
})
