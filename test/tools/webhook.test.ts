import t from 'tap'
import type { Test } from 'tap'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { createServer as createNetServer, type AddressInfo } from 'node:net'
import { Value } from '@sinclair/typebox/value'
import { Agent } from 'undici'
import { ToolSpecError, checkToolInput, parametersFromJsonSchema, plainJsonSchema } from '../../src/tools/json-schema.ts'
import { runTool } from '../../src/tools/runtime.ts'
import { createWebhookTool } from '../../src/tools/webhook.ts'
import { makeWorkspace } from '../fixtures/tools/context.ts'
import { buildTestApp } from '../helpers/app.ts'
import { selfSignedCertificate, serveHttps } from '../helpers/tls.ts'

const weatherParameters = {
  type: 'object',
  properties: {
    city: { type: 'string', minLength: 1, description: 'City name' },
    days: { type: 'integer', minimum: 1, maximum: 7 },
    units: { enum: ['metric', 'imperial'] },
    when: { type: 'string', format: 'date-time' }
  },
  required: ['city'],
  additionalProperties: false
}

async function webhookServer(t: Test, handler: (body: unknown, req: IncomingMessage, res: ServerResponse) => void) {
  const bodies: unknown[] = []
  const server = createServer(async (req, res) => {
    let text = ''
    for await (const chunk of req) text += chunk
    const body = JSON.parse(text) as unknown
    bodies.push(body)
    handler(body, req, res)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    server.closeAllConnections()
    server.close()
  })
  const port = (server.address() as AddressInfo).port
  return { port, url: `http://127.0.0.1:${port}/hook`, bodies }
}

t.test('a webhook tool POSTs the call and returns the JSON answer', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const hook = await webhookServer(t, (_body, _req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"temp":21}'))
  const tool = createWebhookTool(
    { name: 'weather', description: 'Weather by city', parameters: weatherParameters, url: hook.url },
    { allowedHosts: [`127.0.0.1:${hook.port}`] }
  )
  t.equal(tool.kind, 'webhook')
  t.same(plainJsonSchema(tool.parameters), weatherParameters, 'the client schema is shown exactly as given')

  const outcome = await runTool(tool, { city: 'Oslo', days: 2, when: 'not checked: format is an annotation' }, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 1000 })
  t.same(outcome.ok && outcome.result, { temp: 21 })
  t.same(hook.bodies, [
    { callId: 'call_test', sessionId: 'ses_test', name: 'weather', input: { city: 'Oslo', days: 2, when: 'not checked: format is an annotation' } }
  ])
})

t.test('arguments are checked against the client schema before the webhook is called', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const hook = await webhookServer(t, (_body, _req, res) => res.end('{}'))
  const tool = createWebhookTool({ name: 'weather', description: 'd', parameters: weatherParameters, url: hook.url }, { allowedHosts: ['127.0.0.1'] })
  const outcome = await runTool(tool, { days: 9, units: 'kelvin', extra: 1 }, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 1000 })
  t.match(outcome, { ok: false, error: { errorType: 'validation', code: 'VALIDATION_ERROR' } })
  if (!outcome.ok) {
    const fields = (outcome.error.detail?.['fields'] as { field: string; expected: string }[]).map((f) => `${f.field}: ${f.expected}`)
    t.same(fields, ['city: string length >= 1', 'extra: no such field', 'days: integer >= 1 <= 7', 'units: "metric" or "imperial"'])
  }
  t.equal(hook.bodies.length, 0)
})

t.test('webhook failures: non-2xx, 429, not JSON, timeout, too large', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const hook = await webhookServer(t, (body, _req, res) => {
    const mode = (body as { input: { mode: string } }).input.mode
    if (mode === 'fail') res.writeHead(500).end('boom')
    else if (mode === 'busy') res.writeHead(429).end()
    else if (mode === 'text') res.end('hello')
    else if (mode === 'big') res.end(JSON.stringify('x'.repeat(5000)))
    else if (mode === 'logical') res.end('{"ok":false,"error":"no such city","code":"NOT_FOUND"}')
  })
  const parameters = { type: 'object', properties: { mode: { type: 'string' } }, required: ['mode'] }
  const tool = createWebhookTool({ name: 'hook', description: 'd', parameters, url: hook.url, timeoutMs: 200 }, { allowedHosts: ['127.0.0.1'], maxResponseBytes: 1000 })
  const call = (mode: string) => runTool(tool, { mode }, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 10_000 })

  t.match(await call('fail'), { ok: false, error: { errorType: 'runtime', code: 'IO_ERROR', retryable: true, detail: { status: 500, body: 'boom' } } })
  t.match(await call('busy'), { ok: false, error: { errorType: 'runtime', code: 'RATE_LIMITED' } })
  t.match(await call('text'), { ok: false, error: { errorType: 'runtime', code: 'IO_ERROR', message: /not JSON/ } })
  t.match(await call('big'), { ok: false, error: { code: 'OUTPUT_TOO_LARGE' } })
  t.match(await call('logical'), { ok: false, error: { errorType: 'logical', code: 'NOT_FOUND', message: 'no such city' } }, '{ok:false} from the webhook is logical')
  const started = Date.now()
  t.match(await call('hang'), { ok: false, error: { errorType: 'aborted', code: 'TIMEOUT', detail: { timeoutMs: 200 } } })
  t.ok(Date.now() - started < 1200)
})

t.test('a webhook host must be allowed, checked when the tool is created', async (t) => {
  const spec = { name: 'w', description: 'd', parameters: { type: 'object' }, url: 'https://hooks.example.com/x' }
  t.throws(() => createWebhookTool(spec, { allowedHosts: ['other.example.com'] }), { name: 'ToolSpecError', field: 'url', message: /not allowed/ })
  t.throws(() => createWebhookTool(spec, { allowedHosts: [] }), { message: /allows no webhook hosts/ })
  t.throws(() => createWebhookTool({ ...spec, url: 'ftp://hooks.example.com/' }, { allowedHosts: ['hooks.example.com'] }), { field: 'url', message: /http or https/ })
  t.throws(() => createWebhookTool({ ...spec, url: 'https://u:p@hooks.example.com/' }, { allowedHosts: ['hooks.example.com'] }), { message: /credentials/ })
  t.equal(createWebhookTool(spec, { allowedHosts: ['hooks.example.com'] }).url, 'https://hooks.example.com/x')
})

t.test('JSON Schema parameters: what cannot be checked is refused at creation, naming where', async (t) => {
  const refused: [unknown, string, RegExp][] = [
    [{ type: 'string' }, 'parameters', /must be an object schema/],
    [[], 'parameters', /JSON Schema object/],
    [{ type: 'object', properties: { a: { $ref: '#/defs/a' } } }, 'parameters.properties.a', /"\$ref" is not supported/],
    [{ type: 'object', properties: { a: { type: 'strin' } } }, 'parameters.properties.a.type', /must be one of/],
    // Names Object.prototype has were taken for types (toString as an object schema): every model call refused the tool.
    [{ type: 'object', properties: { a: { type: 'toString' } } }, 'parameters.properties.a.type', /must be one of/],
    [{ type: 'object', properties: { a: { type: ['string', 'constructor'] } } }, 'parameters.properties.a.type[1]', /must be one of/],
    [{ type: 'object', properties: { a: { type: 'string', pattern: '(' } } }, 'parameters.properties.a.pattern', /not a valid regular expression/],
    [{ type: 'object', properties: { a: { type: 'array', items: [{ type: 'string' }] } } }, 'parameters.properties.a.items', /tuple/],
    [{ type: 'object', properties: { a: { enum: [] } } }, 'parameters.properties.a.enum', /non-empty/],
    [{ type: 'object', properties: { a: { const: { x: 1 } } } }, 'parameters.properties.a.const', /constant values/],
    [{ type: 'object', properties: { a: { minLength: 1 } } }, 'parameters.properties.a', /needs a "type"/]
  ]
  for (const [schema, field, message] of refused) {
    const err = (() => {
      try {
        parametersFromJsonSchema(schema)
        return null
      } catch (e) {
        return e
      }
    })()
    t.ok(err instanceof ToolSpecError, `${JSON.stringify(schema)} is refused`)
    t.equal((err as ToolSpecError).field, field)
    t.match((err as ToolSpecError).reason, message)
  }
})

t.test('JSON Schema parameters are checked faithfully, also by plain Value.Check', async (t) => {
  const parameters = parametersFromJsonSchema({
    type: 'object',
    properties: {
      tags: { type: 'array', items: { type: 'string' }, maxItems: 2, uniqueItems: true },
      value: { anyOf: [{ type: 'number' }, { type: 'null' }] },
      mode: { type: ['string', 'boolean'] },
      nested: { type: 'object', properties: { on: { const: true } }, required: ['on'], additionalProperties: { type: 'integer' } }
    },
    required: ['tags']
  })
  const ok = { tags: ['a', 'b'], value: null, mode: true, nested: { on: true, n: 3 }, other: 'extra allowed' }
  t.equal(checkToolInput('t', parameters, ok), null)
  t.equal(Value.Check(parameters, ok), true, 'Value.Check works on the parameters object')
  for (const bad of [
    { tags: ['a', 'a'] },
    { tags: ['a', 'b', 'c'] },
    { tags: [], value: 'x' },
    { tags: [], mode: 1 },
    { tags: [], nested: { on: false } },
    { tags: [], nested: { on: true, n: 'x' } },
    {}
  ]) {
    t.not(checkToolInput('t', parameters, bad), null, `${JSON.stringify(bad)} is refused`)
    t.equal(Value.Check(parameters, bad), false)
  }
})

t.test('arguments are checked by their own fields: __proto__ is a field like any other, toString and constructor are not inherited', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const hook = await webhookServer(t, (_body, _req, res) => res.end('"ok"'))
  // JSON text, as a client and the model send them: a literal __proto__ key would set the prototype.
  const parameters = JSON.parse(`{"type": "object", "additionalProperties": false, "required": ["__proto__", "toString"],
    "properties": {"__proto__": {"type": "string"}, "toString": {}, "constructor": {"type": "string"}}}`)
  const tool = createWebhookTool({ name: 'odd', description: 'd', parameters, url: hook.url }, { allowedHosts: ['127.0.0.1'] })
  const call = (json: string) => runTool(tool, JSON.parse(json), ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 1000 })
  const fieldsOf = (outcome: Awaited<ReturnType<typeof call>>) =>
    outcome.ok ? 'ok' : (outcome.error.detail?.['fields'] as { field: string; message: string }[]).map((f) => `${f.field}: ${f.message}`)

  t.equal(fieldsOf(await call('{"__proto__": "x", "toString": 1}')), 'ok', 'a __proto__ field is accepted, not "unexpected"')
  t.equal(hook.bodies.length, 1)
  t.same(Object.keys((hook.bodies[0] as { input: object }).input), ['__proto__', 'toString'], 'and reaches the webhook')
  t.same(fieldsOf(await call('{"__proto__": 5, "toString": 1}')), ['__proto__: Expected string (got 5)'])
  t.same(fieldsOf(await call('{"__proto__": "x"}')), ['toString: missing, expected a value'], 'a required toString is not found on Object.prototype')
  t.same(fieldsOf(await call('{"toString": 1}')), ['__proto__: missing, expected string'])
  t.equal(hook.bodies.length, 1, 'refused calls never reach the webhook')
})

t.test("a pattern is shown but left to the webhook: a catastrophic one reaches it at once, whatever the argument", async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const hook = await webhookServer(t, (_body, _req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}'))
  const parameters = { type: 'object', properties: { word: { type: 'string', pattern: '^(a+)+$', maxLength: 40 } }, required: ['word'] }
  const tool = createWebhookTool({ name: 'spell', description: 'd', parameters, url: hook.url }, { allowedHosts: ['127.0.0.1'] })
  t.same(plainJsonSchema(tool.parameters), parameters, 'the model is shown the pattern')
  // Run on the main thread, ^(a+)+$ backtracks on this for about a minute.
  const word = 'a'.repeat(30) + '!'
  const started = Date.now()
  const outcome = await runTool(tool, { word }, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 1000 })
  t.ok(Date.now() - started < 5000, `answered in ${Date.now() - started} ms`)
  t.same(outcome.ok && outcome.result, { ok: true })
  t.match(hook.bodies, [{ name: 'spell', input: { word } }])
  t.match(checkToolInput('spell', tool.parameters, { word: 'a'.repeat(41) }), { code: 'VALIDATION_ERROR' }, 'the other keywords are still checked')
})

t.test("a webhook's own advice on its failure is capped like its message: a huge recommendation does not reach the model whole", async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const advice = ['check the city', 'r'.repeat(500_000), 'and this one never fits']
  const hook = await webhookServer(t, (_body, _req, res) => res.end(JSON.stringify({ ok: false, error: 'no such city', recommendations: advice })))
  const tool = createWebhookTool({ name: 'weather', description: 'd', parameters: { type: 'object' }, url: hook.url }, { allowedHosts: ['127.0.0.1'] })
  const outcome = await runTool(tool, {}, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 1000 })
  t.match(outcome, { ok: false, error: { errorType: 'logical', message: 'no such city' } })
  const given = outcome.ok ? [] : outcome.error.recommendations
  t.equal(given.length, 2)
  t.equal(given[0], 'check the city', 'what fits is kept as it is')
  t.match(given[1], /^r+\n\[output truncated: showing the first \d+ of 500000 bytes\]$/)
  t.ok(Buffer.byteLength(given.join('')) < 1200, `${Buffer.byteLength(given.join(''))} bytes of advice`)
})

t.test('a failing webhook tells the model what to do: its Retry-After, whether a retry can help, its own advice', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const hook = await webhookServer(t, (body, _req, res) => {
    const mode = (body as { input: { mode: string } }).input.mode
    if (mode === 'busy') res.writeHead(429, { 'retry-after': '7' }).end()
    else if (mode === 'down') res.writeHead(503, { 'retry-after': '2' }).end('<html>down</html>')
    else if (mode === 'moved') res.writeHead(302, { location: 'http://169.254.169.254/' }).end()
    else if (mode === 'refused') res.writeHead(422).end('{"error":"bad city"}')
    else if (mode === 'html') res.writeHead(200, { 'content-type': 'text/html' }).end('<html>hi</html>')
    else res.socket?.destroy()
  })
  const parameters = { type: 'object', properties: { mode: { type: 'string' } }, required: ['mode'] }
  const tool = createWebhookTool({ name: 'forecast', description: 'd', parameters, url: hook.url }, { allowedHosts: ['127.0.0.1'] })
  const call = async (mode: string) => {
    const outcome = await runTool(tool, { mode }, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 10_000 })
    return outcome.ok ? null : outcome.error
  }

  t.match(await call('busy'), { code: 'RATE_LIMITED', retryable: true, detail: { retryAfterMs: 7000 }, recommendations: [/^forecast is rate limited; wait 7 s/] })
  t.match(await call('down'), { code: 'IO_ERROR', retryable: true, detail: { status: 503, retryAfterMs: 2000 }, recommendations: [/HTTP 503\); wait 2 s/] })
  t.match(await call('moved'), { code: 'IO_ERROR', retryable: false, detail: { status: 302 }, recommendations: [/do not follow.*do not retry/] })
  t.match(await call('refused'), { code: 'IO_ERROR', retryable: false, detail: { status: 422 }, recommendations: [/refused this call \(HTTP 422\); do not repeat it/] })
  t.match(await call('html'), { code: 'IO_ERROR', retryable: false, detail: { reason: 'not_json' }, recommendations: [/other than JSON.*do not retry/] })
  t.match(await call('reset'), { code: 'IO_ERROR', retryable: true, detail: { reason: 'unreachable' }, recommendations: [/could not be reached; retry once/] })
})

t.test('a webhook answer nested thousands of levels deep is its server\'s fault, not an unknown failure of the tool', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const hook = await webhookServer(t, (_body, _req, res) => res.end('['.repeat(5000) + ']'.repeat(5000)))
  const tool = createWebhookTool({ name: 'nested', description: 'd', parameters: { type: 'object' }, url: hook.url }, { allowedHosts: ['127.0.0.1'] })
  const outcome = await runTool(tool, {}, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 100_000 })
  t.match(outcome, {
    ok: false,
    error: { errorType: 'runtime', code: 'IO_ERROR', retryable: false, detail: { reason: 'too_deep', maxDepth: 128 }, recommendations: [/nested deeper than 128 levels.*do not retry/] }
  })
})

t.test('a webhook server that answers broken HTTP is not "unreachable": its fault, not retryable', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const answers = ['not http at all\r\n\r\n', `HTTP/1.1 200 OK\r\nX-Big: ${'a'.repeat(100_000)}\r\n\r\n{}`]
  const server = createNetServer((socket) => {
    socket.on('error', () => {})
    socket.once('data', () => socket.end(answers.shift() ?? ''))
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => server.close())
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`
  const tool = createWebhookTool({ name: 'legacy', description: 'd', parameters: { type: 'object' }, url }, { allowedHosts: ['127.0.0.1'] })
  for (const what of ['a bad status line', 'headers too large']) {
    const outcome = await runTool(tool, {}, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 10_000 })
    t.match(outcome, {
      ok: false,
      error: { code: 'IO_ERROR', retryable: false, message: /answered with a broken HTTP response/, detail: { reason: 'bad_answer' }, recommendations: [/do not retry/] }
    }, what)
  }
})

t.test('a webhook whose certificate is not trusted is a TLS failure the model must not retry, not "unreachable"', async (t) => {
  const server = await serveHttps(t, selfSignedCertificate(t))
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_WEBHOOK_HOSTS: `127.0.0.1:${server.port}` } })
  const tools = [{ type: 'webhook', name: 'ledger', description: 'd', parameters: { type: 'object' }, url: `${server.origin}/hook` }]
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools } })).json()
  devModel.script({ toolCalls: [{ name: 'ledger', arguments: {} }] }, { text: 'noted' })
  const { run } = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'book it' } })).json()
  t.equal(run.status, 'completed', 'the run goes on')
  const sent = devModel.requests.at(-1)?.body.messages.find((m) => m.role === 'tool')
  t.match(JSON.parse(String(sent?.content)), {
    ok: false,
    errorType: 'runtime',
    code: 'IO_ERROR',
    retryable: false,
    error: /failed the TLS handshake \(DEPTH_ZERO_SELF_SIGNED_CERT\)/,
    detail: { reason: 'tls_error', errno: 'DEPTH_ZERO_SELF_SIGNED_CERT' },
    recommendations: [/ledger's server presented a certificate that is not trusted.*do not retry.*operator must fix the webhook's certificate/]
  }, 'the model is told not to retry, and why')
  t.equal(server.hits(), 0, 'no request was sent over the untrusted connection')
})

t.test('a trusted certificate for another host name is a TLS failure too; for its own name the same server answers', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const certificate = selfSignedCertificate(t)
  const server = await serveHttps(t, certificate)
  const dispatcher = new Agent({ connect: { ca: certificate.cert } })
  t.teardown(() => dispatcher.close())
  const call = (host: string) => {
    const tool = createWebhookTool({ name: 'ledger', description: 'd', parameters: { type: 'object' }, url: `https://${host}:${server.port}/hook` },
      { allowedHosts: [host], dispatcher })
    return runTool(tool, {}, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 10_000 })
  }
  t.match(await call('127.0.0.1'), {
    ok: false,
    error: { code: 'IO_ERROR', retryable: false, message: /ERR_TLS_CERT_ALTNAME_INVALID/, detail: { reason: 'tls_error', errno: 'ERR_TLS_CERT_ALTNAME_INVALID' } }
  })
  t.match(await call('localhost'), { ok: true, result: {} }, 'the certificate is for localhost')
})

t.test('a webhook answer that opens with a UTF-8 byte order mark is its JSON, not "not JSON"', async (t) => {
  // Before, the mark (which .NET's UTF-8 writers put first by default) stayed in the text and
  // JSON.parse refused it: the call failed as the server's fault, not to be retried.
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const hook = await webhookServer(t, (_body, _req, res) => res.writeHead(200, { 'content-type': 'application/json; charset=utf-8' }).end('\uFEFF{"temp":21}'))
  const tool = createWebhookTool({ name: 'weather', description: 'd', parameters: weatherParameters, url: hook.url }, { allowedHosts: ['127.0.0.1'] })
  const outcome = await runTool(tool, { city: 'Oslo' }, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 1000 })
  t.same(outcome.ok && outcome.result, { temp: 21 })
})

t.test('a webhook whose answer is cut off after its status is not "unreachable": it was reached and may have done its work', async (t) => {
  // Before, the cut body was reported as "could not be reached" with advice to retry once: for a
  // webhook that orders, books or sends, that retry repeats what it already did.
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const hook = await webhookServer(t, (_body, _req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.write('{"order":"A-1","sta')
    setImmediate(() => res.destroy())
  })
  const tool = createWebhookTool({ name: 'order', description: 'd', parameters: weatherParameters, url: hook.url }, { allowedHosts: ['127.0.0.1'] })
  const outcome = await runTool(tool, { city: 'Oslo' }, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 1000 })
  t.match(outcome, { ok: false, error: { errorType: 'runtime', code: 'IO_ERROR', message: /answered HTTP 200, but its answer was cut off/, detail: { status: 200, reason: 'answer_cut' } } })
  if (!outcome.ok) t.match(outcome.error.recommendations.join(' '), /may have done its work/)
})
