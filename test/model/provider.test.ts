import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { ChatCompletionMessageParam, ChatCompletionTool } from 'openai/resources/chat/completions'
import { createOpenAIProvider } from '../../src/model/provider.ts'
import { ModelError, type ModelProvider, type ModelRequest, type ModelStreamPart } from '../../src/model/types.ts'
import { startTestDevModel } from '../helpers/dev-model.ts'
import { selfSignedCertificate, serveHttps } from '../helpers/tls.ts'

const hello: ModelRequest = { model: 'dev-model', messages: [{ role: 'user', content: 'hello there' }] }
const noSignal = () => new AbortController().signal

async function collect(provider: ModelProvider, request: ModelRequest = hello, signal = noSignal(), requestId = 'req-test') {
  const parts: ModelStreamPart[] = []
  for await (const part of provider.stream(request, { signal, requestId })) parts.push(part)
  return parts
}

/** Runs the call to its failure; returns the ModelError and the parts that came before it. */
async function failure(provider: ModelProvider, request: ModelRequest = hello, signal = noSignal()) {
  const parts: ModelStreamPart[] = []
  try {
    for await (const part of provider.stream(request, { signal, requestId: 'req-test' })) parts.push(part)
  } catch (err) {
    if (err instanceof ModelError) return { error: err, parts }
    throw err
  }
  throw new Error(`expected the model call to fail, got ${JSON.stringify(parts)}`)
}

const deltas = (parts: ModelStreamPart[], type: 'text' | 'reasoning') =>
  parts.flatMap((p) => (p.type === type ? [p.delta] : []))

const tools: ChatCompletionTool[] = [
  { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }
]

t.test('a text answer arrives as text deltas, then one finish part with mapped usage', async (t) => {
  const { devModel, provider } = await startTestDevModel(t)
  devModel.script({ text: 'one two three four', chunks: 4 })
  const parts = await collect(provider)
  t.same(deltas(parts, 'text'), ['one t', 'wo th', 'ree f', 'our'])
  const finish = parts.at(-1)
  t.equal(parts.filter((p) => p.type === 'finish').length, 1)
  if (finish?.type !== 'finish') throw new Error('last part is not finish')
  t.equal(finish.finishReason, 'stop')
  t.ok(finish.usage && finish.usage.inputTokens > 0 && finish.usage.outputTokens > 0)
  t.equal(finish.usage?.totalTokens, (finish.usage?.inputTokens ?? 0) + (finish.usage?.outputTokens ?? 0))
})

t.test('the request carries the model, messages, tools, stream_options and the X-Request-Id', async (t) => {
  const { devModel, provider } = await startTestDevModel(t)
  await collect(provider, { ...hello, tools, maxTokens: 64 }, noSignal(), 'req-abc.123')
  const [logged] = devModel.requests
  t.equal(logged?.headers['x-request-id'], 'req-abc.123')
  t.equal(logged?.headers['content-type'], 'application/json')
  t.match(logged?.headers['user-agent'], /^OpenAI\/JS /, 'the SDK still sends it, with its own headers')
  t.same(logged?.body, {
    model: 'dev-model',
    messages: [{ role: 'user', content: 'hello there' }],
    stream: true,
    stream_options: { include_usage: true },
    tools,
    max_tokens: 64
  })
})

t.test('tool definitions go out as they are, whichever list offers them and however often', async (t) => {
  const { devModel, provider } = await startTestDevModel(t)
  const odd: ChatCompletionTool = {
    type: 'function',
    function: { name: 'quote', description: 'Says "hi" \u2028 and \\n, in Zürich 🚀', parameters: { type: 'object', properties: { q: { type: 'string', enum: ['a', 'b'] } } } }
  }
  const [weather, time] = tools as [ChatCompletionTool, ChatCompletionTool]
  // The same definitions in other lists (another run, another session), and a list without tools.
  const lists: ChatCompletionTool[][] = [[weather, odd], [odd, time, weather], [weather, odd], []]
  for (const list of lists) await collect(provider, { ...hello, tools: list })
  t.same(devModel.requests.map((r) => r.body.tools), [[weather, odd], [odd, time, weather], [weather, odd], undefined])
  t.same(devModel.requests.map((r) => r.body.max_tokens), [undefined, undefined, undefined, undefined])
})

t.test('several tool calls in one response come out whole, in order, and their results reach the model', async (t) => {
  const { devModel, provider } = await startTestDevModel(t)
  devModel.script({
    text: 'Let me look.',
    toolCalls: [
      { id: 'call_w', name: 'get_weather', arguments: { city: 'Zürich', note: 'a longer argument so it is split into fragments' } },
      { id: 'call_t', name: 'get_time', arguments: '{}' }
    ]
  })
  const request: ModelRequest = { ...hello, tools }
  const parts = await collect(provider, request)
  t.same(deltas(parts, 'text').join(''), 'Let me look.')
  const calls = parts.filter((p) => p.type === 'tool_call')
  t.same(calls, [
    { type: 'tool_call', id: 'call_w', name: 'get_weather', arguments: JSON.stringify({ city: 'Zürich', note: 'a longer argument so it is split into fragments' }) },
    { type: 'tool_call', id: 'call_t', name: 'get_time', arguments: '{}' }
  ])
  t.match(parts.at(-1), { type: 'finish', finishReason: 'tool_calls' })

  const followUp: ChatCompletionMessageParam[] = [
    ...request.messages,
    {
      role: 'assistant',
      content: 'Let me look.',
      tool_calls: calls.map((c) => ({ id: c.type === 'tool_call' ? c.id : '', type: 'function' as const, function: { name: c.type === 'tool_call' ? c.name : '', arguments: c.type === 'tool_call' ? c.arguments : '' } }))
    },
    { role: 'tool', tool_call_id: 'call_w', content: '{"ok":true,"celsius":21}' },
    { role: 'tool', tool_call_id: 'call_t', content: '{"ok":true,"time":"10:00"}' }
  ]
  const answer = await collect(provider, { ...request, messages: followUp })
  t.match(devModel.requests[1]?.body.messages.slice(-2), [
    { role: 'tool', tool_call_id: 'call_w', content: '{"ok":true,"celsius":21}' },
    { role: 'tool', tool_call_id: 'call_t', content: '{"ok":true,"time":"10:00"}' }
  ])
  t.equal(
    deltas(answer, 'text').join(''),
    'Tool get_weather returned: {"ok":true,"celsius":21}\nTool get_time returned: {"ok":true,"time":"10:00"}'
  )
})

t.test('reasoning_content deltas come out as reasoning parts before the text', async (t) => {
  const { devModel, provider } = await startTestDevModel(t)
  devModel.script({ reasoning: 'The user greets me.', text: 'Hi!' })
  const parts = await collect(provider)
  t.equal(deltas(parts, 'reasoning').join(''), 'The user greets me.')
  t.equal(deltas(parts, 'text').join(''), 'Hi!')
  const firstText = parts.findIndex((p) => p.type === 'text')
  t.ok(parts.slice(0, firstText).every((p) => p.type === 'reasoning'), 'all reasoning comes first')
})

t.test('every scripted error status maps to its model code', async (t) => {
  const { devModel, provider } = await startTestDevModel(t)
  const cases: Array<{
    step: { status: number; body?: object; headers?: Record<string, string> }
    code: string
    errorType: string
    retryable: boolean
    retryAfterMs: number | null
  }> = [
    { step: { status: 401 }, code: 'AUTHENTICATION_ERROR', errorType: 'runtime', retryable: false, retryAfterMs: null },
    { step: { status: 403 }, code: 'PERMISSION_DENIED', errorType: 'runtime', retryable: false, retryAfterMs: null },
    { step: { status: 404 }, code: 'MODEL_NOT_FOUND', errorType: 'runtime', retryable: false, retryAfterMs: null },
    {
      step: { status: 400, body: { error: { message: 'too long', type: 'invalid_request_error', code: 'context_length_exceeded' } } },
      code: 'CONTEXT_LENGTH_EXCEEDED',
      errorType: 'runtime',
      retryable: false,
      retryAfterMs: null
    },
    { step: { status: 429, headers: { 'retry-after': '1' } }, code: 'RATE_LIMITED', errorType: 'runtime', retryable: true, retryAfterMs: 1000 },
    { step: { status: 429, headers: { 'retry-after-ms': '50' } }, code: 'RATE_LIMITED', errorType: 'runtime', retryable: true, retryAfterMs: 50 },
    { step: { status: 500 }, code: 'SERVER_ERROR', errorType: 'runtime', retryable: true, retryAfterMs: null },
    { step: { status: 503, headers: { 'retry-after': '2' } }, code: 'SERVER_ERROR', errorType: 'runtime', retryable: true, retryAfterMs: 2000 }
  ]
  for (const c of cases) {
    devModel.script(c.step)
    const { error } = await failure(provider)
    t.match(
      { ...error.classified, status: error.status, retryAfterMs: error.retryAfterMs },
      { code: c.code, errorType: c.errorType, retryable: c.retryable, fatal: !c.retryable, status: c.step.status, retryAfterMs: c.retryAfterMs },
      `${c.step.status} ${JSON.stringify(c.step.headers ?? c.step.body ?? {})} -> ${c.code}`
    )
    t.ok(error.classified.recommendations.length > 0)
    t.ok(error.cause, 'the SDK error is kept as cause')
  }
  t.equal(devModel.requests.length, cases.length, 'the SDK made no retries of its own')
})

t.test('a model that never sends headers is cut by the headers timeout as TIMEOUT', async (t) => {
  const { devModel, provider } = await startTestDevModel(t, { headersTimeoutMs: 150 })
  devModel.script({ hang: true })
  const started = Date.now()
  const { error } = await failure(provider)
  t.match(error.classified, { code: 'TIMEOUT', errorType: 'aborted', retryable: true })
  t.ok(Date.now() - started < 1500, 'fails soon after the timeout')
})

t.test('a stream that stalls after its first chunk is cut by the body timeout as TIMEOUT', async (t) => {
  const { devModel, provider } = await startTestDevModel(t, { bodyTimeoutMs: 150 })
  devModel.script({ hang: true, afterChunks: 1 })
  const { error, parts } = await failure(provider)
  t.equal(parts.length, 1, 'the chunk before the stall was delivered')
  t.match(error.classified, { code: 'TIMEOUT', errorType: 'aborted', retryable: true })
})

// A cut stream is NETWORK_ERROR (retryable): the transport failed, not the format.
// INVALID_RESPONSE is kept for streams that arrive whole but are not valid Chat Completions.
t.test('a stream cut before its first token is a retryable NETWORK_ERROR', async (t) => {
  const { devModel, provider } = await startTestDevModel(t)
  devModel.script({ cutAfterChunks: 0 })
  const { error, parts } = await failure(provider)
  t.same(parts, [])
  t.match(error.classified, { code: 'NETWORK_ERROR', errorType: 'runtime', retryable: true })
})

t.test('a stream cut half way delivers its first chunks, then fails with NETWORK_ERROR', async (t) => {
  const { devModel, provider } = await startTestDevModel(t)
  devModel.script({ cutAfterChunks: 2, text: 'alpha beta gamma delta' })
  const { error, parts } = await failure(provider)
  t.same(deltas(parts, 'text'), ['alpha ', 'beta '])
  t.equal(error.classified.code, 'NETWORK_ERROR')
})

t.test('aborting the signal ends the call as aborted, before and during the stream', async (t) => {
  const { devModel, provider } = await startTestDevModel(t)

  const beforeHeaders = new AbortController()
  devModel.script({ hang: true })
  setTimeout(() => beforeHeaders.abort(), 50)
  const first = await failure(provider, hello, beforeHeaders.signal)
  t.match(first.error.classified, { errorType: 'aborted', code: 'UNKNOWN', retryable: false, fatal: true })

  const midStream = new AbortController()
  devModel.script({ hang: true, afterChunks: 1 })
  const parts: ModelStreamPart[] = []
  const second = await (async () => {
    try {
      for await (const part of provider.stream(hello, { signal: midStream.signal, requestId: 'req-test' })) {
        parts.push(part)
        midStream.abort()
      }
    } catch (err) {
      return err
    }
    return null
  })()
  t.equal(parts.length, 1)
  t.ok(second instanceof ModelError)
  t.match((second as ModelError).classified, { errorType: 'aborted', retryable: false })

  const already = new AbortController()
  already.abort()
  const third = await failure(provider, hello, already.signal)
  t.equal(third.error.classified.errorType, 'aborted')
})

t.test('a signal that fires as a timeout is reported as TIMEOUT, not as an interrupt', async (t) => {
  const { devModel, provider } = await startTestDevModel(t)
  devModel.script({ hang: true })
  const { error } = await failure(provider, hello, AbortSignal.timeout(50))
  t.match(error.classified, { code: 'TIMEOUT', errorType: 'aborted', retryable: true })
})

t.test('a refused connection is a retryable NETWORK_ERROR', async (t) => {
  const closed = createServer()
  await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve))
  const { port } = closed.address() as AddressInfo
  await new Promise((resolve) => closed.close(resolve))
  const provider = createOpenAIProvider({ apiKey: 'k', baseURL: `http://127.0.0.1:${port}/v1`, connectTimeoutMs: 500 })
  t.teardown(() => provider.close())
  const { error } = await failure(provider)
  t.match(error.classified, { code: 'NETWORK_ERROR', errorType: 'runtime', retryable: true })
})

t.test('a model server whose certificate is not trusted fails the call at once: NETWORK_ERROR, not retryable', async (t) => {
  const server = await serveHttps(t, selfSignedCertificate(t))
  const provider = createOpenAIProvider({ apiKey: 'k', baseURL: `https://localhost:${server.port}/v1`, connectTimeoutMs: 2000 })
  t.teardown(() => provider.close())
  const { error } = await failure(provider)
  t.match(error.classified, {
    code: 'NETWORK_ERROR', errorType: 'runtime', retryable: false, fatal: true,
    message: /TLS handshake with the model provider failed \(DEPTH_ZERO_SELF_SIGNED_CERT\)/,
    detail: { transportCode: 'DEPTH_ZERO_SELF_SIGNED_CERT', reason: 'tls_error' },
    recommendations: [/OPENAI_BASE_URL/, /NODE_EXTRA_CA_CERTS/, /Retrying cannot help/]
  })
  t.equal(server.hits(), 0, 'no request reached the server')
})

t.test('a model server that refuses the handshake (no cipher in common) fails the call at once, not after retries', async (t) => {
  // TLS 1.2 only, with a cipher no client offers by default: the server answers the hello with a handshake_failure alert.
  const server = await serveHttps(t, selfSignedCertificate(t), { maxVersion: 'TLSv1.2', ciphers: 'ECDHE-ECDSA-AES128-CCM8' })
  const provider = createOpenAIProvider({ apiKey: 'k', baseURL: `https://localhost:${server.port}/v1`, connectTimeoutMs: 2000 })
  t.teardown(() => provider.close())
  const { error } = await failure(provider)
  t.match(error.classified, {
    code: 'NETWORK_ERROR', retryable: false,
    message: /TLS handshake with the model provider failed \(ERR_SSL_SSL\/TLS_ALERT_HANDSHAKE_FAILURE\)/,
    detail: { transportCode: 'ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE', reason: 'tls_error' }
  })
  t.equal(server.hits(), 0, 'no request reached the server')
})

t.test('an https base URL on a port that speaks plain HTTP fails the call at once, not after retries', async (t) => {
  const { devModel } = await startTestDevModel(t)
  const provider = createOpenAIProvider({ apiKey: 'k', baseURL: devModel.url.replace(/^http:/, 'https:'), connectTimeoutMs: 2000 })
  t.teardown(() => provider.close())
  const { error } = await failure(provider)
  t.match(error.classified, { code: 'NETWORK_ERROR', retryable: false, detail: { transportCode: 'ERR_SSL_WRONG_VERSION_NUMBER', reason: 'tls_error' } })
})

t.test('a provider with neither key nor base URL fails every call with PROVIDER_NOT_CONFIGURED', async (t) => {
  const provider = createOpenAIProvider({})
  t.teardown(() => provider.close())
  t.equal(provider.kind, 'openai')
  const { error } = await failure(provider)
  t.match(error.classified, { code: 'PROVIDER_NOT_CONFIGURED', retryable: false, fatal: true })
})

t.test('a server that answers with something other than Chat Completions chunks is INVALID_RESPONSE', async (t) => {
  const bodies = [
    'data: {not json\n\n',
    // Valid chunks whose delta is not a delta.
    'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n' +
      'data: {"id":"x","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":["no"]},"finish_reason":null}]}\n\n'
  ]
  const server = createServer((req, res) => {
    req.resume()
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.end(bodies.shift())
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const provider = createOpenAIProvider({ apiKey: 'k', baseURL: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1` })
  t.teardown(async () => {
    server.closeAllConnections()
    await new Promise((resolve) => server.close(resolve))
    await provider.close()
  })
  const malformed = await failure(provider)
  t.match(malformed.error.classified, { code: 'INVALID_RESPONSE', retryable: false })
  const unfinished = await failure(provider)
  // A list of content chunks is read (Mistral's reasoning models send one); a list of anything else names its element.
  t.match(unfinished.error.classified, { code: 'INVALID_RESPONSE', message: /delta\.content\[0\] is string no, not a text or thinking chunk/ })
  t.same(deltas(unfinished.parts, 'text'), ['hi'])
})

t.test('the provider for the dev model says so in its kind', async (t) => {
  const { provider } = await startTestDevModel(t)
  t.equal(provider.kind, 'dev')
})
