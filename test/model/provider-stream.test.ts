import t from 'tap'
import { once } from 'node:events'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as delay } from 'node:timers/promises'
import { createOpenAIProvider, type OpenAIProviderOptions } from '../../src/model/provider.ts'
import { ModelError, type ModelCallOptions, type ModelProvider, type ModelStreamPart } from '../../src/model/types.ts'

// How the provider reads the bytes of a stream, against a node:http server that writes them in
// pieces of its choosing: each piece is its own write, a few ms apart, so that it arrives as its own read.

interface Received {
  url: string
  headers: IncomingMessage['headers']
  body: { messages?: unknown[] }
}

type Answer = (res: ServerResponse, request: Received) => Promise<void> | void

interface Teardown {
  teardown(fn: () => unknown): void
}

/** A model server answering every request with `answer`, and a provider pointed at it; both close when the test ends. */
async function startModel(t: Teardown, answer: Answer, providerOptions: OpenAIProviderOptions = {}) {
  const requests: Received[] = []
  let connections = 0
  const server = createServer((req, res) => {
    void (async () => {
      const parts: Buffer[] = []
      for await (const part of req) parts.push(part as Buffer)
      const received = { url: req.url ?? '', headers: req.headers, body: JSON.parse(Buffer.concat(parts).toString('utf8')) as Received['body'] }
      requests.push(received)
      await answer(res, received)
    })().catch(() => res.destroy())
  })
  server.on('connection', () => connections++)
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const provider = createOpenAIProvider({
    apiKey: 'test-key',
    baseURL: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    headersTimeoutMs: 2000,
    bodyTimeoutMs: 2000,
    ...providerOptions
  })
  t.teardown(async () => {
    server.closeAllConnections()
    server.close()
    await provider.close()
  })
  return { provider, requests, connections: () => connections }
}

/** Starts an event stream and writes `pieces` one by one, apart in time; ends it unless told not to. */
async function writeApart(res: ServerResponse, pieces: Array<string | Buffer>, end = true): Promise<void> {
  if (!res.headersSent) res.writeHead(200, { 'content-type': 'text/event-stream' })
  for (const piece of pieces) {
    res.write(piece)
    await delay(15)
  }
  if (end) res.end()
}

const chunk = (delta: object, finishReason: string | null = null, extra: object = {}) =>
  JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 0, model: 'm', choices: [{ index: 0, delta, finish_reason: finishReason }], ...extra })
const stop = chunk({}, 'stop')

const request = { model: 'm', messages: [{ role: 'user' as const, content: 'hi' }] }
const call = (): ModelCallOptions => ({ signal: new AbortController().signal, requestId: 'req-stream' })

async function collect(provider: ModelProvider, options = call()) {
  const parts: ModelStreamPart[] = []
  for await (const part of provider.stream(request, options)) parts.push(part)
  return parts
}

async function failure(provider: ModelProvider) {
  const parts: ModelStreamPart[] = []
  try {
    for await (const part of provider.stream(request, call())) parts.push(part)
  } catch (err) {
    if (err instanceof ModelError) return { error: err, parts }
    throw err
  }
  throw new Error(`expected the call to fail, got ${JSON.stringify(parts)}`)
}

const text = (parts: ModelStreamPart[]) => parts.flatMap((p) => (p.type === 'text' ? [p.delta] : [])).join('')

t.test('a character split between two reads arrives whole', async (t) => {
  const frame = Buffer.from(`data: ${chunk({ content: 'Zürich 🌍 ok' })}\n\n`)
  const inEmoji = frame.indexOf(Buffer.from('🌍')) + 2
  const { provider } = await startModel(t, (res) => writeApart(res, [frame.subarray(0, inEmoji), frame.subarray(inEmoji), `data: ${stop}\n\ndata: [DONE]\n\n`]))
  const parts = await collect(provider)
  t.equal(text(parts), 'Zürich 🌍 ok')
  t.match(parts.at(-1), { type: 'finish', finishReason: 'stop' })
})

t.test('\\r\\n and \\r line ends, a \\r\\n split between reads, and keep-alive comments are read like \\n', async (t) => {
  const bodies = [
    [': keep-alive\r\n\r\n', `data: ${chunk({ content: 'one ' })}\r`, '\n\r\n', `: ping\r\ndata: ${chunk({ content: 'two' })}\r\n\r\n`, `data: ${stop}\r\n\r\ndata: [DONE]\r\n\r\n`],
    [`:\rdata: ${chunk({ content: 'one ' })}\r\r`, `data: ${chunk({ content: 'two' })}\r\rdata: ${stop}\r\r`, 'data: [DONE]\r\r']
  ]
  const { provider } = await startModel(t, (res) => writeApart(res, bodies.shift() ?? []))
  for (const ending of ['\\r\\n', '\\r']) {
    const parts = await collect(provider)
    t.equal(text(parts), 'one two', `${ending} line ends`)
    t.match(parts.at(-1), { type: 'finish', finishReason: 'stop' })
  }
})

t.test('an event whose JSON spans several data lines is one chunk', async (t) => {
  const json = chunk({ content: 'joined' })
  const middle = json.indexOf('"choices"')
  const { provider } = await startModel(t, (res) =>
    writeApart(res, [`data: ${json.slice(0, middle)}\ndata: ${json.slice(middle)}\n\n`, `data: ${stop}\n\ndata: [DONE]\n\n`]))
  t.equal(text(await collect(provider)), 'joined')
})

t.test('an error sent inside the stream fails the call classified by its type, after the parts before it', async (t) => {
  const errors = [
    `event: error\ndata: {"error":{"message":"The server is overloaded.","type":"server_error"}}\n\n`,
    `data: {"error":{"message":"Rate limit reached.","type":"rate_limit_exceeded"}}\n\n`,
    // Some servers send the error object itself as the data of an `error` event.
    `event: error\ndata: {"message":"Something else.","type":"invalid_request_error"}\n\n`
  ]
  const { provider } = await startModel(t, (res) => writeApart(res, [`data: ${chunk({ content: 'partial' })}\n\n`, errors.shift() ?? '']))
  const overloaded = await failure(provider)
  t.equal(text(overloaded.parts), 'partial')
  t.match(overloaded.error.classified, {
    code: 'SERVER_ERROR', retryable: true, message: 'The model stream reported an error: The server is overloaded.', detail: { status: null, providerType: 'server_error' }
  })
  t.equal(overloaded.error.status, null)
  const limited = await failure(provider)
  t.match(limited.error.classified, { code: 'RATE_LIMITED', retryable: true })
  const other = await failure(provider)
  t.match(other.error.classified, { code: 'UNKNOWN', errorType: 'runtime', message: /Something else\./ })
})

t.test('a chunk that is not JSON, or JSON but not an object, is INVALID_RESPONSE; a chunk without choices is skipped', async (t) => {
  const bodies = [
    [`data: ${chunk({ content: 'a' })}\n\n`, 'data: {"choices": [\n\n'],
    [`data: ${chunk({ content: 'a' })}\n\n`, 'data: 42\n\n'],
    ['data: {"type":"ping"}\n\n', `data: ${chunk({ content: 'fine' })}\n\ndata: ${stop}\n\ndata: [DONE]\n\n`]
  ]
  const { provider } = await startModel(t, (res) => writeApart(res, bodies.shift() ?? []))
  const notJson = await failure(provider)
  t.equal(text(notJson.parts), 'a')
  t.match(notJson.error.classified, { code: 'INVALID_RESPONSE', retryable: false, message: /not JSON/ })
  t.match((await failure(provider)).error.classified, { code: 'INVALID_RESPONSE', message: /not a chunk object/ })
  t.equal(text(await collect(provider)), 'fine')
})

t.test('a field of the wrong type is INVALID_RESPONSE naming it; a chunk without a delta is read as empty', async (t) => {
  // Before, text that was an object was streamed as a text_chunk whose delta was that object, and
  // tool calls that were not a list, or a null delta, failed the run as UNKNOWN "failed unexpectedly".
  const bodies: Array<[object, RegExp]> = [
    [{ content: { text: 'hi' } }, /delta\.content is an object, not a string/],
    [{ content: 42 }, /delta\.content is number 42, not a string/],
    [{ reasoning_content: ['a'] }, /delta\.reasoning_content is a list, not a string/],
    [{ tool_calls: { index: 0 } }, /delta\.tool_calls is an object, not a list/],
    [{ tool_calls: [null] }, /delta\.tool_calls\[0\] is null, not an object/],
    [{ tool_calls: [{ index: 0, id: 7, function: { name: 'f' } }] }, /delta\.tool_calls\[0\]\.id is number 7, not a string/],
    [{ tool_calls: [{ index: 'first', function: { name: 'f' } }] }, /delta\.tool_calls\[0\]\.index is string first, not a whole number/],
    [{ tool_calls: [{ index: 0, function: { name: 'f', arguments: { path: '.' } } }] }, /function\.arguments is an object, not a string/]
  ]
  const answers = bodies.map(([delta]) => [`data: ${chunk(delta)}\n\n`, `data: ${stop}\n\ndata: [DONE]\n\n`])
  answers.push([`data: ${chunk({ content: 'kept' })}\n\n`, 'data: {"choices":[{"index":0,"delta":null,"finish_reason":null}]}\n\n',
    'data: {"choices":[{"index":0,"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'])
  const { provider } = await startModel(t, (res) => writeApart(res, answers.shift() ?? []))
  for (const [delta, message] of bodies) {
    t.match((await failure(provider)).error.classified, { code: 'INVALID_RESPONSE', message }, JSON.stringify(delta))
  }
  const parts = await collect(provider)
  t.equal(text(parts), 'kept')
  t.match(parts.at(-1), { type: 'finish', finishReason: 'stop' }, 'a null or missing delta is no part, and the finish_reason beside it counts')
})

t.test('tool-call fragments without an index: a new ID starts the next call, a fragment without one continues the last', async (t) => {
  const { provider } = await startModel(t, (res) => writeApart(res, [
    `data: ${chunk({ tool_calls: [{ id: 'call_a', type: 'function', function: { name: 'fs_list', arguments: '{"pa' } }] })}\n\n`,
    `data: ${chunk({ tool_calls: [{ function: { arguments: 'th":"."}' } }] })}\n\n`,
    `data: ${chunk({ tool_calls: [{ id: 'call_b', type: 'function', function: { name: 'fs_glob', arguments: '{"pattern":"*"}' } }] })}\n\n`,
    `data: ${chunk({}, 'tool_calls')}\n\ndata: [DONE]\n\n`
  ]))
  const calls = (await collect(provider)).filter((p) => p.type === 'tool_call')
  t.same(calls, [
    { type: 'tool_call', id: 'call_a', name: 'fs_list', arguments: '{"path":"."}' },
    { type: 'tool_call', id: 'call_b', name: 'fs_glob', arguments: '{"pattern":"*"}' }
  ])
})

t.test('a server that ignores stream: true and answers one chat completion is read as that answer; a page that is neither is INVALID_RESPONSE quoting it', async (t) => {
  // Before, every such answer failed the run with "The model stream ended without a finish_reason".
  const completion = (message: object, finishReason: string) =>
    JSON.stringify({ id: 'c', object: 'chat.completion', created: 0, model: 'm', choices: [{ index: 0, message, finish_reason: finishReason }], usage: { prompt_tokens: 5, completion_tokens: 3, total_tokens: 8 } })
  const answers: Array<[string, string]> = [
    ['application/json', completion({ role: 'assistant', content: 'Whole, not streamed.' }, 'stop')],
    ['application/json', completion({ role: 'assistant', content: null, tool_calls: [
      { id: 'call_1', type: 'function', function: { name: 'fs_list', arguments: '{}' } },
      { id: 'call_2', type: 'function', function: { name: 'fs_read', arguments: '{"path":"a"}' } }
    ] }, 'tool_calls')],
    ['application/json', JSON.stringify({ error: { message: 'Rate limit reached.', type: 'rate_limit_exceeded' } })],
    ['text/html', '<html><body>Please sign in to the proxy</body></html>']
  ]
  const { provider } = await startModel(t, (res) => {
    const [type, body] = answers.shift() ?? ['text/plain', '']
    res.writeHead(200, { 'content-type': type }).end(body)
  })
  const whole = await collect(provider)
  t.same(whole, [
    { type: 'text', delta: 'Whole, not streamed.' },
    { type: 'finish', finishReason: 'stop', usage: { inputTokens: 5, outputTokens: 3, totalTokens: 8 } }
  ])
  const calls = await collect(provider)
  t.same(calls.map((p) => p.type === 'tool_call' ? [p.id, p.name, p.arguments] : p.type), [['call_1', 'fs_list', '{}'], ['call_2', 'fs_read', '{"path":"a"}'], 'finish'])
  t.match((await failure(provider)).error.classified, { code: 'RATE_LIMITED', retryable: true }, 'an error object is classified like a streamed one')
  t.match((await failure(provider)).error.classified, {
    code: 'INVALID_RESPONSE', message: /answered text\/html, neither an event stream nor a chat completion: <html><body>Please sign in/
  })
})

t.test('an answer may ask for 128 tool calls; one more fails the call as INVALID_RESPONSE that says so, not as a streaming-format problem', async (t) => {
  // Before, any number ran: 20 000 calls of `{}` in one answer took 9 s and 500 MB of one process.
  // Then the error's advice was the catalogue's, to check the server's streaming format, which has nothing to do with it.
  const fragments = (n: number) => Array.from({ length: n }, (_, i) => ({ index: i, id: `call_${i}`, type: 'function', function: { name: 'fs_list', arguments: '{}' } }))
  const answers = [128, 129].map((n) => [`data: ${chunk({ tool_calls: fragments(n) })}\n\n`, `data: ${chunk({}, 'tool_calls')}\n\ndata: [DONE]\n\n`])
  const { provider } = await startModel(t, (res) => writeApart(res, answers.shift() ?? []))
  t.equal((await collect(provider)).filter((p) => p.type === 'tool_call').length, 128)
  const error = (await failure(provider)).error.classified
  t.match(error, {
    code: 'INVALID_RESPONSE', errorType: 'logical', retryable: false,
    message: /more than 128 tool calls in one answer/, detail: { reason: 'too_many_tool_calls', maxToolCalls: 128 }
  })
  const advice = error.recommendations.join(' ')
  t.notMatch(advice, /streaming format|stream: true|OPENAI_BASE_URL/, 'no advice about the server\'s format')
  t.match(advice, /at most 128|fewer|batches/i, 'says what to ask the model for instead')
})

t.test('keep-alive comments without an event end the call as TIMEOUT after the body timeout, as silence does', async (t) => {
  // Before, a server that sent `: ping` every 50 ms and nothing else held the call, and its run, for good.
  let closed: Promise<unknown> = Promise.resolve()
  const { provider } = await startModel(t, (res) => {
    closed = once(res, 'close')
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write(`data: ${chunk({ content: 'thinking' })}\n\n`)
    const timer = setInterval(() => res.write(': ping\n\n'), 50)
    res.on('close', () => clearInterval(timer))
  }, { bodyTimeoutMs: 500 })
  const { error, parts } = await failure(provider)
  t.equal(text(parts), 'thinking')
  t.match(error.classified, { code: 'TIMEOUT', message: /no event for 0\.5 s, only keep-alive comments/ })
  t.equal(await Promise.race([closed.then(() => 'closed'), delay(5000, 'still open')]), 'closed', 'the request was aborted')
})

t.test('usage counts that are not whole numbers of zero or more are taken as absent', async (t) => {
  // Before, "10" was kept as text: the run's usage became "010", and every GET of the run answered 500.
  const usages = [
    [{ prompt_tokens: '10', completion_tokens: 'x', total_tokens: null }, { inputTokens: 0, outputTokens: 0, totalTokens: 0 }],
    [{ prompt_tokens: -5, completion_tokens: 1.5, total_tokens: 1e308 }, { inputTokens: 0, outputTokens: 0, totalTokens: 0 }],
    [{ prompt_tokens: 7, completion_tokens: 2 }, { inputTokens: 7, outputTokens: 2, totalTokens: 9 }]
  ] as const
  const answers = usages.map(([usage]) => [`data: ${chunk({ content: 'a' }, 'stop')}\n\ndata: ${JSON.stringify({ choices: [], usage })}\n\ndata: [DONE]\n\n`])
  const { provider } = await startModel(t, (res) => writeApart(res, answers.shift() ?? []))
  for (const [sent, read] of usages) t.same((await collect(provider)).at(-1), { type: 'finish', finishReason: 'stop', usage: read }, JSON.stringify(sent))
})

t.test('the last event counts even when the stream ends without the blank line after it, or without [DONE]', async (t) => {
  const usage = chunk({}, 'stop', { usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 } })
  const { provider } = await startModel(t, (res) => writeApart(res, [`data: ${chunk({ content: 'end' })}\n\n`, `data: ${usage}`]))
  const parts = await collect(provider)
  t.equal(text(parts), 'end')
  t.same(parts.at(-1), { type: 'finish', finishReason: 'stop', usage: { inputTokens: 3, outputTokens: 1, totalTokens: 4 } })
})

t.test('[DONE] ends the call without waiting for the body to end; what follows it is dropped and the connection serves the next call', async (t) => {
  let release = (): void => undefined
  const released = new Promise<void>((resolve) => {
    release = resolve
  })
  let ended = false
  let calls = 0
  const { provider, connections } = await startModel(t, async (res) => {
    if (++calls > 1) return writeApart(res, [`data: ${chunk({ content: 'again' })}\n\ndata: ${stop}\n\ndata: [DONE]\n\n`])
    await writeApart(res, [`data: ${chunk({ content: 'first' })}\n\ndata: ${stop}\n\ndata: [DONE]\n\n`], false)
    await released
    await writeApart(res, ['data: {not json after done\n\n'])
    ended = true
  })
  const first = await collect(provider)
  t.equal(text(first), 'first')
  t.notOk(ended, 'the call was over before the server ended the body')
  release()
  while (!ended) await delay(5)
  // The client reads the end of the body on its own, then the connection is free again.
  await delay(50)
  t.equal(text(await collect(provider)), 'again')
  t.equal(connections(), 1, 'both calls went over one connection')
})

t.test('a server that goes on sending after [DONE] without ending has its request aborted once 128 KiB are dropped', async (t) => {
  let closed: Promise<unknown> = Promise.resolve()
  const { provider } = await startModel(t, async (res) => {
    closed = once(res, 'close')
    const noise = `: ${'x'.repeat(1022)}\n`
    await writeApart(res, [`data: ${chunk({ content: 'done' })}\n\ndata: ${stop}\n\ndata: [DONE]\n\n`, noise.repeat(100), noise.repeat(100)], false)
  }, { bodyTimeoutMs: 60_000 })
  t.equal(text(await collect(provider)), 'done')
  const outcome = await Promise.race([closed.then(() => 'closed'), delay(10_000, 'still open')])
  t.equal(outcome, 'closed', 'the server saw the request go away long before the body timeout')
})

t.test('a long answer read slowly arrives whole and in order (the socket is paused and resumed)', async (t) => {
  const words = Array.from({ length: 3000 }, (_, i) => `word${i} `)
  const { provider } = await startModel(t, (res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.end(words.map((word) => `data: ${chunk({ content: word })}\n\n`).join('') + `data: ${stop}\n\ndata: [DONE]\n\n`)
  })
  const parts: ModelStreamPart[] = []
  for await (const part of provider.stream(request, call())) {
    parts.push(part)
    if (parts.length % 500 === 0) await delay(20)
  }
  t.equal(text(parts), words.join(''))
})

t.test('a caller that stops reading early aborts the request', async (t) => {
  let closed: Promise<unknown> = Promise.resolve()
  const { provider } = await startModel(t, async (res) => {
    closed = once(res, 'close')
    await writeApart(res, [`data: ${chunk({ content: 'one' })}\n\n`, `data: ${chunk({ content: 'two' })}\n\n`], false)
  }, { bodyTimeoutMs: 60_000 })
  for await (const part of provider.stream(request, call())) {
    t.match(part, { type: 'text', delta: 'one' })
    break
  }
  const outcome = await Promise.race([closed.then(() => 'closed'), delay(10_000, 'still open')])
  t.equal(outcome, 'closed', 'the server saw the request go away long before the body timeout')
})

t.test('a redirect is followed with the same method and body, as fetch followed it', async (t) => {
  const { provider, requests } = await startModel(t, (res, received) => {
    if (received.url === '/v1/chat/completions') {
      res.writeHead(307, { location: '/moved/v1/chat/completions' })
      res.end()
      return
    }
    return writeApart(res, [`data: ${chunk({ content: 'moved' })}\n\ndata: ${stop}\n\ndata: [DONE]\n\n`])
  })
  t.equal(text(await collect(provider)), 'moved')
  t.same(requests.map((r) => r.url), ['/v1/chat/completions', '/moved/v1/chat/completions'])
  t.same(requests[1]?.body.messages, request.messages)
})

t.test('the request carries the API key, the X-Request-Id and the traceparent; an error answer that is not JSON keeps its text', async (t) => {
  let status = 200
  const { provider, requests } = await startModel(t, (res) => {
    if (status === 200) return writeApart(res, [`data: ${stop}\n\ndata: [DONE]\n\n`])
    res.writeHead(status, { 'content-type': 'text/html', 'retry-after': '3' })
    res.end('<html>502 Bad Gateway</html>')
  })
  const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'
  await collect(provider, { ...call(), requestId: 'req-headers.1', traceparent })
  t.match(requests[0]?.headers, {
    authorization: 'Bearer test-key', 'x-request-id': 'req-headers.1', traceparent, 'content-type': 'application/json', 'content-length': /^\d+$/
  })
  status = 502
  const { error } = await failure(provider)
  t.match(error.classified, { code: 'SERVER_ERROR', retryable: true, message: /502.*Bad Gateway/ })
  t.equal(error.retryAfterMs, 3000)
})

t.test('a server that never ends its line or its event fails the call as INVALID_RESPONSE at 8 MiB, in linear time', async (t) => {
  // Held on to, such a line took a gigabyte of memory a minute and a whole core (each piece
  // searched the whole line again), and the call ran until the server stopped.
  for (const [what, opening, piece] of [
    ['a line', 'data: {"a":"', 'x'.repeat(64 * 1024)],
    ['an event of many data lines', '', `data: ${'x'.repeat(64 * 1024 - 7)}\n`]
  ] as const) {
    let closed: Promise<unknown> = Promise.resolve()
    let sent = 0
    const { provider } = await startModel(t, async (res) => {
      closed = once(res, 'close')
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(opening)
      let gone = false
      res.on('close', () => (gone = true))
      while (!gone && sent < 64 * 1024 * 1024) {
        sent += piece.length
        if (!res.write(piece)) await once(res, 'drain')
      }
      res.end()
    }, { bodyTimeoutMs: 60_000 })
    const started = process.cpuUsage()
    const { error } = await failure(provider)
    const cpuMs = (process.cpuUsage(started).user + process.cpuUsage(started).system) / 1000
    t.match(error.classified, { code: 'INVALID_RESPONSE', retryable: false, message: /longer than 8 MiB/ }, what)
    t.ok(sent < 24 * 1024 * 1024, `${what}: the call stopped after ${(sent / 1024 / 1024).toFixed(1)} MiB were sent`)
    t.ok(cpuMs < 2000, `${what}: ${cpuMs.toFixed(0)} ms of CPU`)
    const outcome = await Promise.race([closed.then(() => 'closed'), delay(5000, 'still open')])
    t.equal(outcome, 'closed', `${what}: the request was aborted`)
  }
})

t.test('a server that streams an answer without end fails the call as INVALID_RESPONSE past 4 Mi characters or 256 Ki chunks', async (t) => {
  // Before, every chunk of such an answer was stored and sent (a gigabyte of events a minute)
  // until the server stopped or the disk was full.
  for (const [what, delta, sentAtMost] of [
    ['text in large chunks', { content: 'y'.repeat(4000) }, 4 * 1024 * 1024 + 8000],
    ['tool-call arguments', { tool_calls: [{ index: 0, function: { arguments: 'z'.repeat(4000) } }] }, 4 * 1024 * 1024 + 8000],
    // A name is appended fragment by fragment too; before, names were not counted and grew without end.
    ['a tool-call name', { tool_calls: [{ index: 0, function: { name: 'n'.repeat(4000) } }] }, 4 * 1024 * 1024 + 8000],
    ['one character a chunk', { content: 'y' }, 256 * 1024 + 2]
  ] as const) {
    let sent = 0
    let closed: Promise<unknown> = Promise.resolve()
    const { provider } = await startModel(t, async (res) => {
      closed = once(res, 'close')
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      let gone = false
      res.on('close', () => (gone = true))
      const first = chunk({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'f', arguments: '' } }] })
      if (what !== 'text in large chunks' && what !== 'one character a chunk') res.write(`data: ${first}\n\n`)
      const event = `data: ${chunk(delta)}\n\n`
      while (!gone && sent < 64 * 1024 * 1024) {
        const batch = event.repeat(64)
        sent += 64 * (what === 'one character a chunk' ? 1 : 4000)
        if (!res.write(batch)) await once(res, 'drain')
      }
      res.end()
    }, { bodyTimeoutMs: 60_000 })
    const { error, parts } = await failure(provider)
    t.match(error.classified, { code: 'INVALID_RESPONSE', retryable: false, message: /without finishing/ }, what)
    const got = parts.reduce((n, p) => n + (p.type === 'text' ? p.delta.length : 0), 0)
    t.ok(got <= sentAtMost, `${what}: ${got} characters handed on before the call failed`)
    const outcome = await Promise.race([closed.then(() => 'closed'), delay(5000, 'still open')])
    t.equal(outcome, 'closed', `${what}: the request was aborted`)
  }
})
