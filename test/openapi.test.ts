import { execFile } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import t from 'tap'
import { API_ERRORS } from '../src/http/errors.ts'
import { buildTestApp } from './helpers/app.ts'
import { renderOpenApiDocument } from '../src/openapi-document.ts'

const run = promisify(execFile)

/** The committed document (the first test checks it is what the app serves), its operations, and the README that lists them. */
const doc = JSON.parse(readFileSync(new URL('../openapi/openapi.json', import.meta.url), 'utf8'))
const operations = Object.entries(doc.paths as Record<string, Record<string, any>>).flatMap(([path, methods]) =>
  Object.entries(methods).map(([method, op]) => ({ path, method, name: `${method.toUpperCase()} ${path}`, op }))
)
const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8')

t.test('openapi/openapi.json is what the app serves (run `npm run openapi` after changing a route)', async (t) => {
  const committed = readFileSync(new URL('../openapi/openapi.json', import.meta.url), 'utf8')
  t.equal(await renderOpenApiDocument(), committed)
})

t.test("the README's API table names every operation of the document, and only those", async (t) => {
  const served = operations.map((op) => op.name)
  const start = readme.indexOf('\n## The API at a glance')
  const table = readme.slice(start, readme.indexOf('\n### ', start)).split('\n').filter((line) => line.startsWith('| `'))
  const listed = table.flatMap((row) => [...(row.split(' | ')[0] ?? '').matchAll(/`(GET|POST|PUT|PATCH|DELETE) ([^`?\s]+)/g)]
    .map((m) => `${m[1]} ${m[2]}`))
  t.same(served.filter((op) => !listed.includes(op)), [], 'every operation has a row')
  // The document and its UI are served beside the API, not described in it.
  t.same(listed.filter((op) => !served.includes(op) && op !== 'GET /openapi.json' && op !== 'GET /docs'), [], 'every row is an operation')
})

t.test('the README lists every error code of the catalogue with its status', async (t) => {
  const start = readme.indexOf('**Every non-2xx response**')
  const paragraph = readme.slice(start, readme.indexOf('\n\n', start)).replace(/\s+/g, ' ')
  // Codes are listed in groups, each followed by its status: `A`, `B` (409), `C` (413) …
  const listed = new Map<string, number>()
  for (const [, codes = '', status] of paragraph.matchAll(/((?:`[A-Z_]+`,? ?)+)\((\d{3})/g)) {
    for (const [, code] of codes.matchAll(/`([A-Z_]+)`/g)) listed.set(code ?? '', Number(status))
  }
  t.same(Object.fromEntries(listed), Object.fromEntries(Object.entries(API_ERRORS).map(([code, e]) => [code, e.status])))
})

t.test('every operation that takes a body answers a bad one with 400, 413 or 415 in the envelope, and declares each', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_BODY_LIMIT: '2048' } })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  const bodies = [
    { status: 415, headers: { 'content-type': 'text/plain' }, payload: 'hello' },
    { status: 413, headers: { 'content-type': 'application/json' }, payload: JSON.stringify({ content: 'x'.repeat(4096) }) },
    { status: 400, headers: { 'content-type': 'application/json' }, payload: '{"content":' }
  ]
  for (const { path, method, name, op } of operations) {
    if (method !== 'post' && method !== 'delete') continue
    const url = path.replace('{id}', session.id).replace('{callId}', 'call_1')
    for (const { status, headers, payload } of bodies) {
      const res = await app.inject({ method: method.toUpperCase() as 'POST' | 'DELETE', url, headers, payload })
      t.equal(res.statusCode, status, `${name} answers ${status}`)
      t.ok(res.json().error?.code, `${name}: ${status} in the envelope`)
      t.ok(op.responses[String(status)], `${name} declares ${status}`)
    }
  }
})

t.test('every POST answers a key still being processed with 409 and a reused key with 422 in the envelope, and declares each', async (t) => {
  const { app } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  // The store says what the idempotency plugin asks it; a claim is in progress or was made with another request.
  const { store } = app.agentd
  const claim = store.claimIdempotency.bind(store)
  store.claimIdempotency = async (c) =>
    c.key === 'held' ? { state: 'in_progress' } : c.key === 'reused' ? { state: 'mismatch' } : claim(c)
  const validBodies: Record<string, object> = {
    '/v1/sessions/{id}/messages': { content: 'hello' },
    '/v1/sessions/{id}/approvals/{callId}': { decision: 'allow' },
    '/v1/sessions/{id}/tool-results/{callId}': { output: 'blue' }
  }
  for (const { path, method, name, op } of operations) {
    if (method !== 'post') continue
    const url = path.replace('{id}', session.id).replace('{callId}', 'call_1')
    const payload = validBodies[path] ?? {}
    for (const [key, status, code] of [['held', 409, 'IDEMPOTENCY_IN_PROGRESS'], ['reused', 422, 'IDEMPOTENCY_KEY_REUSED']] as const) {
      const res = await app.inject({ method: 'POST', url, headers: { 'idempotency-key': key }, payload })
      t.equal(res.json().error?.code, code, `${name} answers ${code}`)
      t.ok(op.responses[String(status)], `${name} declares ${status}`)
    }
  }
})

t.test('every operation has a summary, tags and an error envelope response', async (t) => {
  t.equal(doc.openapi, '3.1.0')
  t.ok(doc.components.schemas.ErrorEnvelope, 'ErrorEnvelope is a component')
  t.ok(operations.length >= 6, 'has the routes')
  for (const { name, op } of operations) {
    t.ok(op.summary, `${name} has a summary`)
    t.ok(op.tags?.length, `${name} has tags`)
    const errorStatuses = Object.keys(op.responses).filter((s) => Number(s) >= 400)
    if (name.startsWith('GET /healthz')) continue
    t.ok(errorStatuses.length > 0, `${name} declares error responses`)
    for (const status of errorStatuses) {
      const schema = op.responses[status].content['application/json'].schema
      t.equal(schema.$ref, '#/components/schemas/ErrorEnvelope', `${name} ${status} is the envelope`)
    }
  }
})

t.test('@redocly/cli lint with its recommended rules finds no error (offline)', async (t) => {
  const bin = fileURLToPath(new URL('../node_modules/.bin/redocly', import.meta.url))
  const document = fileURLToPath(new URL('../openapi/openapi.json', import.meta.url))
  const { stdout } = await run(bin, ['lint', document, '--format=json', '--extends=recommended'], {
    env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' }, timeout: 60_000
  }).catch((err: { stdout?: string }) => ({ stdout: err.stdout ?? '' }))
  const report = JSON.parse(stdout) as { totals: { errors: number }; problems: Array<{ severity: string; ruleId: string; message: string }> }
  t.same(report.problems.filter((p) => p.severity === 'error'), [], 'no error-level problem')
  t.equal(report.totals.errors, 0)
})

t.test('the document meets SPEC 13', async (t) => {
  t.test('every operation has a unique camelCase operationId', async (t) => {
    const ids = operations.map(({ op }) => op.operationId)
    for (const { name, op } of operations) t.match(op.operationId, /^[a-z][A-Za-z]+$/, `${name}: ${op.operationId}`)
    t.equal(new Set(ids).size, ids.length, 'unique')
    t.ok(['createSession', 'listSessions', 'sendMessage', 'streamEvents', 'createStreamToken'].every((id) => ids.includes(id)))
  })

  t.test('servers, license and bearer security; none on the probes', async (t) => {
    t.ok(doc.servers?.[0]?.url, 'a server')
    t.equal(doc.info.license.identifier, 'MIT')
    t.same(doc.security, [{ bearerAuth: [] }])
    t.equal(doc.components.securitySchemes.bearerAuth.scheme, 'bearer')
    for (const { name, path, op } of operations) {
      if (['/healthz', '/readyz', '/metrics'].includes(path)) t.same(op.security, [], `${name} needs no key`)
      else t.equal(op.security, undefined, `${name} takes the global bearer security`)
    }
  })

  t.test('enums are enum arrays, never unions of constants; the error code is the catalogue', async (t) => {
    const unions: string[] = []
    const walk = (node: unknown, at: string): void => {
      if (!node || typeof node !== 'object') return
      for (const key of ['anyOf', 'oneOf'] as const) {
        const members = (node as Record<string, unknown>)[key]
        if (Array.isArray(members) && members.every((m) => m && typeof m === 'object' && ('const' in m || (Array.isArray(m.enum) && m.enum.length === 1)))) unions.push(at)
      }
      for (const [key, value] of Object.entries(node)) walk(value, `${at}/${key}`)
    }
    walk(doc, '#')
    t.same(unions, [], 'no union of constants')
    t.same(doc.components.schemas.ErrorEnvelope.properties.error.properties.code.enum, Object.keys(API_ERRORS))
  })

  t.test('headers are documented: X-Request-Id everywhere, Idempotency-Key on POST, Retry-After on 429 and 503', async (t) => {
    for (const { name, method, op } of operations) {
      const params = (op.parameters as Array<{ $ref?: string }>).map((p) => p.$ref)
      t.ok(params.includes('#/components/parameters/RequestId'), `${name} takes X-Request-Id`)
      if (method === 'post') t.ok(params.includes('#/components/parameters/IdempotencyKey'), `${name} takes Idempotency-Key`)
      for (const [status, response] of Object.entries(op.responses as Record<string, any>)) {
        t.ok(response.headers['X-Request-Id'], `${name} ${status} sends X-Request-Id`)
        if (status === '429' || status === '503') t.ok(response.headers['Retry-After'], `${name} ${status} sends Retry-After`)
        if (method === 'post' && Number(status) < 300) t.ok(response.headers['Idempotent-Replayed'], `${name} ${status} may be a replay`)
      }
    }
    t.equal(doc.components.parameters.IdempotencyKey.name, 'Idempotency-Key')
  })

  t.test('the rate limit headers an answer carries are declared on its status, error answers included', async (t) => {
    const { app } = await buildTestApp(t, { env: { AGENTD_BODY_LIMIT: '2048' } })
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
    const answers = [
      ['/v1/sessions/{id}', 'get', { method: 'GET', url: '/v1/sessions/ses_missing' }],
      ['/v1/sessions', 'post', { method: 'POST', url: '/v1/sessions', payload: { model: 42 } }],
      ['/v1/sessions', 'post', { method: 'POST', url: '/v1/sessions', payload: { instructions: 'x'.repeat(4096) } }],
      ['/v1/sessions', 'post', { method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'text/plain' }, payload: 'x' }],
      ['/v1/sessions/{id}/interrupt', 'post', { method: 'POST', url: `/v1/sessions/${session.id}/interrupt` }],
      ['/v1/sessions/{id}/events', 'get', { method: 'GET', url: `/v1/sessions/${session.id}/events?after=5`, headers: { accept: 'application/json' } }]
    ] as const
    for (const [path, method, request] of answers) {
      const res = await app.inject(request)
      const declared = Object.keys(doc.paths[path][method].responses[res.statusCode]?.headers ?? {}).map((h) => h.toLowerCase())
      const sent = Object.keys(res.headers).filter((h) => h.startsWith('x-ratelimit-'))
      t.ok(sent.length > 0, `${method} ${path} ${res.statusCode} carries them`)
      t.same(sent.filter((h) => !declared.includes(h)), [], `${method} ${path} ${res.statusCode} declares them`)
    }
  })

  t.test('optional query parameters and bodies are optional', async (t) => {
    const list = doc.paths['/v1/sessions'].get.parameters.find((p: any) => p.name === 'limit')
    t.equal(list.required, false, 'GET /v1/sessions limit')
    t.equal(doc.paths['/v1/sessions'].post.requestBody.required, false, 'POST /v1/sessions: no body is {}')
    t.equal(doc.paths['/v1/sessions/{id}/fork'].post.requestBody.required, false, 'fork')
    t.equal(doc.paths['/v1/sessions/{id}/stream-tokens'].post.requestBody.required, false, 'stream-tokens')
    t.equal(doc.paths['/v1/sessions/{id}/messages'].post.requestBody.required, true, 'a message needs its content')
    // A parameter with a default may be left out; a generated client must not demand it.
    for (const { name, op } of operations) {
      for (const param of (op.parameters ?? []) as Array<{ in?: string; name?: string; required?: boolean; schema?: { default?: unknown } }>) {
        if (param.in === 'query' && param.schema?.default !== undefined) t.notOk(param.required, `${name} ?${param.name} is optional`)
      }
    }
  })

  t.test('SSE answers declare text/event-stream; Event is one union by type with data per type', async (t) => {
    t.ok(doc.paths['/v1/sessions/{id}/events'].get.responses['200'].content['text/event-stream'])
    t.ok(doc.paths['/v1/sessions/{id}/messages'].post.responses['200'].content['text/event-stream'])
    const { Event, CoreEvent, DoneEvent } = doc.components.schemas
    t.same(Event.oneOf.map((m: any) => m.$ref), ['#/components/schemas/CoreEvent', '#/components/schemas/ToolProgressEvent'])
    t.equal(CoreEvent.discriminator.propertyName, 'type')
    t.equal(CoreEvent.discriminator.mapping.done, '#/components/schemas/DoneEvent')
    t.equal(CoreEvent.oneOf.length, Object.keys(CoreEvent.discriminator.mapping).length, 'every fixed type is mapped')
    t.same(DoneEvent.properties.data.properties.reason.enum, ['completed', 'interrupted', 'failed', 'max_steps'])
  })
})
