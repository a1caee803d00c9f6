import { gzipSync } from 'node:zlib'
import t from 'tap'
import { API_ERRORS } from '../../src/http/errors.ts'
import { buildTestApp, type TapTest } from '../helpers/app.ts'

const ENVELOPE_KEYS = ['code', 'message', 'requestId', 'retryable', 'timestamp']

function assertEnvelope(t: TapTest, res: { statusCode: number; json(): any; headers: Record<string, unknown> }, status: number, code: string) {
  t.equal(res.statusCode, status, `status ${status}`)
  const body = res.json()
  t.same(Object.keys(body), ['error'], 'only the error key')
  t.equal(body.error.code, code)
  for (const key of ENVELOPE_KEYS) t.ok(key in body.error, `has ${key}`)
  t.equal(body.error.requestId, res.headers['x-request-id'])
  t.ok(!Number.isNaN(Date.parse(body.error.timestamp)), 'timestamp is a date')
  t.notMatch(JSON.stringify(body), /at .*\.ts:\d+|node_modules|stack/i, 'no stack or internals')
  return body.error
}

t.test('the catalogue gives every code one status and a message', async (t) => {
  for (const [code, entry] of Object.entries(API_ERRORS)) {
    t.ok(entry.status >= 400 && entry.status < 600, `${code} has an error status`)
    t.ok(entry.message.length > 0, `${code} has a message`)
  }
})

t.test('every kind of failure answers with the envelope', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_BODY_LIMIT: '2048' } })

  t.test('validation errors list each failing field', async (t) => {
    const res = await app.inject({
      method: 'POST', url: '/v1/sessions',
      payload: { model: 42, limits: { maxSteps: 0 }, unexpected: true }
    })
    const error = assertEnvelope(t, res, 400, 'VALIDATION_ERROR')
    const fields = error.details.fields.map((f: { field: string }) => f.field)
    t.ok(fields.includes('body.model'), 'names body.model')
    t.ok(fields.includes('body.limits.maxSteps'), 'names body.limits.maxSteps')
    t.ok(fields.includes('body.unexpected'), 'names the unexpected property')
    t.equal(error.retryable, false)
  })

  t.test('a property the route does not know is named, in the body, nested, and in the query string', async (t) => {
    const typo = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { modle: 'x', limits: { maxStep: 3 } } })
    const error = assertEnvelope(t, typo, 400, 'VALIDATION_ERROR')
    t.same(error.details.fields.map((f: { field: string }) => f.field), ['body.modle', 'body.limits.maxStep'])
    t.match(error.message, /body\.modle .*body\.limits\.maxStep/, 'the message names them too')
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions' })).json()
    const query = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?aftr=3`, headers: { accept: 'application/json' } })
    t.same(assertEnvelope(t, query, 400, 'VALIDATION_ERROR').details.fields.map((f: { field: string }) => f.field), ['querystring.aftr'])
  })

  t.test('malformed JSON', async (t) => {
    const res = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json' }, payload: '{"model": ' })
    assertEnvelope(t, res, 400, 'INVALID_JSON')
  })

  t.test('prototype pollution keys in valid JSON are refused as such, naming the key, not as invalid JSON', async (t) => {
    const cases = [
      ['{"metadata": {"__proto__": {"admin": "yes"}}}', 'body.metadata.__proto__'],
      ['{"__proto__": {"x": 1}}', 'body.__proto__'],
      ['{"tools": [{"constructor": {"prototype": {"x": 1}}}]}', 'body.tools[0].constructor.prototype']
    ]
    for (const [payload, field] of cases) {
      const res = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json' }, payload })
      const error = assertEnvelope(t, res, 400, 'VALIDATION_ERROR')
      t.match(error.message, /valid JSON.*prototype pollution/, 'says what is refused and why')
      t.same(error.details.fields.map((f: { field: string }) => f.field), [field])
    }
  })

  t.test('an empty body sent as application/json is no body, as without the Content-Type', async (t) => {
    const json = { 'content-type': 'application/json' }
    const created = await app.inject({ method: 'POST', url: '/v1/sessions', headers: json, payload: '' })
    t.equal(created.statusCode, 201, 'a create with no body takes the defaults')
    const id = created.json().id
    t.equal((await app.inject({ method: 'POST', url: `/v1/sessions/${id}/fork`, headers: json, payload: '' })).statusCode, 201, 'a fork of the whole history')
    assertEnvelope(t, await app.inject({ method: 'POST', url: `/v1/sessions/${id}/interrupt`, headers: json, payload: '' }), 409, 'NO_ACTIVE_RUN')
    const message = assertEnvelope(t, await app.inject({ method: 'POST', url: `/v1/sessions/${id}/messages`, headers: json, payload: '' }), 400, 'VALIDATION_ERROR')
    t.same(message.details.fields.map((f: { field: string }) => f.field), ['body'], 'a body that is required is named as missing')
    t.equal((await app.inject({ method: 'DELETE', url: `/v1/sessions/${id}`, headers: json, payload: '' })).statusCode, 204, 'a delete')
  })

  t.test('a body that is not valid UTF-8 is INVALID_JSON, not kept with its bytes replaced', async (t) => {
    const payload = Buffer.concat([Buffer.from('{"instructions":"caf'), Buffer.from([0xe9]), Buffer.from('"}')])
    const res = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json' }, payload })
    const error = assertEnvelope(t, res, 400, 'INVALID_JSON')
    t.match(error.message, /UTF-8/, 'says why')
  })

  t.test('a string with a lone surrogate escape is a 400 naming it, not text kept as U+FFFD', async (t) => {
    const json = { 'content-type': 'application/json' }
    const lone = await app.inject({ method: 'POST', url: '/v1/sessions', headers: json, payload: '{"instructions":"a\\ud800b"}' })
    const error = assertEnvelope(t, lone, 400, 'VALIDATION_ERROR')
    t.same(error.details.fields.map((f: { field: string }) => f.field), ['body.instructions'])
    const inKey = await app.inject({ method: 'POST', url: '/v1/sessions', headers: json, payload: '{"metadata":{"k\\udc00":"v"}}' })
    t.same(assertEnvelope(t, inKey, 400, 'VALIDATION_ERROR').details.fields.map((f: { field: string }) => f.field), ['body.metadata.k\udc00'])
    const paired = await app.inject({ method: 'POST', url: '/v1/sessions', headers: json, payload: '{"instructions":"a\\ud83d\\ude00b \\\\ud800"}' })
    t.equal(paired.statusCode, 201, 'a surrogate pair, and an escaped backslash before ud800, are text like any other')
    const read = await app.inject({ method: 'GET', url: `/v1/sessions/${paired.json().id}` })
    t.equal(read.json().instructions, 'a\u{1F600}b \\ud800', 'and read back as sent')
  })

  t.test('a body in the charset its Content-Type names is read in that charset', async (t) => {
    const payload = Buffer.concat([Buffer.from('{"instructions":"caf'), Buffer.from([0xe9]), Buffer.from('"}')])
    const res = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json; charset=ISO-8859-1' }, payload })
    t.equal(res.statusCode, 201)
    t.equal(res.json().instructions, 'café', 'the text the client sent')
    const utf16 = await app.inject({
      method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json; charset=utf-16le' }, payload: Buffer.from('{"instructions":"café"}', 'utf16le')
    })
    t.equal(utf16.statusCode, 201)
    t.equal(utf16.json().instructions, 'café')
  })

  t.test('a charset agentd does not know is 415', async (t) => {
    const res = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json; charset=klingon' }, payload: '{}' })
    const error = assertEnvelope(t, res, 415, 'UNSUPPORTED_MEDIA_TYPE')
    t.match(error.message, /charset=klingon/, 'names the charset')
  })

  t.test('a compressed body is 415 naming its Content-Encoding, not read as if it were plain JSON', async (t) => {
    const json = '{"metadata":{"a":"1"}}'
    const gzipped = await app.inject({
      method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' }, payload: gzipSync(json)
    })
    t.match(assertEnvelope(t, gzipped, 415, 'UNSUPPORTED_MEDIA_TYPE').message, /Content-Encoding: gzip/, 'not "not valid UTF-8"')
    // Bytes that happen to parse as JSON must not be taken for the body the client meant.
    const mislabelled = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json', 'content-encoding': 'br' }, payload: json })
    assertEnvelope(t, mislabelled, 415, 'UNSUPPORTED_MEDIA_TYPE')
    const identity = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json', 'content-encoding': 'identity' }, payload: json })
    t.equal(identity.statusCode, 201, 'identity is no coding at all')
  })

  t.test('an unsupported media type', async (t) => {
    const res = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'text/plain' }, payload: 'hello' })
    assertEnvelope(t, res, 415, 'UNSUPPORTED_MEDIA_TYPE')
  })

  t.test('a body over the limit', async (t) => {
    const res = await app.inject({ method: 'POST', url: '/v1/sessions', payload: { instructions: 'x'.repeat(4096) } })
    assertEnvelope(t, res, 413, 'PAYLOAD_TOO_LARGE')
  })

  t.test('an unknown route', async (t) => {
    const error = assertEnvelope(t, await app.inject({ method: 'PATCH', url: '/v1/nothing' }), 404, 'ROUTE_NOT_FOUND')
    t.match(error.message, /PATCH \/v1\/nothing/)
  })

  t.test('an unknown session', async (t) => {
    assertEnvelope(t, await app.inject({ method: 'GET', url: '/v1/sessions/ses_00000000000000000000000000' }), 404, 'SESSION_NOT_FOUND')
  })
})

t.test('a body that fails on every item of a long array gets a bounded answer naming the first fields and how many more', async (t) => {
  const { app } = await buildTestApp(t)
  const payload = `{"tools":[${Array.from({ length: 2000 }, () => '{"type":"x"}').join(',')}]}`
  const res = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json' }, payload })
  const error = assertEnvelope(t, res, 400, 'VALIDATION_ERROR')
  t.ok(res.body.length < 64 * 1024, `an answer of ${res.body.length} bytes for a ${payload.length}-byte body`)
  t.equal(error.details.fields.length, 50, 'the first 50 fields')
  t.equal(error.details.fields[0].field, 'body.tools', 'the first problem first')
  t.ok(error.details.moreFields > 0, 'and how many more')
  t.match(error.message, new RegExp(`and ${error.details.moreFields} more$`))
})

t.test('a body of a megabyte failing on each of its items is answered with its first problem, at once', async (t) => {
  const { app } = await buildTestApp(t)
  const payload = `{"tools":[${Array.from({ length: 500_000 }, () => '1').join(',')}]}`
  const started = Date.now()
  const res = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { 'content-type': 'application/json' }, payload })
  const tookMs = Date.now() - started
  const error = assertEnvelope(t, res, 400, 'VALIDATION_ERROR')
  t.same(error.details.fields.map((f: { field: string }) => f.field), ['body.tools'], 'the first problem: too many items')
  t.notOk('moreFields' in error.details, 'no count of the others: they were not looked for')
  t.ok(tookMs < 3000, `answered in ${tookMs} ms (listing every problem held the event loop for seconds)`)
})

t.test('an unexpected exception is a 500 without internals, logged in full', async (t) => {
  const logLines: string[] = []
  const { app } = await buildTestApp(t, { logLines })
  app.agentd.store.getSession = async () => {
    throw new Error('database exploded at /secret/path.db')
  }
  const res = await app.inject({ method: 'GET', url: '/v1/sessions/ses_00000000000000000000000000', headers: { 'x-request-id': 'boom-1' } })
  const error = assertEnvelope(t, res, 500, 'INTERNAL')
  t.equal(error.message, 'Internal error')
  t.notMatch(res.body, /exploded|secret/)
  const logged = logLines.map((line) => JSON.parse(line)).find((line) => line.msg === 'unhandled error')
  t.ok(logged, 'the error is logged')
  t.equal(logged.reqId, 'boom-1', 'with the request ID')
  t.match(logged.err.stack, /exploded/, 'with its stack')
})

t.test('a value outside an enum is one error that names the allowed values', async (t) => {
  const { app } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'hi', onBusy: 'queue' } })
  t.equal(res.statusCode, 400)
  t.same(res.json().error.details.fields, [{ field: 'body.onBusy', message: 'must be one of: reject, enqueue, interrupt', keyword: 'enum' }])
})
