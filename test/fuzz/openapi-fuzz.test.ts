import fc from 'fast-check'
import t from 'tap'
import { API_ERRORS } from '../../src/http/errors.ts'
import { buildTestApp } from '../helpers/app.ts'

/**
 * Every operation of the served OpenAPI document, fed bad input: wrong types, strings beyond the
 * limits, unicode edge cases, 10 000-deep JSON, prototype-pollution keys, bad path IDs and bad
 * headers. No answer may be a 5xx, every error must be the envelope naming the request, and the
 * service must still serve afterwards. Seeded, so every run sends the same requests.
 */

const SEED = 20261121
const RUNS_PER_OPERATION = 80
const KEY = 'fuzz-tenant-key-0123456789abcdef'
const DEPTH = 10_000

type Schema = { type?: string; properties?: Record<string, Schema>; required?: string[]; anyOf?: Schema[]; enum?: unknown[] }
type Parameter = { name: string; in: 'path' | 'query' | 'header' }
type Operation = {
  method: string
  path: string
  parameters: Parameter[]
  /** The JSON body schema, when the operation takes one. */
  body: Schema | null
  /** Answers SSE unless asked for JSON: it is always asked for JSON here, so that it ends. */
  streams: boolean
}
type Probe = {
  pathValues: Record<string, string>
  query: string
  body: string | undefined
  headers: Record<string, string>
}

const HUGE = 'x'.repeat(300_000)
const OVER_BODY_LIMIT = `{"content":"${'y'.repeat(1_100_000)}"}`
const POLLUTION_KEYS = ['__proto__', 'constructor', 'prototype']
const deepArray = '['.repeat(DEPTH) + ']'.repeat(DEPTH)
const deepObject = '{"a":'.repeat(DEPTH) + '1' + '}'.repeat(DEPTH)

/** Unicode a parser or a store may trip on: NUL, lone surrogates, bidi overrides, ZWJ emoji, BOM, combining marks. */
const edgeUnicode = fc.constantFrom(
  '\u0000', 'a\u0000b', '\uD800', '\uDFFF', 'x\uD83D', '\u202Eevil\u202C', '\u200F\u200E', '👩‍👩‍👧‍👦', '🦀🔥', '\uFEFF', 'İı', 'e\u0301\u0301\u0301', '𝕏𝔂𝔃', '\uFFFF', '\u0085\u2028\u2029'
)
const weirdString = fc.oneof(
  fc.string({ unit: fc.oneof(fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }), edgeUnicode), maxLength: 40 }),
  edgeUnicode,
  fc.constantFrom(HUGE, '', ' ', '../../../etc/passwd', '..\\..\\windows', '%00', '${jndi:x}', '<script>', 'null', 'true', '-1', '1e309', ...POLLUTION_KEYS)
)
const wrongValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.integer(), fc.double(), fc.boolean(), fc.constant(null), weirdString,
  fc.array(weirdString, { maxLength: 3 }), fc.jsonValue({ maxDepth: 3 }), fc.constant(-1), fc.constant(Number.MAX_SAFE_INTEGER)
)

/** Header values as Node's HTTP parser would let them through: tab, printable ASCII and latin-1. */
const headerText = fc.oneof(
  fc.string({ unit: fc.integer({ min: 0x20, max: 0xff }).filter((c) => c < 0x7f || c > 0x9f).map((c) => String.fromCharCode(c)), maxLength: 60 }),
  fc.constantFrom('', ' ', '\t', '*/*;q=abc', 'x'.repeat(8000), '-1', '999999999999999999999', '1.5', '0x10', 'NaN', '../..', 'é')
)

/** JSON with everything outside printable ASCII escaped, so that test names and failure reports stay one TAP line. */
const ascii = (value: unknown) =>
  (JSON.stringify(value) ?? 'undefined').replace(/[^\x20-\x7e]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)

/** Percent-encodes text, writing lone surrogates as the (invalid) UTF-8 bytes of their code unit. */
function encode(text: string): string {
  let out = ''
  for (const char of text) {
    const code = char.codePointAt(0) ?? 0
    out += code >= 0xd800 && code <= 0xdfff
      ? `%${(0xe0 | (code >> 12)).toString(16)}%${(0x80 | ((code >> 6) & 0x3f)).toString(16)}%${(0x80 | (code & 0x3f)).toString(16)}`
      : encodeURIComponent(char)
  }
  return out
}

/** Path IDs the routes themselves must refuse: long, unicode, traversal, NUL, pollution names. */
const badId = fc.oneof(
  weirdString.filter((text) => !/[\uD800-\uDFFF]/u.test(text)).map(encode).filter((text) => text.length <= 200),
  fc.constantFrom(
    'a'.repeat(200), 'ses_' + 'Z'.repeat(150), '..', '..%2F..%2Fetc', '%2e%2e%2f%2e%2e', '%00', '%2F', '%5C..%5C',
    'ses_00000000000000000000000000', 'call_' + 'c'.repeat(150), '__proto__', 'constructor', encode('\u202E'), encode('🦀'), encode('ses_\u0000')
  )
)

/** Paths Fastify's router refuses before any hook runs: malformed percent-encoding, a parameter over 200 characters. */
const ROUTER_REFUSED_IDS = ['%ED%A0%80', '%', '%zz', '%E0%A4%A', 'a'.repeat(201)]

function queryArb(names: string[]): fc.Arbitrary<string> {
  const key = fc.oneof(
    fc.constantFrom(...names, ...POLLUTION_KEYS, '__proto__[polluted]', 'constructor[prototype][polluted]', 'a[]'),
    weirdString
  )
  const pair = fc.tuple(key, wrongValue).map(([k, v]) => `${encode(k)}=${encode(typeof v === 'string' ? v : JSON.stringify(v) ?? '')}`)
  return fc.oneof(
    fc.constant(''),
    fc.array(pair, { maxLength: 5 }).map((pairs) => pairs.join('&')),
    fc.constantFrom('', '%', '%zz=1', 'limit=%E0%A4%A', '&&&', '==', 'a=1&a=2&a=3', `cursor=${'A'.repeat(5000)}`, 'after=-1', 'after=1e400', 'wait=maybe')
  )
}

/** Inserts `"key": value` as the first member of a JSON object text (JSON.stringify would drop or hide them). */
const withMember = (json: string, key: string, value: string) =>
  json.startsWith('{') && json.length > 2 ? `{${JSON.stringify(key)}:${value},${json.slice(1)}` : `{${JSON.stringify(key)}:${value}}`

/** A value of the schema's shape where it can be, filled with edge cases: unicode, boundaries, strings past maxLength. */
function edgeValue(schema: Schema): fc.Arbitrary<unknown> {
  const branches = schema.anyOf ?? []
  if (branches.length > 0) return fc.oneof(...branches.map(edgeValue))
  if (schema.enum) return fc.oneof(fc.constantFrom(...schema.enum), weirdString)
  if (schema.type === 'string') return weirdString
  if (schema.type === 'integer') return fc.oneof(fc.constantFrom(0, -1, 1, 2 ** 31, 2 ** 53, -(2 ** 53), 1e21), fc.integer())
  if (schema.type === 'object' && schema.properties) return edgeObject(schema)
  return wrongValue
}

function edgeObject(schema: Schema): fc.Arbitrary<Record<string, unknown>> {
  const properties = schema.properties ?? {}
  return fc.record(
    Object.fromEntries(Object.entries(properties).map(([key, property]) => [key, edgeValue(property)])),
    { requiredKeys: (schema.required ?? []).filter((key) => key in properties) }
  )
}

function bodyArb(schema: Schema): fc.Arbitrary<string> {
  const keys = [...new Set([...Object.keys(schema.properties ?? {}), ...(schema.anyOf ?? []).flatMap((s) => Object.keys(s.properties ?? {}))])]
  const shaped = fc.dictionary(fc.constantFrom(...(keys.length > 0 ? keys : ['x'])), wrongValue, { maxKeys: 4 }).map((o) => JSON.stringify(o))
  return fc.oneof(
    { weight: 3, arbitrary: edgeValue(schema).map((v) => JSON.stringify(v) ?? 'null') },
    fc.jsonValue({ maxDepth: 2 }).map((v) => JSON.stringify(v)),
    shaped,
    fc.tuple(shaped, fc.constantFrom(...POLLUTION_KEYS), fc.constantFrom('{"polluted":true}', '{"prototype":{"polluted":true}}', '1', 'null'))
      .map(([json, key, value]) => withMember(json, key, value)),
    fc.constantFrom(...keys, 'x').map((key) => `{${JSON.stringify(key)}:${deepArray}}`),
    fc.constantFrom(...keys, 'x').map((key) => `{${JSON.stringify(key)}:${deepObject}}`),
    fc.constantFrom(
      deepArray, deepObject, OVER_BODY_LIMIT, '', '{', '{"a":}', 'nul', '\uFEFF{}', '{"a":"\\ud800"}', '{"content":"\\u0000"}',
      '{"content":"\\udfff\\ud800"}', '{"a":1,"a":2}', '[1,2,', '"just a string"', '1e999', '{"__proto__":{"polluted":true}}',
      '{"constructor":{"prototype":{"polluted":true}}}'
    )
  )
}

function probeArb(op: Operation, realIds: () => Record<string, string>): fc.Arbitrary<Probe> {
  const pathNames = op.parameters.filter((p) => p.in === 'path').map((p) => p.name)
  const queryNames = op.parameters.filter((p) => p.in === 'query').map((p) => p.name)
  const pathValues = fc.record(Object.fromEntries(pathNames.map((name) => [name, fc.oneof(
    { weight: 2, arbitrary: fc.constant(`@real:${name}`) },
    { weight: 3, arbitrary: badId }
  )])) as Record<string, fc.Arbitrary<string>>)
  const contentType = fc.oneof(
    { weight: 4, arbitrary: fc.constant('application/json') },
    { weight: 1, arbitrary: fc.constantFrom('text/plain', 'application/json; charset=utf-16', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/json;;;', '*/*', 'application/jsonx', 'APPLICATION/JSON', 'application/json; charset=klingon') },
    { weight: 1, arbitrary: headerText }
  )
  const garbageHeaders = fc.record({
    accept: op.streams ? fc.constant('application/json') : fc.oneof(fc.constant('application/json'), headerText),
    'content-type': contentType,
    authorization: fc.oneof({ weight: 9, arbitrary: fc.constant(`Bearer ${KEY}`) }, { weight: 1, arbitrary: headerText }),
    'last-event-id': headerText,
    'x-request-id': headerText,
    'idempotency-key': headerText
  }, { requiredKeys: ['accept', 'content-type', 'authorization'] })
  // Clean headers now and then, so that edge-case bodies get past the header checks into the handlers.
  const headers = fc.oneof(
    fc.constant({ accept: 'application/json', 'content-type': 'application/json', authorization: `Bearer ${KEY}` }),
    { weight: 2, arbitrary: garbageHeaders }
  )
  const body = op.body ? bodyArb(op.body) : fc.option(bodyArb({}), { freq: 5, nil: undefined })
  return fc.record({ pathValues, query: queryArb(queryNames), body, headers }).map((probe) => ({
    ...probe,
    pathValues: Object.fromEntries(Object.entries(probe.pathValues).map(([name, value]) => [name, value.startsWith('@real:') ? realIds()[name] ?? 'x' : value]))
  }))
}

function operationsOf(doc: { paths: Record<string, Record<string, { parameters?: Parameter[]; requestBody?: { content?: Record<string, { schema?: Schema }> }; responses?: Record<string, { content?: Record<string, unknown> }> }>> }): Operation[] {
  return Object.entries(doc.paths).flatMap(([path, operations]) =>
    Object.entries(operations).map(([method, op]) => {
      const schema = op.requestBody?.content?.['application/json']?.schema
      return {
        method: method.toUpperCase(),
        path,
        parameters: op.parameters ?? [],
        body: schema ?? null,
        streams: Object.values(op.responses ?? {}).some((response) => response.content?.['text/event-stream'] !== undefined)
      }
    }))
}

t.test('bad input to every operation: never a 5xx, always the envelope, and the service keeps serving', async (t) => {
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `fuzz:${KEY}`, AGENTD_RATE_LIMIT_MAX: '0' } })
  const auth = { authorization: `Bearer ${KEY}` }
  const doc = (await app.inject({ method: 'GET', url: '/openapi.json' })).json()
  const operations = operationsOf(doc)
  t.ok(operations.length >= 14, `${operations.length} operations in the document`)

  const real: Record<string, string> = {}
  async function freshSession() {
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', headers: auth, payload: { tools: [] } })).json()
    const posted = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, headers: auth, payload: { content: 'hi' } })).json()
    Object.assign(real, { id: session.id, runId: posted.run.id, callId: 'call_nothing_waits' })
  }
  await freshSession()

  let requests = 0
  for (const op of operations) {
    const failures: string[] = []
    const result = await fc.check(
      fc.asyncProperty(probeArb(op, () => real), async (probe) => {
        const url = op.path.replace(/\{(\w+)\}/g, (_, name: string) => probe.pathValues[name] ?? 'x') + (probe.query ? `?${probe.query}` : '')
        const shown = `${op.method} ${url.slice(0, 120)} body=${ascii(probe.body?.slice(0, 80))} headers=${ascii(probe.headers).slice(0, 300)}`
        let problem: string | null
        try {
          const res = await app.inject({ method: op.method as 'GET', url, headers: probe.headers, ...(probe.body === undefined ? {} : { payload: probe.body }) })
          requests++
          problem = checkAnswer(res)
          if (!problem && op.method === 'DELETE' && res.statusCode === 204) await freshSession()
        } catch (err) {
          problem = `the request threw ${String(err)}`
        }
        if (problem) failures.push(`${problem}: ${shown}`)
        return problem === null
      }),
      { seed: SEED, numRuns: RUNS_PER_OPERATION, endOnFailure: true }
    )
    t.same(failures, [], `${op.method} ${op.path}: every answer is a 2xx or a 4xx envelope`)
    t.notOk(result.failed, `${op.method} ${op.path}: the property held for ${result.numRuns} runs`)
  }
  t.ok(requests >= operations.length * RUNS_PER_OPERATION, `${requests} requests sent`)

  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200, '/healthz still answers')
  t.equal((await app.inject({ method: 'GET', url: '/readyz' })).statusCode, 200, '/readyz still answers')
  devModel.script({ text: 'still here' })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', headers: auth, payload: { tools: [] } })).json()
  const after = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, headers: auth, payload: { content: 'ok?' } })
  t.equal(after.json().message?.content, 'still here', 'a new session still runs to completion')
  t.equal(({} as Record<string, unknown>).polluted, undefined, 'Object.prototype was not polluted')
})

/** Why an answer breaks the contract, or null when it keeps it. */
function checkAnswer(res: { statusCode: number; headers: Record<string, unknown>; body: string }): string | null {
  if (res.statusCode >= 500) return `status ${res.statusCode}: ${ascii(res.body.slice(0, 200))}`
  if (res.statusCode < 400) return res.statusCode >= 200 && res.statusCode < 300 ? null : `status ${res.statusCode}`
  let error: { code?: string; requestId?: string; message?: string; timestamp?: string; retryable?: boolean } | undefined
  try {
    error = (JSON.parse(res.body) as { error?: typeof error }).error
  } catch {
    return `a ${res.statusCode} that is not JSON: ${ascii(res.body.slice(0, 100))}`
  }
  if (!error || typeof error.message !== 'string' || typeof error.timestamp !== 'string' || typeof error.retryable !== 'boolean') {
    return `a ${res.statusCode} without the envelope: ${ascii(res.body.slice(0, 200))}`
  }
  const entry = API_ERRORS[error.code as keyof typeof API_ERRORS]
  if (!entry || entry.status !== res.statusCode) return `code ${error.code} does not belong to status ${res.statusCode}`
  if (error.requestId !== res.headers['x-request-id']) return `envelope requestId ${error.requestId} is not X-Request-Id ${String(res.headers['x-request-id'])}`
  return null
}

/** True when a string holds no lone UTF-16 surrogate. */
const wellFormed = (text: string) => !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(text)

t.test('unicode edge cases travel through a whole run: message, model, events, history', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [], instructions: '\u202E\u0000\uFFFF🦀', metadata: { '\u0000k': '\uFEFF' } } })).json()
  t.ok(session.id, 'a session with edge-case instructions and metadata is created')
  const lone = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [], instructions: '\u202E\uD800🦀' } })
  t.equal(lone.statusCode, 400, 'a lone surrogate, which no stored text can keep, is refused')
  const samples = [...new Set(fc.sample(edgeUnicode, { seed: SEED, numRuns: 30 }))]
  const sent: string[] = []
  for (const content of samples) {
    devModel.script({ text: `echo ${content}` })
    const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: `say ${content}` } })
    if (!wellFormed(content)) {
      t.match(res.json().error, { code: 'VALIDATION_ERROR', details: { fields: [{ field: 'body.content' }] } }, `${ascii(content)}: a 400 naming the field`)
      continue
    }
    sent.push(`say ${content}`)
    t.equal(res.statusCode, 200, `${ascii(content)}: answered`)
    t.equal(res.json().run?.status, 'completed', `${ascii(content)}: the run completed`)
  }
  const events = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })
  t.equal(events.statusCode, 200, 'the events page serializes')
  const history = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })
  t.equal(history.statusCode, 200, 'the history serializes')
  t.same(history.json().data.filter((m: { role: string }) => m.role === 'user').map((m: { content: string }) => m.content), sent, 'the text is stored as sent')
})

t.test('paths the router refuses answer with the envelope too', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `fuzz:${KEY}`, AGENTD_RATE_LIMIT_MAX: '0' } })
  const operations = operationsOf((await app.inject({ method: 'GET', url: '/openapi.json' })).json()).filter((op) => op.path.includes('{'))
  for (const op of operations) {
    for (const id of ROUTER_REFUSED_IDS) {
      const url = op.path.replace(/\{(\w+)\}/g, id)
      const res = await app.inject({ method: op.method as 'GET', url, headers: { authorization: `Bearer ${KEY}`, accept: 'application/json' } })
      t.equal(checkAnswer(res), null, `${op.method} ${url.slice(0, 60)}`)
    }
  }
})
