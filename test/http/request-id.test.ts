import { connect } from 'node:net'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { assertRawEnvelope, parseRawAnswer } from '../helpers/raw-http.ts'

const GENERATED = /^req_[0-9A-Z]{26}$/

t.test('request IDs', async (t) => {
  const { app } = await buildTestApp(t)

  t.test('a well-formed X-Request-Id is echoed on success', async (t) => {
    const res = await app.inject({ method: 'GET', url: '/healthz', headers: { 'x-request-id': 'abc.DEF_1:2-3' } })
    t.equal(res.statusCode, 200)
    t.equal(res.headers['x-request-id'], 'abc.DEF_1:2-3')
  })

  t.test('a missing one is generated', async (t) => {
    const res = await app.inject({ method: 'GET', url: '/healthz' })
    t.match(res.headers['x-request-id'], GENERATED)
  })

  t.test('an invalid one is replaced, not echoed', async (t) => {
    for (const bad of ['has space', 'a'.repeat(129), 'semi;colon', 'ünïcode']) {
      const res = await app.inject({ method: 'GET', url: '/healthz', headers: { 'x-request-id': bad } })
      t.match(res.headers['x-request-id'], GENERATED, `replaces ${JSON.stringify(bad.slice(0, 20))}`)
    }
  })

  t.test('errors and unknown routes carry it, in the header and the envelope', async (t) => {
    const res = await app.inject({ method: 'GET', url: '/no/such/route', headers: { 'x-request-id': 'trace-404' } })
    t.equal(res.statusCode, 404)
    t.equal(res.headers['x-request-id'], 'trace-404')
    t.equal(res.json().error.requestId, 'trace-404')

    const missing = await app.inject({ method: 'GET', url: '/v1/sessions/ses_nope' })
    t.equal(missing.statusCode, 404)
    t.equal(missing.json().error.requestId, missing.headers['x-request-id'])
  })
})

/** Sends raw bytes on a new connection; resolves with everything the server wrote before it closed. */
function rawExchange(port: number, bytes: string): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1')
    let answer = ''
    socket.on('data', (data) => (answer += String(data)))
    socket.on('error', () => undefined)
    socket.on('close', () => resolve(answer))
    socket.write(bytes)
  })
}

t.test('a request Node cannot read (malformed, headers too large) is answered with a request ID, which its log line names', async (t) => {
  const logLines: string[] = []
  const { app } = await buildTestApp(t, { logLines })
  const port = Number(new URL(await listen(app)).port)
  const answers = [
    await rawExchange(port, 'NOT HTTP AT ALL\r\n\r\n'),
    await rawExchange(port, `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`)
  ]
  for (const [answer, status] of [[answers[0], '400'], [answers[1], '431']] as const) {
    t.match(answer, new RegExp(`^HTTP/1\\.1 ${status} `), `answered ${status}`)
    const requestId = /\r\nx-request-id: (\S+)\r\n/i.exec(answer ?? '')?.[1]
    t.match(requestId, GENERATED, `${status}: with a request ID`)
    const logged = logLines.map((line) => JSON.parse(line)).filter((line) => requestId !== undefined && line.reqId === requestId)
    t.equal(logged.length, 1, `${status}: one log line names it`)
    t.equal(logged[0]?.res?.statusCode, Number(status), `${status}: with the status`)
  }
})

t.test('a request Node cannot read is answered with the error envelope (SPEC 5.2), not Fastify\'s own body', async (t) => {
  const { app } = await buildTestApp(t)
  const port = Number(new URL(await listen(app)).port)

  const malformed = assertRawEnvelope(t, await rawExchange(port, 'NOT HTTP AT ALL\r\n\r\n'), 400, 'VALIDATION_ERROR', false)
  t.match(malformed?.details, { fields: [{ field: 'request', keyword: 'http' }] }, 'a malformed request: VALIDATION_ERROR naming the request')
  t.match(malformed?.requestId, GENERATED)

  const tooLarge = assertRawEnvelope(t, await rawExchange(port, `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`),
    431, 'HEADERS_TOO_LARGE', false)
  t.match(tooLarge?.requestId, GENERATED)
})

t.test('an HTTP/1.1 request without Host is a 400 in the envelope, with a request ID; an HTTP/1.0 one is served', async (t) => {
  const { app } = await buildTestApp(t)
  const port = Number(new URL(await listen(app)).port)
  const noHost = assertRawEnvelope(t, await rawExchange(port, 'GET /healthz HTTP/1.1\r\n\r\n'), 400, 'VALIDATION_ERROR', false)
  t.match(noHost?.details, { fields: [{ field: 'headers.host', keyword: 'required' }] }, 'naming the Host header')
  t.match(noHost?.requestId, GENERATED)
  const old = parseRawAnswer(await rawExchange(port, 'GET /healthz HTTP/1.0\r\n\r\n'))
  t.equal(old.status, 200, 'HTTP/1.0 has no Host to require')
})

t.test("a request with an Expect other than 100-continue is served like any other, not Node's bare 417", async (t) => {
  const { app } = await buildTestApp(t)
  const port = Number(new URL(await listen(app)).port)
  const health = parseRawAnswer(await rawExchange(port, 'GET /healthz HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nConnection: close\r\n\r\n'))
  t.equal(health.status, 200)
  t.match(health.headers['x-request-id'], GENERATED)
  t.same(JSON.parse(health.body), { status: 'ok' })
  const unknown = assertRawEnvelope(t, await rawExchange(port, 'GET /nope HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nConnection: close\r\n\r\n'), 404, 'ROUTE_NOT_FOUND', false)
  t.match(unknown?.requestId, GENERATED)
})

t.test('a request Node cannot read has no Origin: under * its answer grants every origin, under a list of origins none can be echoed', async (t) => {
  const tooLarge = `GET /healthz HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`
  const answers = async (origins: string) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_CORS_ORIGINS: origins } })
    const port = Number(new URL(await listen(app)).port)
    return [await rawExchange(port, tooLarge), await rawExchange(port, 'NOT HTTP AT ALL\r\n\r\n')].map(parseRawAnswer)
  }

  const [any431, any400] = await answers('*')
  t.equal(any431?.status, 431)
  t.equal(any431?.headers['access-control-allow-origin'], '*', '431 under *: any origin may read it')
  t.match(any431?.headers['access-control-expose-headers'], /^X-Request-Id, Retry-After, /, 'with its request ID readable')
  t.equal(any400?.status, 400)
  t.equal(any400?.headers['access-control-allow-origin'], '*', '400 under *: any origin may read it')

  const [listed431] = await answers('https://app.example')
  t.equal(listed431?.status, 431)
  t.notOk(listed431?.headers['access-control-allow-origin'], 'a list of origins: no Origin was read, so none is echoed')

  const [off431] = await answers('')
  t.equal(off431?.status, 431)
  t.same(Object.keys(off431?.headers ?? {}).filter((name) => name.startsWith('access-control-')), [], 'CORS off: no CORS header')
})
