import { setTimeout as delay } from 'node:timers/promises'
import t from 'tap'
import { ConfigError, loadConfig } from '../../src/config.ts'
import { jsonDepth, MAX_JSON_DEPTH } from '../../src/json-depth.ts'
import { buildTestApp, listen, type TapTest } from '../helpers/app.ts'
import { readSse } from '../helpers/sse.ts'

const KEY_A = 'key-of-tenant-a-0123456789'
const KEY_B = 'key-of-tenant-b-0123456789'
const KEYS = `a:${KEY_A},b:${KEY_B}`
const ORIGIN = 'https://app.example.com'

type Res = { statusCode: number; headers: Record<string, unknown>; json(): any }

function assertApiHeaders(t: TapTest, res: { headers: Record<string, unknown> }) {
  t.equal(res.headers['x-content-type-options'], 'nosniff')
  t.equal(res.headers['referrer-policy'], 'no-referrer')
  t.equal(res.headers['x-frame-options'], 'DENY')
  t.equal(res.headers['content-security-policy'], "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
}

function assertRateLimited(t: TapTest, res: Res) {
  t.equal(res.statusCode, 429)
  const { error } = res.json()
  t.equal(error.code, 'RATE_LIMITED')
  t.equal(error.retryable, true)
  t.equal(error.requestId, res.headers['x-request-id'], 'the envelope names the request')
  const retryAfter = Number(res.headers['retry-after'])
  t.ok(Number.isInteger(retryAfter) && retryAfter >= 1, `Retry-After is whole seconds (${String(res.headers['retry-after'])})`)
}

t.test('security headers', async (t) => {
  const { app } = await buildTestApp(t)

  t.test('a JSON answer may not be sniffed, framed, referred or cached, and loads nothing', async (t) => {
    const res = await app.inject({ method: 'GET', url: '/v1/sessions' })
    t.equal(res.statusCode, 200)
    assertApiHeaders(t, res)
    t.equal(res.headers['cache-control'], 'no-store')
    t.notOk(res.headers['strict-transport-security'], 'no HSTS unless configured')
    t.notOk(res.headers['content-encoding'], 'not compressed')
  })

  t.test('error answers carry the same headers', async (t) => {
    for (const url of ['/v1/nothing', '/v1/sessions/ses_00000000000000000000000000']) {
      const res = await app.inject({ method: 'GET', url })
      t.equal(res.statusCode, 404, url)
      assertApiHeaders(t, res)
    }
  })

  t.test('so do the answers the router gives before any hook (a malformed URL, an over-long ID)', async (t) => {
    for (const url of ['/v1/sessions/%zz', `/v1/sessions/${'a'.repeat(300)}`]) {
      const res = await app.inject({ method: 'GET', url })
      t.equal(res.statusCode, 400, url.slice(0, 20))
      assertApiHeaders(t, res)
      t.equal(res.headers['cache-control'], 'no-store')
    }
  })

  t.test('the /docs UI gets a CSP that lets it load its own scripts and styles, and nothing else', async (t) => {
    const page = await app.inject({ method: 'GET', url: '/docs/' })
    t.equal(page.statusCode, 200)
    t.match(page.headers['content-type'], /text\/html/)
    const csp = String(page.headers['content-security-policy'])
    t.match(csp, /script-src 'self';/)
    t.match(csp, /style-src 'self' 'unsafe-inline'/)
    t.match(csp, /frame-ancestors 'none'/)
    t.notMatch(csp, /unsafe-eval|https:|\*/, 'no eval and no other hosts')
    for (const src of [...page.body.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1] as string)) {
      const asset = await app.inject({ method: 'GET', url: new URL(src, 'http://x/docs/').pathname })
      t.equal(asset.statusCode, 200, `${src} is served from the same origin`)
    }
    t.equal((await app.inject({ method: 'GET', url: '/docs/json' })).statusCode, 200, 'the UI reads the document from /docs/json')
  })

  t.test('SSE keeps its headers and the security headers, uncompressed and unbuffered', async (t) => {
    const base = await listen(app)
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
    const res = await readSse(`${base}/v1/sessions/${session.id}/events`, { headers: { 'accept-encoding': 'gzip, br' }, timeoutMs: 300 })
    t.equal(res.status, 200)
    t.equal(res.headers['content-type'], 'text/event-stream; charset=utf-8')
    t.equal(res.headers['cache-control'], 'no-cache, no-transform', 'the SSE cache-control wins over no-store')
    t.equal(res.headers['x-accel-buffering'], 'no')
    t.notOk(res.headers['content-encoding'], 'not compressed')
    assertApiHeaders(t, res)
    t.notOk(res.endedByServer, 'the stream is still open')
    t.equal(res.frames[0]?.retry, 2000, 'the first frame arrived while the stream is open: nothing buffers it')
  })
})

t.test('JSON bodies nested deeper than the limit are refused before parsing', async (t) => {
  const { app } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const nested = (levels: number) => '['.repeat(levels) + ']'.repeat(levels)
  const post = (output: string) => app.inject({
    method: 'POST', url: `/v1/sessions/${session.id}/tool-results/call_1`, headers: { 'content-type': 'application/json' }, payload: `{"output":${output}}`
  })
  const deep = await post(nested(MAX_JSON_DEPTH))
  t.equal(deep.statusCode, 400)
  t.match(deep.json().error, { code: 'VALIDATION_ERROR', details: { fields: [{ field: 'body', keyword: 'maxDepth' }] } })
  t.equal((await post(nested(10_000))).statusCode, 400, '10 000 levels: the same 400, no stack overflow')
  const atLimit = await post(nested(MAX_JSON_DEPTH - 1))
  t.equal(atLimit.json().error.code, 'NOT_AWAITING', `${MAX_JSON_DEPTH} levels in all pass the parser and reach the route`)
  const inString = await post(JSON.stringify('['.repeat(10_000)))
  t.equal(inString.json().error.code, 'NOT_AWAITING', 'brackets inside strings do not count')
  const poisoned = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json' }, payload: '{"__proto__":{"x":1}}' })
  t.equal(poisoned.json().error.code, 'VALIDATION_ERROR', 'the parser behind the check still refuses __proto__')
  t.equal(jsonDepth('{"a":[1,{"b":"]]]\\"[["}],"c":{}}'), 3, 'escaped quotes do not end a string')
})

t.test('Strict-Transport-Security is sent only when AGENTD_HSTS_MAX_AGE is set', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_HSTS_MAX_AGE: '31536000' } })
  t.equal((await app.inject({ method: 'GET', url: '/v1/sessions' })).headers['strict-transport-security'], 'max-age=31536000')
  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).headers['strict-transport-security'], 'max-age=31536000')
})

t.test('CORS', async (t) => {
  t.test('is off by default: no Access-Control headers and no preflight answer', async (t) => {
    const { app } = await buildTestApp(t)
    const res = await app.inject({ method: 'GET', url: '/v1/sessions', headers: { origin: ORIGIN } })
    t.equal(res.statusCode, 200)
    t.notOk(res.headers['access-control-allow-origin'])
    const preflight = await app.inject({
      method: 'OPTIONS', url: '/v1/sessions', headers: { origin: ORIGIN, 'access-control-request-method': 'POST' }
    })
    t.equal(preflight.statusCode, 404)
    t.equal(preflight.json().error.code, 'ROUTE_NOT_FOUND')
    t.notOk(preflight.headers['access-control-allow-origin'])
  })

  t.test('with listed origins, an allowed origin is reflected and may read every header the API documents', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_CORS_ORIGINS: `${ORIGIN},http://localhost:5173`, AGENTD_API_KEYS: KEYS } })
    const res = await app.inject({ method: 'GET', url: '/v1/sessions', headers: { origin: ORIGIN, authorization: `Bearer ${KEY_A}` } })
    t.equal(res.statusCode, 200)
    t.equal(res.headers['access-control-allow-origin'], ORIGIN)
    t.match(res.headers.vary, /Origin/)
    t.same(String(res.headers['access-control-expose-headers']).split(', '),
      ['X-Request-Id', 'Retry-After', 'Idempotent-Replayed', 'X-RateLimit-Limit', 'X-RateLimit-Remaining', 'X-RateLimit-Reset'],
      'every response header the OpenAPI document declares')
    t.notOk(res.headers['access-control-allow-credentials'], 'bearer keys, not cookies')

    const other = await app.inject({ method: 'GET', url: '/v1/sessions', headers: { origin: 'https://evil.example', authorization: `Bearer ${KEY_A}` } })
    t.notOk(other.headers['access-control-allow-origin'], 'an unlisted origin gets no grant')

    const unauthorized = await app.inject({ method: 'GET', url: '/v1/sessions', headers: { origin: ORIGIN } })
    t.equal(unauthorized.statusCode, 401)
    t.equal(unauthorized.headers['access-control-allow-origin'], ORIGIN, 'a browser can read the 401 envelope')
  })

  t.test('a preflight is answered before auth, naming the methods and headers clients use', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_CORS_ORIGINS: ORIGIN, AGENTD_API_KEYS: KEYS } })
    const res = await app.inject({
      method: 'OPTIONS', url: '/v1/sessions/ses_00000000000000000000000000',
      headers: { origin: ORIGIN, 'access-control-request-method': 'DELETE', 'access-control-request-headers': 'authorization,idempotency-key' }
    })
    t.equal(res.statusCode, 204)
    t.equal(res.headers['access-control-allow-origin'], ORIGIN)
    t.same(String(res.headers['access-control-allow-methods']).split(', ').sort(), ['DELETE', 'GET', 'HEAD', 'POST'])
    t.same(String(res.headers['access-control-allow-headers']).split(', '),
      ['Authorization', 'Content-Type', 'Idempotency-Key', 'Last-Event-ID', 'X-Request-Id', 'traceparent', 'tracestate'], 'browser tracing may send its trace context')
    t.equal(res.headers['access-control-max-age'], '600')
  })

  t.test('an OPTIONS request without Origin is not a text/plain 400', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_CORS_ORIGINS: ORIGIN } })
    const res = await app.inject({ method: 'OPTIONS', url: '/v1/sessions' })
    t.ok(res.statusCode < 400, `answered ${res.statusCode}`)
  })

  t.test('* grants every origin', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_CORS_ORIGINS: '*' } })
    const res = await app.inject({ method: 'GET', url: '/v1/sessions', headers: { origin: 'https://anyone.example' } })
    t.equal(res.headers['access-control-allow-origin'], '*')
  })

  t.test('an SSE stream carries the grant (EventSource is a CORS request)', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_CORS_ORIGINS: ORIGIN } })
    const base = await listen(app)
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
    const res = await readSse(`${base}/v1/sessions/${session.id}/events`, { headers: { origin: ORIGIN }, timeoutMs: 200 })
    t.equal(res.status, 200)
    t.equal(res.headers['access-control-allow-origin'], ORIGIN)
    t.match(res.headers['access-control-expose-headers'], /^X-Request-Id, Retry-After, /)
  })

  t.test('every response header the OpenAPI document declares is exposed to a browser', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_CORS_ORIGINS: ORIGIN } })
    const declared = new Set<string>()
    for (const methods of Object.values((await app.inject({ method: 'GET', url: '/openapi.json' })).json().paths as Record<string, Record<string, { responses: Record<string, { headers?: object }> }>>)) {
      for (const op of Object.values(methods)) for (const response of Object.values(op.responses)) for (const name of Object.keys(response.headers ?? {})) declared.add(name.toLowerCase())
    }
    const res = await app.inject({ method: 'GET', url: '/v1/sessions', headers: { origin: ORIGIN } })
    const exposed = String(res.headers['access-control-expose-headers']).toLowerCase().split(', ')
    t.ok(declared.has('idempotent-replayed') && declared.has('x-ratelimit-remaining'), 'the document declares them')
    t.same([...declared].filter((name) => !exposed.includes(name)), [], 'none is hidden from a cross-origin client')
  })

  t.test('a URL the router refuses before any hook (400) carries the grant, as every answer does', async (t) => {
    for (const origins of [ORIGIN, '*']) {
      const { app } = await buildTestApp(t, { env: { AGENTD_CORS_ORIGINS: origins } })
      const normal = await app.inject({ method: 'GET', url: '/no/such/route', headers: { origin: ORIGIN } })
      for (const url of ['/v1/sessions/%E0%A4%A', `/v1/sessions/${'a'.repeat(300)}`]) {
        const res = await app.inject({ method: 'GET', url, headers: { origin: ORIGIN } })
        t.equal(res.statusCode, 400)
        t.equal(res.headers['access-control-allow-origin'], origins === '*' ? '*' : ORIGIN, `${origins}: the grant`)
        for (const name of ['access-control-allow-origin', 'access-control-expose-headers', 'vary']) {
          t.equal(res.headers[name], normal.headers[name], `${origins}: ${name} as on a 404 Fastify answers`)
        }
      }
    }
    const { app } = await buildTestApp(t)
    const off = await app.inject({ method: 'GET', url: '/v1/sessions/%E0%A4%A', headers: { origin: ORIGIN } })
    t.equal(off.statusCode, 400)
    t.notOk(off.headers['access-control-allow-origin'], 'CORS off: no grant')
  })

  t.test('a malformed AGENTD_CORS_ORIGINS stops start-up, naming the variable', async (t) => {
    for (const bad of ['example.com', 'https://a.example/path', 'https://a.example, https://b.example']) {
      let problems: string[] = []
      try {
        loadConfig({ AGENTD_CORS_ORIGINS: bad })
      } catch (err) {
        if (err instanceof ConfigError) problems = err.problems
      }
      t.ok(problems.some((p) => p.startsWith('AGENTD_CORS_ORIGINS=')), `${bad} is refused`)
    }
    t.same(loadConfig({ AGENTD_CORS_ORIGINS: 'https://a.example,http://[::1]:8080,*' }).corsOrigins, ['https://a.example', 'http://[::1]:8080', '*'])
  })
})

t.test('rate limiting', async (t) => {
  t.test('over the limit: 429 RATE_LIMITED in the envelope with Retry-After; probes stay open', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_RATE_LIMIT_MAX: '3' } })
    for (let i = 0; i < 3; i++) {
      const res = await app.inject({ method: 'GET', url: '/v1/sessions' })
      t.equal(res.statusCode, 200, `request ${i + 1} passes`)
      t.equal(res.headers['x-ratelimit-limit'], '3')
      t.equal(res.headers['x-ratelimit-remaining'], String(2 - i))
    }
    assertRateLimited(t, await app.inject({ method: 'GET', url: '/v1/sessions', headers: { 'x-request-id': 'limited-1' } }))
    const post = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })
    assertRateLimited(t, post)
    const list = await app.inject({ method: 'GET', url: '/v1/sessions', remoteAddress: '127.0.0.9' })
    t.same(list.json().data, [], 'the refused POST created nothing (listed from another address, whose budget is whole)')
    const sse = await app.inject({ method: 'GET', url: '/v1/sessions/ses_00000000000000000000000000/events' })
    assertRateLimited(t, sse)
    t.match(sse.headers['content-type'], /application\/json/, 'an SSE route refuses with the JSON envelope, before streaming')
    for (const url of ['/healthz', '/readyz']) {
      for (let i = 0; i < 5; i++) t.equal((await app.inject({ method: 'GET', url })).statusCode, 200, `${url} is exempt`)
    }
  })

  t.test('the budget comes back after the window', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_RATE_LIMIT_MAX: '1', AGENTD_RATE_LIMIT_WINDOW_MS: '1000' } })
    t.equal((await app.inject({ method: 'GET', url: '/v1/sessions' })).statusCode, 200)
    const limited = await app.inject({ method: 'GET', url: '/v1/sessions' })
    assertRateLimited(t, limited)
    t.equal(limited.headers['retry-after'], '1')
    await delay(1100)
    t.equal((await app.inject({ method: 'GET', url: '/v1/sessions' })).statusCode, 200)
  })

  t.test('with API keys each tenant has its own budget, wherever its requests come from', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_RATE_LIMIT_MAX: '2', AGENTD_API_KEYS: KEYS } })
    const get = (key: string, remoteAddress: string) =>
      app.inject({ method: 'GET', url: '/v1/sessions', remoteAddress, headers: { authorization: `Bearer ${key}` } })
    t.equal((await get(KEY_A, '10.0.0.1')).statusCode, 200)
    t.equal((await get(KEY_A, '10.0.0.2')).statusCode, 200)
    assertRateLimited(t, await get(KEY_A, '10.0.0.3'))
    t.equal((await get(KEY_B, '10.0.0.1')).statusCode, 200, 'tenant b is not slowed down by tenant a')
    t.equal((await get(KEY_B, '10.0.0.1')).statusCode, 200)
    assertRateLimited(t, await get(KEY_B, '10.0.0.1'))

    const docs = await app.inject({ method: 'GET', url: '/openapi.json', remoteAddress: '10.0.0.9' })
    t.equal(docs.statusCode, 200, 'open paths outside /v1 are counted by IP, not against a tenant')
  })

  t.test('without API keys each client IP has its own budget', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_RATE_LIMIT_MAX: '1' } })
    const get = (remoteAddress: string) => app.inject({ method: 'GET', url: '/v1/sessions', remoteAddress })
    t.equal((await get('127.0.0.1')).statusCode, 200)
    assertRateLimited(t, await get('127.0.0.1'))
    t.equal((await get('127.0.0.2')).statusCode, 200)
  })

  t.test('AGENTD_RATE_LIMIT_MAX=0 turns it off', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_RATE_LIMIT_MAX: '0' } })
    for (let i = 0; i < 20; i++) {
      const res = await app.inject({ method: 'GET', url: '/v1/sessions' })
      if (res.statusCode !== 200 || res.headers['x-ratelimit-limit'] !== undefined) t.fail(`request ${i + 1} was limited`)
    }
    t.pass('20 requests passed without limit headers')
  })
})
