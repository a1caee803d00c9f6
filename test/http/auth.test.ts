import t from 'tap'
import { buildTestApp, type TapTest } from '../helpers/app.ts'

const KEY_A = 'key-of-tenant-a-0123456789abcdef'
const KEY_B = 'key-of-tenant-b-0123456789abcdef'
const KEYS = `a:${KEY_A},b:${KEY_B}`
const SAMPLE_IDS: Record<string, string> = { id: 'ses_00000000000000000000000000', runId: 'run_00000000000000000000000000', callId: 'call_1' }

type App = Awaited<ReturnType<typeof buildTestApp>>['app']
type Operation = { method: string; path: string; url: string }

/** Every operation of the served OpenAPI document under /v1, with sample IDs in its path. */
async function v1Operations(app: App): Promise<Operation[]> {
  const doc = (await app.inject({ method: 'GET', url: '/openapi.json' })).json() as { paths: Record<string, Record<string, unknown>> }
  return Object.entries(doc.paths)
    .filter(([path]) => path.startsWith('/v1/'))
    .flatMap(([path, operations]) =>
      Object.keys(operations).map((method) => ({
        method: method.toUpperCase(),
        path,
        url: path.replace(/\{(\w+)\}/g, (_, name: string) => SAMPLE_IDS[name] ?? 'x')
      })))
}

function assertUnauthorized(t: TapTest, res: { statusCode: number; headers: Record<string, unknown>; json(): any; body: string }, label: string) {
  t.equal(res.statusCode, 401, `${label}: 401`)
  const { error } = res.json()
  t.equal(error?.code, 'UNAUTHORIZED', `${label}: UNAUTHORIZED`)
  t.equal(error?.requestId, res.headers['x-request-id'], `${label}: envelope with the request id`)
  t.match(res.headers['www-authenticate'], /^Bearer/, `${label}: WWW-Authenticate: Bearer`)
}

t.test('with API keys configured', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_API_KEYS: KEYS, AGENTD_RATE_LIMIT_MAX: '0' } })
  const operations = await v1Operations(app)
  t.ok(operations.length >= 10, `the document lists the /v1 operations (${operations.length})`)

  t.test('every /v1 operation without a key is 401 in the envelope', async (t) => {
    for (const op of operations) {
      assertUnauthorized(t, await app.inject({ method: op.method as 'GET', url: op.url }), `${op.method} ${op.path}`)
    }
    assertUnauthorized(t, await app.inject({ method: 'GET', url: '/v1/no-such-route' }), 'an unknown /v1 route')
  })

  t.test('a wrong key is 401 invalid_token, and the key is not echoed', async (t) => {
    const wrong = 'wrong-key-that-looks-plausible-42'
    for (const op of operations) {
      const res = await app.inject({ method: op.method as 'GET', url: op.url, headers: { authorization: `Bearer ${wrong}` } })
      assertUnauthorized(t, res, `${op.method} ${op.path}`)
      t.equal(res.headers['www-authenticate'], 'Bearer error="invalid_token"')
      t.notMatch(res.body + JSON.stringify(res.headers), wrong, 'the key is not in the answer')
    }
  })

  t.test('malformed Authorization headers are 401', async (t) => {
    const malformed = [
      '', 'Bearer', 'Bearer ', KEY_A, `Basic ${Buffer.from(`a:${KEY_A}`).toString('base64')}`, `Token ${KEY_A}`,
      `Bearer ${KEY_A} extra`, `Bearer  ${KEY_A}x`, `Bearer ${KEY_A.slice(0, -1)}`, `Bearer ${KEY_A}${KEY_A}`, `Bearer${KEY_A}`
    ]
    for (const authorization of malformed) {
      const res = await app.inject({ method: 'GET', url: '/v1/sessions', headers: { authorization } })
      assertUnauthorized(t, res, JSON.stringify(authorization.replace(KEY_A, '<key>')))
      t.notMatch(res.body, KEY_A, 'the key is not in the answer')
    }
  })

  t.test('a valid key, in any case of the scheme, gets in as its tenant', async (t) => {
    for (const scheme of ['Bearer', 'bearer', 'BEARER']) {
      const res = await app.inject({ method: 'GET', url: '/v1/sessions', headers: { authorization: `${scheme} ${KEY_A}` } })
      t.equal(res.statusCode, 200, scheme)
    }
    const created = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] }, headers: { authorization: `Bearer ${KEY_B}` } })
    t.equal(created.statusCode, 201)
    t.ok(await app.agentd.store.getSession('b', created.json().id), 'stored under tenant b')
    t.notOk(await app.agentd.store.getSession('a', created.json().id), 'not under tenant a')
  })

  t.test('probes, the OpenAPI document and the docs UI are open', async (t) => {
    for (const url of ['/healthz', '/readyz', '/openapi.json', '/docs/', '/docs/json']) {
      t.equal((await app.inject({ method: 'GET', url })).statusCode, 200, url)
    }
  })
})

t.test('AGENTD_DOCS_PUBLIC=false puts the OpenAPI document and the docs UI behind a key', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_API_KEYS: KEYS, AGENTD_DOCS_PUBLIC: 'false' } })
  for (const url of ['/openapi.json', '/docs/']) {
    const refused = await app.inject({ method: 'GET', url })
    t.equal(refused.statusCode, 401, `${url} without a key`)
    t.equal(refused.json().error.code, 'UNAUTHORIZED')
    t.equal((await app.inject({ method: 'GET', url, headers: { authorization: `Bearer ${KEY_A}` } })).statusCode, 200, `${url} with a key`)
  }
  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200, 'probes stay open')
})

t.test('without API keys every route works without an Authorization header', async (t) => {
  const { app } = await buildTestApp(t)
  const operations = await v1Operations(app)
  for (const op of operations) {
    const res = await app.inject({
      method: op.method as 'GET', url: op.url, headers: { accept: 'application/json' }, ...(op.method === 'POST' ? { payload: {} } : {})
    })
    t.not(res.statusCode, 401, `${op.method} ${op.path} answers ${res.statusCode}, not 401`)
  }
  const created = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })
  t.equal(created.statusCode, 201)
  const id = created.json().id
  t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${id}` })).statusCode, 200)
  const ignored = await app.inject({ method: 'GET', url: `/v1/sessions/${id}`, headers: { authorization: 'Bearer anything-at-all-here' } })
  t.equal(ignored.statusCode, 200, 'a stray Authorization header is ignored')
  t.equal((await app.inject({ method: 'DELETE', url: `/v1/sessions/${id}` })).statusCode, 204)
})

t.test('API keys never reach the logs', async (t) => {
  const lines: string[] = []
  const { app, devModel } = await buildTestApp(t, {
    env: { AGENTD_API_KEYS: KEYS },
    app: { logger: { level: 'trace', stream: { write: (line: string) => lines.push(line) } } }
  })
  const headers = { authorization: `Bearer ${KEY_A}` }
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] }, headers })).json()
  devModel.script({ text: 'logged run' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'hi' }, headers })
  await app.inject({ method: 'GET', url: '/v1/sessions/ses_00000000000000000000000000', headers })
  await app.inject({ method: 'POST', url: '/v1/sessions', payload: '{"broken', headers: { ...headers, 'content-type': 'application/json' } })
  await app.inject({ method: 'GET', url: '/v1/sessions', headers: { authorization: `Bearer ${KEY_B}x` } })
  await app.inject({ method: 'GET', url: '/v1/sessions', headers: { authorization: `Basic ${KEY_B}` } })
  t.ok(lines.length > 10, `requests were logged (${lines.length} lines at trace level)`)
  t.ok(lines.some((line) => line.includes('"reqId"')), 'request log lines are present')
  for (const key of [KEY_A, KEY_B]) {
    t.notOk(lines.find((line) => line.includes(key)), `no line contains the key of ${key === KEY_A ? 'a' : 'b'}`)
  }
})
