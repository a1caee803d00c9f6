import { once } from 'node:events'
import { setTimeout as delay } from 'node:timers/promises'
import t from 'tap'
import { createServer } from 'node:http'
import { buildTestApp, createSession, sendAndWait, type TestApp } from '../helpers/app.ts'
import { chunk, errorAnswer, startModelServer, streamOf, textAnswer, type ModelAnswer } from '../helpers/model-server.ts'
import type { StreamedEvent } from '../helpers/sse.ts'

// Runs against model servers that are not ours, each answering as some real provider does.

async function appWith(t: Parameters<typeof buildTestApp>[0], answer: ModelAnswer) {
  const server = await startModelServer(t, answer)
  const ctx = await buildTestApp(t, { app: { model: server.provider } })
  return { ctx, requests: server.requests }
}

/** No lone surrogate: with the u flag, a pair is one code point and only a lone half is in Cs. */
const wellFormed = (text: string) => !/\p{Cs}/u.test(text)

/**
 * An app on a model server answering `answer`, and a session whose one tool is a webhook named
 * `name` that answers every call with the JSON text `body`.
 */
async function withWebhookTool(t: Parameters<typeof buildTestApp>[0], name: string, body: string, answer: ModelAnswer) {
  const hook = createServer((req, res) => {
    req.resume()
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(body))
  })
  hook.listen(0, '127.0.0.1')
  await once(hook, 'listening')
  t.teardown(() => {
    hook.closeAllConnections()
    hook.close()
  })
  const port = (hook.address() as { port: number }).port
  const server = await startModelServer(t, answer)
  const ctx = await buildTestApp(t, { app: { model: server.provider }, env: { AGENTD_WEBHOOK_HOSTS: `127.0.0.1:${port}` } })
  const sessionId = await createSession(ctx, {
    tools: [{ type: 'webhook', name, description: name, parameters: { type: 'object', properties: {} }, url: `http://127.0.0.1:${port}/${name}` }]
  })
  return { ctx, server, sessionId }
}

async function eventsOf(ctx: TestApp, sessionId: string, runId: string): Promise<StreamedEvent[]> {
  const page = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/events?limit=1000`, headers: { accept: 'application/json' } })).json()
  return (page.data as StreamedEvent[]).filter((e) => e.runId === runId)
}

t.test('llama.cpp refusing a prompt over its context size is CONTEXT_LENGTH_EXCEEDED: the loop compacts harder and retries', async (t) => {
  // Before, its 400 `exceed_context_size_error` was UNKNOWN and failed the run without compacting.
  const llamaRefusal = {
    error: { code: 400, message: 'request (4476 tokens) exceeds the available context size (4096 tokens), try increasing it', type: 'exceed_context_size_error', n_prompt_tokens: 4476, n_ctx: 4096 }
  }
  const refusals = [1, 3, 4]
  let calls = 0
  const { ctx } = await appWith(t, (res) => {
    if (refusals.includes(++calls)) return errorAnswer(res, 400, llamaRefusal)
    textAnswer(res, 'fits now')
  })
  const sessionId = await createSession(ctx)
  const { run, message } = await sendAndWait(ctx, sessionId, 'hello')
  t.match(run, { status: 'completed', error: null })
  t.equal(message.content, 'fits now')
  t.equal(calls, 2, 'asked again after compacting harder (a short history has nothing to compact)')
  t.notOk((await eventsOf(ctx, sessionId, run.id)).some((e) => e.type === 'error'))

  const refused = await sendAndWait(ctx, sessionId, 'again')
  t.match(refused.run, {
    status: 'failed', error: { code: 'CONTEXT_LENGTH_EXCEEDED', errorType: 'runtime', fatal: true, detail: { status: 400, providerType: 'exceed_context_size_error' } }
  })
  t.ok(refused.run.error.recommendations.some((r: string) => /limits\.contextTokens/.test(r)), 'recommends lowering limits.contextTokens')
  t.equal(calls, 4, 'the harder retry refused too: no more calls')
})

t.test('context-length refusals as xAI and TGI-based hosts (Together, Hugging Face) word them are CONTEXT_LENGTH_EXCEEDED', async (t) => {
  // Before, both were UNKNOWN: the run failed without compacting harder, and so did every later
  // run of a session that had outgrown the window.
  const refusals: Array<[string, number, object]> = [
    ['xAI', 400, { code: 'Client specified an invalid argument', error: "This model's maximum prompt length is 131072 but the request contains 136973 tokens." }],
    ['TGI', 422, { error: 'Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 512 `max_new_tokens`', error_type: 'validation' }]
  ]
  for (const [provider, status, body] of refusals) {
    let calls = 0
    const { ctx } = await appWith(t, (res) => {
      calls++
      errorAnswer(res, status, body)
    })
    const sessionId = await createSession(ctx)
    const { run } = await sendAndWait(ctx, sessionId, 'hello')
    t.match(run, { status: 'failed', error: { code: 'CONTEXT_LENGTH_EXCEEDED', errorType: 'runtime', fatal: true, detail: { status } } }, provider)
    t.equal(calls, 2, `${provider}: compacted harder and asked once more`)
  }
})

t.test('an error inside a stream that names its HTTP status in `code` is classified as that status, and retried when it may be', async (t) => {
  // vLLM sends `{"error": {…, "code": 500}}` inside the stream, LiteLLM `"code": "429"`, OpenRouter a number too.
  // Before, a code that was not a word was UNKNOWN: not retried, the run failed at once.
  const errors = [
    { object: 'error', message: 'The engine is dead.', type: 'InternalServerError', param: null, code: 500 },
    { message: 'litellm.RateLimitError: Rate limit reached', type: 'None', param: 'None', code: '429' },
    { message: 'Invalid API key.', code: 401 }
  ]
  let calls = 0
  const { ctx } = await appWith(t, (res) => {
    calls++
    const error = [1, 3, 5].includes(calls) ? errors.shift() : undefined
    if (error) return streamOf(res, JSON.stringify({ error }))
    textAnswer(res, 'after the retry')
  })
  const sessionId = await createSession(ctx)
  for (const code of ['SERVER_ERROR', 'RATE_LIMITED']) {
    const { run, message } = await sendAndWait(ctx, sessionId, code)
    t.match(run, { status: 'completed' }, `${code} was retried`)
    t.equal(message.content, 'after the retry')
    t.match((await eventsOf(ctx, sessionId, run.id)).filter((e) => e.type === 'model_retry').map((e) => e.data), [{ attempt: 1, code }])
  }
  const { run } = await sendAndWait(ctx, sessionId, 'bad key')
  t.match(run, { status: 'failed', error: { code: 'AUTHENTICATION_ERROR', retryable: false, fatal: true, message: /Invalid API key/ } })
  t.notOk((await eventsOf(ctx, sessionId, run.id)).some((e) => e.type === 'model_retry'))
  t.equal(calls, 5)
})

t.test('compaction never cuts a character in half: every request stays valid Unicode, which strict JSON parsers demand', async (t) => {
  // Before, a long message of emoji was cut between the two halves of one, in the summary request
  // and in the truncation note: DeepSeek and Anthropic refuse such a body (400 "lone leading
  // surrogate", "no low surrogate in string"), so the summary failed and then the run did.
  const { ctx, requests } = await appWith(t, (res, request) => {
    const broken = request.messages.find((m) => typeof m.content === 'string' && !wellFormed(m.content))
    if (broken) return errorAnswer(res, 400, { error: { message: 'Failed to deserialize the JSON body: lone leading surrogate in hex escape', type: 'invalid_request_error' } })
    const summarising = typeof request.messages[0]?.content === 'string' && request.messages[0].content.startsWith('You summarise')
    textAnswer(res, summarising ? 'The user sent a long row of smileys.' : 'ok')
  })
  const sessionId = await createSession(ctx, { model: 'deepseek-chat', tools: [], limits: { contextTokens: 5000 } })
  t.equal((await sendAndWait(ctx, sessionId, `x${'😀'.repeat(2500)}`)).run.status, 'completed')
  const { run } = await sendAndWait(ctx, sessionId, 'and now? '.repeat(700))
  t.match(run, { status: 'completed', error: null })
  const events = await eventsOf(ctx, sessionId, run.id)
  t.notOk(events.some((e) => e.type === 'error'), 'no warning: the summary was written')
  t.match(events.find((e) => e.type === 'context_compacted')?.data, { method: 'summary' })
  t.ok(requests.every((r) => r.messages.every((m) => typeof m.content !== 'string' || wellFormed(m.content))), 'every request was valid Unicode')
})

t.test('the summary of an OpenAI reasoning model\'s session asks for max_completion_tokens, the only limit those models take', async (t) => {
  // Before, it sent max_tokens, which gpt-5 and the o-series refuse with a 400: every summary
  // failed, and every compaction of such a session fell back to truncation with a warning.
  const { ctx, requests } = await appWith(t, (res, request) => {
    if (/^(gpt-5|o\d)/.test(request.model) && request.max_tokens !== undefined) {
      return errorAnswer(res, 400, {
        error: { message: "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", type: 'invalid_request_error', param: 'max_tokens', code: 'unsupported_parameter' }
      })
    }
    const summarising = typeof request.messages[0]?.content === 'string' && request.messages[0].content.startsWith('You summarise')
    textAnswer(res, summarising ? 'The user talked about a fox.' : 'ok')
  })
  const words = (tag: string) => `${tag}: ${'the quick brown fox jumps over the lazy dog '.repeat(100)}`
  for (const model of ['gpt-5-mini', 'o4-mini']) {
    const sessionId = await createSession(ctx, { model, tools: [], limits: { contextTokens: 1500 } })
    t.equal((await sendAndWait(ctx, sessionId, words('first'))).run.status, 'completed')
    const { run } = await sendAndWait(ctx, sessionId, words('second'))
    t.match(run, { status: 'completed', error: null })
    const events = await eventsOf(ctx, sessionId, run.id)
    t.notOk(events.some((e) => e.type === 'error'), `${model}: no SUMMARY_FAILED warning`)
    t.match(events.find((e) => e.type === 'context_compacted')?.data, { method: 'summary' }, `${model}: the older turns were summarised`)
    t.match(requests.at(-2), { model, max_completion_tokens: Number, max_tokens: undefined }, `${model}: the summary request`)
  }
})

t.test('a refusal is the answer\'s text: streamed, stored and returned like any text', async (t) => {
  // OpenAI streams a refusal in `delta.refusal` with `content: null`. Before, it was dropped: the
  // run completed with an empty answer, and neither the client nor the next call saw why.
  const refusal = "I'm sorry, I can't help with that."
  let calls = 0
  const { ctx } = await appWith(t, (res) => {
    if (++calls === 1) {
      return streamOf(res, chunk({ role: 'assistant', content: null, refusal: '' }), chunk({ refusal: "I'm sorry, " }), chunk({ refusal: "I can't help with that." }), chunk({}, 'stop'), '[DONE]')
    }
    // A server that ignores stream: true answers one completion whose message holds the refusal.
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ id: 'c', object: 'chat.completion', created: 0, model: 'm', choices: [{ index: 0, message: { role: 'assistant', content: null, refusal }, finish_reason: 'stop' }] }))
  })
  const sessionId = await createSession(ctx)
  const { run, message } = await sendAndWait(ctx, sessionId, 'something it refuses')
  t.match(run, { status: 'completed', error: null })
  t.equal(message.content, refusal)
  const events = await eventsOf(ctx, sessionId, run.id)
  t.equal(events.filter((e) => e.type === 'text_chunk').map((e) => e.data.delta).join(''), refusal)
  t.match(events.find((e) => e.type === 'text_chunk_end')?.data, { text: refusal })
  const stored = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/messages` })).json().data
  t.match(stored.at(-1), { role: 'assistant', content: refusal })
  t.equal((await sendAndWait(ctx, sessionId, 'again')).message.content, refusal, 'the same in a whole completion')
})

t.test('[DONE] without a finish_reason ends the answer; a body that ends with neither was cut short and is retried before its first token', async (t) => {
  // Before, both were INVALID_RESPONSE: an answer the client had seen whole (DeepSeek on some
  // hosts leaves finish_reason out) failed its run and was not stored, and an empty 200 body
  // failed the run instead of being asked again.
  const answers: Array<(res: Parameters<ModelAnswer>[0]) => void> = [
    (res) => streamOf(res, chunk({ role: 'assistant', content: 'Whole ' }), chunk({ content: 'answer.' }), '[DONE]'),
    (res) => res.writeHead(200, { 'content-type': 'text/event-stream' }).end(),
    (res) => textAnswer(res, 'asked again'),
    (res) => streamOf(res, chunk({ role: 'assistant', content: 'Half an ' }), chunk({ content: 'answer' }))
  ]
  const { ctx } = await appWith(t, (res) => answers.shift()?.(res))
  const sessionId = await createSession(ctx)

  const whole = await sendAndWait(ctx, sessionId, 'one')
  t.match(whole.run, { status: 'completed', error: null })
  t.equal(whole.message.content, 'Whole answer.')

  const retried = await sendAndWait(ctx, sessionId, 'two')
  t.match(retried.run, { status: 'completed', error: null })
  t.equal(retried.message.content, 'asked again')
  t.match((await eventsOf(ctx, sessionId, retried.run.id)).filter((e) => e.type === 'model_retry').map((e) => e.data), [{ attempt: 1, code: 'NETWORK_ERROR' }])

  const cut = await sendAndWait(ctx, sessionId, 'three')
  t.match(cut.run, { status: 'failed', error: { code: 'NETWORK_ERROR', errorType: 'runtime', fatal: true, detail: { reason: 'stream_ended_early' } } })
  const events = await eventsOf(ctx, sessionId, cut.run.id)
  t.notOk(events.some((e) => e.type === 'model_retry'), 'not retried once text was shown: it would be repeated')
  t.match(events.find((e) => e.type === 'text_chunk_end')?.data, { text: 'Half an answer' })
  const stored = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/messages` })).json().data
  t.same(stored.map((m: { role: string; content: string }) => [m.role, m.content]), [
    ['user', 'one'], ['assistant', 'Whole answer.'], ['user', 'two'], ['assistant', 'asked again'], ['user', 'three']
  ])
})

t.test('a tool call whose arguments are not a JSON object is sent back as {}: servers that parse them would refuse every later request of the session', async (t) => {
  // Servers that render past tool calls through a chat template (vLLM until it learnt to coerce
  // them) parse their arguments as JSON. Before, the model's truncated arguments went back as they
  // came: every later request was a 400, and the session could not go on.
  const { ctx, requests } = await appWith(t, (res, request) => {
    for (const message of request.messages) {
      for (const call of (message.role === 'assistant' && message.tool_calls) || []) {
        let parsed: unknown
        try {
          parsed = JSON.parse(call.type === 'function' ? call.function.arguments : '')
        } catch {}
        if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
          return errorAnswer(res, 400, { object: 'error', message: "Expecting ',' delimiter: line 1 column 17 (char 16)", type: 'BadRequestError', param: null, code: 400 })
        }
      }
    }
    if (request.messages.at(-1)?.role === 'user') {
      return streamOf(res, chunk({ role: 'assistant', tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'fs_read', arguments: '{"path": "a.txt"' } }] }), chunk({}, 'tool_calls'), '[DONE]')
    }
    textAnswer(res, 'I will send whole arguments next time.')
  })
  const sessionId = await createSession(ctx, { tools: ['fs_read'] })
  const { run, message } = await sendAndWait(ctx, sessionId, 'read a.txt')
  t.match(run, { status: 'completed', error: null, steps: 2 })
  t.equal(message.content, 'I will send whole arguments next time.')
  const events = await eventsOf(ctx, sessionId, run.id)
  t.match(events.find((e) => e.type === 'tool:error')?.data, { error: { code: 'VALIDATION_ERROR', message: /not valid JSON/ } }, 'the model was told why')
  const sent = requests.at(-1)?.messages.find((m) => m.role === 'assistant')
  t.match(sent, { tool_calls: [{ function: { name: 'fs_read', arguments: '{}' } }] })
  const stored = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/messages` })).json().data
  t.match(stored[1], { role: 'assistant', toolCalls: [{ name: 'fs_read', arguments: '{"path": "a.txt"' }] }, 'the stored call keeps what the model sent')
  t.equal((await sendAndWait(ctx, sessionId, 'and again')).run.status, 'completed', 'the session goes on')
})

t.test('a Retry-After sent twice ("1, 1" once joined) waits its seconds; one that is neither seconds nor an HTTP date is ignored', async (t) => {
  // Before, both went to Date.parse, which reads "1, 1" as 1 January 2001 (a date past: the retry
  // went out at once) and "wait 3600" as the year 3600 (the run failed, asked to wait 1 600 years).
  const answers: Array<(res: Parameters<ModelAnswer>[0]) => void> = [
    (res) => {
      res.setHeader('retry-after', ['1', '1'])
      errorAnswer(res, 429, { error: { message: 'Rate limit reached.', type: 'requests', code: 'rate_limit_exceeded' } })
    },
    (res) => textAnswer(res, 'waited'),
    (res) => res.writeHead(503, { 'retry-after': 'wait 3600', 'content-type': 'text/html' }).end('<html>busy</html>'),
    (res) => textAnswer(res, 'backed off')
  ]
  const { ctx } = await appWith(t, (res) => answers.shift()?.(res))
  const sessionId = await createSession(ctx)
  const first = await sendAndWait(ctx, sessionId, 'one')
  t.equal(first.message.content, 'waited')
  t.match((await eventsOf(ctx, sessionId, first.run.id)).filter((e) => e.type === 'model_retry').map((e) => e.data), [{ attempt: 1, code: 'RATE_LIMITED', status: 429, delayMs: 1000 }])
  t.ok(Date.parse(first.run.endedAt) - Date.parse(first.run.startedAt) >= 1000, 'the retry waited the second it was asked to')
  const second = await sendAndWait(ctx, sessionId, 'two')
  t.match(second.run, { status: 'completed', error: null })
  t.equal(second.message?.content, 'backed off')
  const retry = (await eventsOf(ctx, sessionId, second.run.id)).find((e) => e.type === 'model_retry')
  t.match(retry?.data, { attempt: 1, code: 'SERVER_ERROR', status: 503 })
  t.ok(retry && retry.data.delayMs <= 5, `the policy's backoff (base 5 ms in tests): ${retry?.data.delayMs} ms`)
})

t.test('parallel tool calls that share a stream index but not an ID stay apart, and an ID that comes after the name joins its call', async (t) => {
  // Gemini's OpenAI-compatible API streams each parallel call whole, every one at index 0 with an
  // ID of its own. Before, they were joined into one call named "fs_listfs_read" whose arguments
  // were two objects end to end. A server that sends no index and the ID after the name had
  // that name-less fragment start a second call, and the answer failed as INVALID_RESPONSE.
  const calls = [
    [
      chunk({ role: 'assistant', tool_calls: [{ index: 0, id: 'function-call-1', type: 'function', function: { name: 'fs_list', arguments: '{"path":"."}' } }] }),
      chunk({ tool_calls: [{ index: 0, id: 'function-call-2', type: 'function', function: { name: 'fs_glob', arguments: '{"pattern":"*.txt"}' } }] }),
      chunk({}, 'stop')
    ],
    [
      chunk({ role: 'assistant', tool_calls: [{ type: 'function', function: { name: 'fs_list', arguments: '' } }] }),
      chunk({ tool_calls: [{ id: 'call_late', function: { arguments: '{"path":"."}' } }] }),
      chunk({}, 'tool_calls')
    ]
  ]
  const { ctx } = await appWith(t, (res, request) => {
    if (request.messages.at(-1)?.role === 'user') return streamOf(res, ...(calls.shift() ?? []), '[DONE]')
    textAnswer(res, 'listed')
  })
  const sessionId = await createSession(ctx, { tools: ['fs_list', 'fs_glob'] })
  for (const [content, names] of [['parallel', ['fs_list', 'fs_glob']], ['late id', ['fs_list']]] as const) {
    const { run } = await sendAndWait(ctx, sessionId, content)
    t.match(run, { status: 'completed', error: null, steps: 2 }, content)
    const events = await eventsOf(ctx, sessionId, run.id)
    t.same(events.filter((e) => e.type === 'tool:end').map((e) => [e.data.call.name, e.data.call.state]), names.map((name) => [name, 'completed']), `${content}: each call ran`)
  }
  const stored = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/messages` })).json().data
  t.match(stored[1], { role: 'assistant', toolCalls: [{ name: 'fs_list', arguments: '{"path":"."}' }, { name: 'fs_glob', arguments: '{"pattern":"*.txt"}' }] })
})

t.test('[DONE] with no chunk before it is no answer: the call is asked again, not taken as an empty answer', async (t) => {
  // Since [DONE] stands for a missing finish_reason, a stream of [DONE] alone (a proxy that lost
  // its upstream) completed the run with an empty answer.
  const answers: Array<(res: Parameters<ModelAnswer>[0]) => void> = [(res) => streamOf(res, '[DONE]'), (res) => textAnswer(res, 'a real answer')]
  const { ctx } = await appWith(t, (res) => answers.shift()?.(res))
  const sessionId = await createSession(ctx)
  const { run, message } = await sendAndWait(ctx, sessionId, 'hello')
  t.match(run, { status: 'completed', error: null })
  t.equal(message.content, 'a real answer')
  t.match((await eventsOf(ctx, sessionId, run.id)).filter((e) => e.type === 'model_retry').map((e) => e.data), [{ attempt: 1, code: 'NETWORK_ERROR' }])
})

t.test('an error answer with a body without end is read no further than 1 MiB, and the run\'s error quotes 1 KiB of it', async (t) => {
  // Before, the whole body was held until it ended (a server sending 256 MiB grew the process by
  // 1.6 GB), and all of it became the run's error message, stored and sent in its events.
  const sentPerRequest: number[] = []
  const { ctx } = await appWith(t, async (res) => {
    res.writeHead(500, { 'content-type': 'text/html' })
    let sent = 0
    let gone = false
    res.on('close', () => (gone = true))
    const piece = `<p>${'x'.repeat(16 * 1024)}</p>`
    while (!gone && sent < 16 * 1024 * 1024) {
      sent += piece.length
      if (!res.write(piece)) await Promise.race([once(res, 'drain'), once(res, 'close')])
    }
    sentPerRequest.push(sent)
    res.end()
  })
  const sessionId = await createSession(ctx)
  const { run } = await sendAndWait(ctx, sessionId, 'hello')
  t.match(run, { status: 'failed', error: { code: 'SERVER_ERROR', retryable: true, fatal: true, message: /^The model provider answered 500: 500 <p>x+/ } })
  t.ok(run.error.message.length < 1200, `the message holds ${run.error.message.length} characters`)
  t.ok(run.error.detail.providerMessage.length <= 1025, 'and so does detail.providerMessage')
  while (sentPerRequest.length < 4) await delay(10)
  t.ok(sentPerRequest.every((sent) => sent < 12 * 1024 * 1024), `each request was abandoned early: ${sentPerRequest.map((n) => (n / 1024).toFixed(0)).join(', ')} KiB sent`)
  const error = (await eventsOf(ctx, sessionId, run.id)).find((e) => e.type === 'error')
  t.ok(JSON.stringify(error).length < 4096, 'the monitor error event stays small')
})

t.test('a context-length error after text was streamed fails the run: the harder retry would answer a second time under the first', async (t) => {
  // Before, the loop compacted harder and asked again: the client saw "Partial" and then a second
  // answer in the same step, and only the second was stored.
  let calls = 0
  const { ctx } = await appWith(t, (res) => {
    calls++
    streamOf(res, chunk({ role: 'assistant', content: 'Partial' }),
      JSON.stringify({ error: { message: "This model's maximum context length is 4096 tokens.", type: 'invalid_request_error', code: 'context_length_exceeded' } }))
  })
  const sessionId = await createSession(ctx)
  const { run } = await sendAndWait(ctx, sessionId, 'hello')
  t.match(run, { status: 'failed', error: { code: 'CONTEXT_LENGTH_EXCEEDED', fatal: true } })
  t.equal(calls, 1, 'not asked again')
  const events = await eventsOf(ctx, sessionId, run.id)
  t.equal(events.filter((e) => e.type === 'text_chunk_start').length, 1, 'one answer was shown')
  const stored = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/messages` })).json().data
  t.same(stored.map((m: { role: string }) => m.role), ['user'])
})

t.test('an answer cut at the output limit (finish_reason "length") completes with its text and a monitor warn that says so', async (t) => {
  // Before, the run completed as if the answer were whole: nothing told the client it was cut.
  const { ctx } = await appWith(t, (res) => streamOf(res, chunk({ role: 'assistant', content: 'The first half of' }), chunk({}, 'length'), '[DONE]'))
  const sessionId = await createSession(ctx)
  const { run, message } = await sendAndWait(ctx, sessionId, 'a long answer, please')
  t.match(run, { status: 'completed', error: null })
  t.equal(message.content, 'The first half of', 'the text that came is the answer')
  const events = await eventsOf(ctx, sessionId, run.id)
  const warns = events.filter((e) => e.type === 'error')
  t.equal(warns.length, 1, 'one warning')
  t.match(warns[0]?.data, {
    severity: 'warn', phase: 'model', message: /output/,
    detail: { errorType: 'logical', code: 'INVALID_RESPONSE', retryable: false, fatal: false, detail: { reason: 'output_truncated', finishReason: 'length' } }
  })
  t.match(warns[0]?.data.detail.recommendations.join(' '), /output limit|max_tokens|shorter/i, 'says what the client can do')
  const types = events.map((e) => e.type)
  t.ok(types.includes('error') && types.indexOf('error') < types.indexOf('done'), 'the warning comes before the run ends')
})

t.test('tool calls in an answer cut at the output limit: cut arguments come back to the model as a validation error that says why', async (t) => {
  // Before, the cut JSON came back as "not valid JSON" only, which the model read as its own
  // mistake; the answer's cut was not reported to the client either.
  let calls = 0
  const { ctx, requests } = await appWith(t, (res) => {
    if (++calls > 1) return textAnswer(res, 'done')
    streamOf(res,
      chunk({ role: 'assistant', tool_calls: [{ index: 0, id: 'call_a', type: 'function', function: { name: 'fs_list', arguments: '{"path": "."}' } }] }),
      chunk({ tool_calls: [{ index: 1, id: 'call_b', type: 'function', function: { name: 'fs_list', arguments: '{"path": "sub' } }] }),
      chunk({}, 'length'), '[DONE]')
  })
  const sessionId = await createSession(ctx, { tools: ['fs_list'] })
  const { run, message } = await sendAndWait(ctx, sessionId, 'list')
  t.match(run, { status: 'completed', error: null })
  t.equal(message.content, 'done')
  const results = (requests[1]?.messages ?? []).filter((m) => m.role === 'tool').map((m) => JSON.parse(m.content as string))
  t.equal(results.length, 2, 'both calls were answered')
  t.notMatch(results[0], { ok: false }, 'the whole call ran')
  t.match(results[1], { ok: false, errorType: 'validation', code: 'VALIDATION_ERROR', error: /cut|output limit/i })
  t.match(results[1].recommendations.join(' '), /shorter|smaller|parts/i)
  const warns = (await eventsOf(ctx, sessionId, run.id)).filter((e) => e.type === 'error' && e.data.phase === 'model')
  t.match(warns.map((e) => e.data.detail.detail), [{ reason: 'output_truncated', finishReason: 'length' }])
})

t.test('an empty answer stopped by a content filter warns the client, and is left out of the next request', async (t) => {
  // Before, the run completed with an empty answer and no sign of why; the next request carried
  // `{"role": "assistant", "content": ""}`, which some OpenAI-compatible gateways refuse.
  let calls = 0
  const { ctx, requests } = await appWith(t, (res) => {
    if (++calls > 1) return textAnswer(res, 'fine')
    streamOf(res, chunk({ role: 'assistant', content: '' }), chunk({}, 'content_filter'), '[DONE]')
  })
  const sessionId = await createSession(ctx)
  const { run } = await sendAndWait(ctx, sessionId, 'something filtered')
  t.match(run, { status: 'completed', error: null })
  const warns = (await eventsOf(ctx, sessionId, run.id)).filter((e) => e.type === 'error')
  t.equal(warns.length, 1)
  t.match(warns[0]?.data, {
    severity: 'warn', phase: 'model', message: /content filter/i,
    detail: { errorType: 'logical', code: 'INVALID_RESPONSE', retryable: false, fatal: false, detail: { reason: 'content_filter', finishReason: 'content_filter' } }
  })
  t.ok(warns[0]?.data.detail.recommendations.length > 0)

  t.match((await sendAndWait(ctx, sessionId, 'something else')).run, { status: 'completed' })
  t.same(requests[1]?.messages.filter((m) => m.role !== 'system').map((m) => [m.role, m.content]), [['user', 'something filtered'], ['user', 'something else']],
    'no assistant message without text or tool calls')
})

t.test('a body that begins with a UTF-8 byte order mark is read without it: a stream keeps its first event, a whole completion parses', async (t) => {
  // Before, the mark stayed in front of the first line: a stream's first event was read as a
  // field named "\uFEFFdata" and dropped (an answer sent in one event came out empty), and a
  // whole completion was not JSON (INVALID_RESPONSE). The openai SDK, and every WHATWG decoder, drop it.
  const bom = '\uFEFF'
  const answers: Array<(res: Parameters<ModelAnswer>[0]) => void> = [
    (res) => res.writeHead(200, { 'content-type': 'text/event-stream' })
      .end(`${bom}data: ${chunk({ role: 'assistant', content: 'All in the first event.' }, 'stop')}\n\ndata: [DONE]\n\n`),
    (res) => res.writeHead(200, { 'content-type': 'application/json; charset=utf-8' }).end(bom + JSON.stringify({
      id: 'c', object: 'chat.completion', created: 0, model: 'm', choices: [{ index: 0, message: { role: 'assistant', content: 'Whole, with a mark.' }, finish_reason: 'stop' }]
    }))
  ]
  const { ctx } = await appWith(t, (res) => answers.shift()?.(res))
  const sessionId = await createSession(ctx)

  const streamed = await sendAndWait(ctx, sessionId, 'one')
  t.match(streamed.run, { status: 'completed', error: null })
  t.equal(streamed.message.content, 'All in the first event.')

  const whole = await sendAndWait(ctx, sessionId, 'two')
  t.match(whole.run, { status: 'completed', error: null })
  t.equal(whole.message.content, 'Whole, with a mark.')
})

t.test('a server that sends the tool call\'s name again in every fragment (Fireworks, MiniMax on NVIDIA NIM) calls that tool, not its name twice', async (t) => {
  // Before, the name was appended at every fragment: "fs_listfs_listfs_list" matched no tool,
  // and the call failed as TOOL_NOT_FOUND. A name sent in parts is still joined.
  const calls = [
    [
      chunk({ role: 'assistant', tool_calls: [{ index: 0, id: 'chatcmpl-tool-aa62', type: 'function', function: { name: 'fs_list', arguments: '' } }] }),
      chunk({ tool_calls: [{ index: 0, id: 'chatcmpl-tool-aa62', type: 'function', function: { name: 'fs_list', arguments: '{"path":' } }] }),
      chunk({ tool_calls: [{ index: 0, id: 'chatcmpl-tool-aa62', type: 'function', function: { name: 'fs_list', arguments: '"."}' } }] }),
      chunk({}, 'tool_calls')
    ],
    [
      chunk({ role: 'assistant', tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'fs_', arguments: '' } }] }),
      chunk({ tool_calls: [{ index: 0, function: { name: 'list', arguments: '{"path":"."}' } }] }),
      chunk({}, 'tool_calls')
    ]
  ]
  const { ctx } = await appWith(t, (res, request) => {
    if (request.messages.at(-1)?.role === 'user') return streamOf(res, ...(calls.shift() ?? []), '[DONE]')
    textAnswer(res, 'listed')
  })
  const sessionId = await createSession(ctx, { tools: ['fs_list'] })
  for (const content of ['repeated', 'in parts']) {
    const { run } = await sendAndWait(ctx, sessionId, content)
    t.match(run, { status: 'completed', error: null, steps: 2 }, content)
    const events = await eventsOf(ctx, sessionId, run.id)
    t.same(events.filter((e) => e.type === 'tool:end').map((e) => [e.data.call.name, e.data.call.input, e.data.call.state]), [['fs_list', { path: '.' }, 'completed']], content)
  }
})

t.test('a text tool result holding a lone surrogate (a webhook\'s "\\ud83d" escape) reaches the model as valid Unicode, not as a body strict servers refuse', async (t) => {
  // Before, the webhook's JSON string kept the lone half in memory, and the next request of the
  // run carried it as a \ud83d escape (a result that is an object is sent as its JSON text, which escapes it): DeepSeek, llama.cpp and other strict parsers refuse that
  // body (400), and the run failed. The store already kept it as U+FFFD, so only this run broke.
  const { ctx, server, sessionId } = await withWebhookTool(t, 'title', '"cut emoji \\ud83d here"', (res, request) => {
    const broken = request.messages.find((m) => typeof m.content === 'string' && !wellFormed(m.content))
    if (broken) return errorAnswer(res, 400, { error: { message: 'Failed to deserialize the JSON body: lone leading surrogate in hex escape', type: 'invalid_request_error' } })
    if (request.messages.at(-1)?.role === 'user') {
      return streamOf(res, chunk({ role: 'assistant', tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'title', arguments: '{}' } }] }), chunk({}, 'tool_calls'), '[DONE]')
    }
    textAnswer(res, 'read it')
  })
  const { run, message } = await sendAndWait(ctx, sessionId, 'title?')
  t.match(run, { status: 'completed', error: null })
  t.equal(message.content, 'read it')
  t.ok(server.requests.every((r) => r.messages.every((m) => typeof m.content !== 'string' || wellFormed(m.content))), 'every request was valid Unicode')
  t.match(server.requests.at(-1)?.messages.at(-1), { role: 'tool', content: 'cut emoji \uFFFD here' }, 'the half is U+FFFD, as the store keeps it')
})

t.test('Mistral\'s reasoning models stream their content as a list of chunks: thinking is the reasoning, text the answer', async (t) => {
  // magistral-* sends delta.content as [{type: 'thinking', thinking: [{type: 'text', text}]}], then
  // [{type: 'text', text}] or plain strings. Before, the first such chunk failed the run as
  // INVALID_RESPONSE ("delta.content is a list"), as did the same shape in a whole completion.
  const thinking = (text: string) => [{ type: 'thinking', thinking: [{ type: 'text', text }] }]
  const answers: Array<(res: Parameters<ModelAnswer>[0]) => void> = [
    (res) => streamOf(res,
      chunk({ role: 'assistant', content: thinking('The user greets, ') }),
      chunk({ content: thinking('so I greet back.') }),
      chunk({ content: [{ type: 'text', text: 'Hello' }] }),
      chunk({ content: '!' }),
      chunk({}, 'stop'), '[DONE]'),
    (res) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({
      id: 'c', object: 'chat.completion', created: 0, model: 'magistral-medium-2509',
      choices: [{ index: 0, message: { role: 'assistant', content: [...thinking('Again.'), { type: 'text', text: 'Hello again!' }] }, finish_reason: 'stop' }]
    }))
  ]
  const { ctx } = await appWith(t, (res) => answers.shift()?.(res))
  const sessionId = await createSession(ctx, { model: 'magistral-medium-2509', tools: [] })

  const streamed = await sendAndWait(ctx, sessionId, 'hi')
  t.match(streamed.run, { status: 'completed', error: null })
  t.equal(streamed.message.content, 'Hello!')
  const events = await eventsOf(ctx, sessionId, streamed.run.id)
  t.match(events.find((e) => e.type === 'think_chunk_end')?.data, { text: 'The user greets, so I greet back.' })
  t.match(events.find((e) => e.type === 'text_chunk_end')?.data, { text: 'Hello!' })

  const whole = await sendAndWait(ctx, sessionId, 'hi again')
  t.match(whole.run, { status: 'completed', error: null })
  t.equal(whole.message.content, 'Hello again!')
})

t.test('a server that refuses stream_options (Mistral\'s 422 "extra_forbidden") is asked again without it, and not asked with it again', async (t) => {
  // Before, the 422 was UNKNOWN and failed every run: no run could use such a server at all.
  // Its answers then carry no usage, which counts as zero tokens, as for any answer without it.
  const mistralRefusal = {
    object: 'error', type: 'invalid_request_error', param: null, code: null,
    message: { detail: [{ type: 'extra_forbidden', loc: ['body', 'stream_options', 'include_usage'], msg: 'Extra inputs are not permitted', input: true }] }
  }
  let refused = 0
  const { ctx, requests } = await appWith(t, (res, request) => {
    if (request.stream_options !== undefined) {
      refused++
      return errorAnswer(res, 422, mistralRefusal)
    }
    textAnswer(res, `answer ${requests.length}`)
  })
  const sessionId = await createSession(ctx)
  for (const content of ['one', 'two']) {
    const { run, message } = await sendAndWait(ctx, sessionId, content)
    t.match(run, { status: 'completed', error: null }, content)
    t.match(message.content, /^answer/, content)
  }
  t.equal(refused, 1, 'refused once; later calls leave stream_options out')
  t.ok(requests.at(-1)?.stream === true, 'still streamed')
})

t.test('past tool calls go to the model with IDs of 9 letters and digits, the only form Mistral\'s API takes', async (t) => {
  // Mistral's API (and vLLM or other servers with Mistral's tokenizer) refuse any other tool-call
  // ID with a 400 "Tool call id was call_… but must be a-z, A-Z, 0-9, with a length of 9". Before,
  // agentd's own IDs (call_ and 26 characters) went out, and every step after a tool call failed.
  const mistralId = /^[a-zA-Z0-9]{9}$/
  const { ctx, requests } = await appWith(t, (res, request) => {
    const ids = request.messages.flatMap((m) => [
      ...(m.role === 'assistant' ? (m.tool_calls ?? []).map((call) => call.id) : []),
      ...(m.role === 'tool' ? [m.tool_call_id] : [])
    ])
    const bad = ids.find((id) => !mistralId.test(id))
    if (bad !== undefined) {
      return errorAnswer(res, 400, { object: 'error', message: `Tool call id was ${bad} but must be a-z, A-Z, 0-9, with a length of 9.`, type: 'invalid_request_error', param: null, code: null })
    }
    if (request.messages.at(-1)?.role === 'user') {
      return streamOf(res, chunk({ role: 'assistant', tool_calls: [
        { index: 0, id: 'aB3xK9mP2', type: 'function', function: { name: 'fs_list', arguments: '{"path":"."}' } },
        { index: 1, id: 'Qz8wLm4Rt', type: 'function', function: { name: 'fs_list', arguments: '{"path":"."}' } }
      ] }), chunk({}, 'tool_calls'), '[DONE]')
    }
    textAnswer(res, 'listed twice')
  })
  const sessionId = await createSession(ctx, { tools: ['fs_list'] })
  for (const content of ['list', 'again']) {
    const { run, message } = await sendAndWait(ctx, sessionId, content)
    t.match(run, { status: 'completed', error: null, steps: 2 }, content)
    t.equal(message.content, 'listed twice', content)
  }
  const last = requests.at(-1)?.messages ?? []
  const calls = last.flatMap((m) => (m.role === 'assistant' ? (m.tool_calls ?? []).map((call) => call.id) : []))
  const answers = last.flatMap((m) => (m.role === 'tool' ? [m.tool_call_id] : []))
  t.equal(new Set(calls).size, 4, 'four calls, four IDs')
  t.same(answers, calls, 'each answer names its call')
})

t.test('a server that refuses a user message right after tool results (Mistral) is asked again with an assistant turn between them', async (t) => {
  // A run that ends after its tool results, without an answer (here its step limit), leaves the
  // history ending in a tool message. Mistral refuses the next user message after it with a 400
  // "Unexpected role 'user' after role 'tool'": before, every later run of the session failed.
  let refused = 0
  const { ctx, requests } = await appWith(t, (res, request) => {
    const roles = request.messages.map((m) => m.role)
    if (roles.some((role, i) => role === 'user' && roles[i - 1] === 'tool')) {
      refused++
      return errorAnswer(res, 400, { object: 'error', message: "Unexpected role 'user' after role 'tool'", type: 'invalid_request_message_order', param: null, code: '3230' })
    }
    if (request.messages.at(-1)?.content === 'list') {
      return streamOf(res, chunk({ role: 'assistant', tool_calls: [{ index: 0, id: 'aB3xK9mP2', type: 'function', function: { name: 'fs_list', arguments: '{}' } }] }), chunk({}, 'tool_calls'), '[DONE]')
    }
    textAnswer(res, 'answered')
  })
  const sessionId = await createSession(ctx, { tools: ['fs_list'], limits: { maxSteps: 1 } })
  t.match((await sendAndWait(ctx, sessionId, 'list')).run, { status: 'failed', error: { code: 'MAX_STEPS_EXCEEDED' } })
  for (const content of ['and now?', 'once more']) {
    const { run, message } = await sendAndWait(ctx, sessionId, content)
    t.match(run, { status: 'completed', error: null }, content)
    t.equal(message.content, 'answered', content)
  }
  t.equal(refused, 1, 'refused once; later requests bridge the turn at once')
  t.same(requests.at(-1)?.messages.map((m) => m.role), ['user', 'assistant', 'tool', 'assistant', 'user', 'assistant', 'user'])
  const stored = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/messages` })).json().data
  t.same(stored.map((m: { role: string }) => m.role), ['user', 'assistant', 'tool', 'user', 'assistant', 'user', 'assistant'], 'the stored conversation is unchanged')
})

t.test('an empty tool result goes to the model as words saying so: gateways to Anthropic refuse an empty text', async (t) => {
  // LiteLLM, Databricks and other gateways in front of Anthropic's models answer 400 "text content
  // blocks must be non-empty" (or "must contain non-whitespace text") for an empty tool message,
  // such as an MCP tool's empty content or a webhook's "". Before, the run failed, and so did
  // every later run of the session, whose history held the empty result.
  const { ctx, server, sessionId } = await withWebhookTool(t, 'mark', '"  "', (res, request) => {
    if (request.messages.some((m) => m.role === 'tool' && typeof m.content === 'string' && m.content.trim() === '')) {
      return errorAnswer(res, 400, { error: { message: 'litellm.BadRequestError: AnthropicException - messages: text content blocks must contain non-whitespace text', type: 'invalid_request_error', code: 400 } })
    }
    if (request.messages.at(-1)?.role === 'user') {
      return streamOf(res, chunk({ role: 'assistant', tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'mark', arguments: '{}' } }] }), chunk({}, 'tool_calls'), '[DONE]')
    }
    textAnswer(res, 'marked')
  })
  const { run, message } = await sendAndWait(ctx, sessionId, 'mark it')
  t.match(run, { status: 'completed', error: null })
  t.equal(message.content, 'marked')
  t.match(server.requests.at(-1)?.messages.at(-1), { role: 'tool', content: /empty/ })
  const stored = (await ctx.app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/messages` })).json().data
  t.match(stored[2], { role: 'tool', content: '  ' }, 'the stored result is what the tool returned')
})

t.test('blank text before tool calls is not sent back as the answer\'s text: gateways to Anthropic refuse a blank text', async (t) => {
  // Models often stream "\n\n" before their tool calls. Sent back as the assistant message's
  // content, gateways to Anthropic's models answer 400 "text content blocks must contain
  // non-whitespace text": before, the step after the tool calls failed, and so did every later run.
  const blank = (m: { role: string; content?: unknown }) => m.role === 'assistant' && typeof m.content === 'string' && m.content.trim() === ''
  const { ctx } = await appWith(t, (res, request) => {
    if (request.messages.some(blank)) {
      return errorAnswer(res, 400, { error: { message: 'messages: text content blocks must contain non-whitespace text', type: 'invalid_request_error' } })
    }
    if (request.messages.at(-1)?.role === 'user' && request.messages.at(-1)?.content === 'list') {
      return streamOf(res, chunk({ role: 'assistant', content: '\n\n' }),
        chunk({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'fs_list', arguments: '{}' } }] }), chunk({}, 'tool_calls'), '[DONE]')
    }
    if (request.messages.at(-1)?.content === 'blank') return streamOf(res, chunk({ role: 'assistant', content: ' \n' }), chunk({}, 'stop'), '[DONE]')
    textAnswer(res, 'done')
  })
  const sessionId = await createSession(ctx, { tools: ['fs_list'] })
  for (const content of ['list', 'blank', 'and then?']) {
    const { run } = await sendAndWait(ctx, sessionId, content)
    t.match(run, { status: 'completed', error: null }, content)
  }
})

t.test('a model that refuses max_tokens under a name agentd does not know (an Azure deployment, a gateway alias) gets max_completion_tokens', async (t) => {
  // Azure names a model by its deployment, and gateways by their aliases: a reasoning model there
  // is not known by its name. Before, its refusal of max_tokens failed every summary, and every
  // compaction of its sessions fell back to truncation with a warning.
  let refused = 0
  const { ctx, requests } = await appWith(t, (res, request) => {
    if (request.max_tokens !== undefined) {
      refused++
      return errorAnswer(res, 400, {
        error: { message: "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", type: 'invalid_request_error', param: 'max_tokens', code: 'unsupported_parameter' }
      })
    }
    const summarising = typeof request.messages[0]?.content === 'string' && request.messages[0].content.startsWith('You summarise')
    textAnswer(res, summarising ? 'The user talked about a fox.' : 'ok')
  })
  const words = (tag: string) => `${tag}: ${'the quick brown fox jumps over the lazy dog '.repeat(100)}`
  const sessionId = await createSession(ctx, { model: 'prod-reasoner', tools: [], limits: { contextTokens: 1500 } })
  t.equal((await sendAndWait(ctx, sessionId, words('first'))).run.status, 'completed')
  for (const tag of ['second', 'third']) {
    const { run } = await sendAndWait(ctx, sessionId, words(tag))
    t.match(run, { status: 'completed', error: null })
    const events = await eventsOf(ctx, sessionId, run.id)
    t.notOk(events.some((e) => e.type === 'error'), `${tag}: no SUMMARY_FAILED warning`)
    t.match(events.find((e) => e.type === 'context_compacted')?.data, { method: 'summary' }, `${tag}: the older turns were summarised`)
  }
  t.equal(refused, 1, 'refused once; later summaries ask for max_completion_tokens at once')
  t.ok(requests.some((r) => typeof r.max_completion_tokens === 'number'))
})

t.test('a whole completion (no stream) with several tool calls without IDs or indexes runs each of them', async (t) => {
  // Each entry of a whole message's tool_calls is a whole call. Read as stream fragments without
  // an index or an ID, each continued the one before: "fs_list" and "fs_glob" became one call
  // named "fs_listfs_glob", refused as an unknown tool.
  const { ctx } = await appWith(t, (res, request) => {
    if (request.messages.at(-1)?.role !== 'user') return textAnswer(res, 'done')
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({
      id: 'c', object: 'chat.completion', created: 0, model: 'm',
      choices: [{ index: 0, finish_reason: 'tool_calls', message: { role: 'assistant', content: null, tool_calls: [
        { type: 'function', function: { name: 'fs_list', arguments: '{"path":"."}' } },
        { type: 'function', function: { name: 'fs_glob', arguments: '{"pattern":"*"}' } }
      ] } }]
    }))
  })
  const sessionId = await createSession(ctx, { tools: ['fs_list', 'fs_glob'] })
  const { run } = await sendAndWait(ctx, sessionId, 'look')
  t.match(run, { status: 'completed', error: null, steps: 2 })
  const events = await eventsOf(ctx, sessionId, run.id)
  t.same(events.filter((e) => e.type === 'tool:end').map((e) => [e.data.call.name, e.data.call.state]), [['fs_list', 'completed'], ['fs_glob', 'completed']])
})

t.test('a call sent again whole under the next index with its ID (LocalAI) runs once', async (t) => {
  // LocalAI streams a tool call, then the same call, same ID, at the next index. Before, each
  // index was a call of its own: the tool ran twice, a write or a command repeated.
  const call = { id: 'LipwoT0puK4tQY6nxW39FNRyvQ6Hrh8p', type: 'function', function: { name: 'fs_write', arguments: '{"path":"a.txt","content":"once"}' } }
  const { ctx } = await appWith(t, (res, request) => {
    if (request.messages.at(-1)?.role !== 'user') return textAnswer(res, 'written')
    streamOf(res, chunk({ role: 'assistant', tool_calls: [{ index: 0, ...call }] }), chunk({ tool_calls: [{ index: 1, ...call }] }), chunk({}, 'tool_calls'), '[DONE]')
  })
  const sessionId = await createSession(ctx, { tools: ['fs_write'] })
  const { run } = await sendAndWait(ctx, sessionId, 'write')
  t.match(run, { status: 'completed', error: null })
  const events = await eventsOf(ctx, sessionId, run.id)
  t.same(events.filter((e) => e.type === 'tool:end').map((e) => [e.data.call.name, e.data.call.input, e.data.call.state]), [['fs_write', { path: 'a.txt', content: 'once' }, 'completed']])
})

t.test('two different calls that share one ID (a server that gives each the request\'s) both run', async (t) => {
  const call = (path: string) => ({ id: 'chatcmpl-same', type: 'function', function: { name: 'fs_list', arguments: JSON.stringify({ path }) } })
  const { ctx } = await appWith(t, (res, request) => {
    if (request.messages.at(-1)?.role !== 'user') return textAnswer(res, 'listed')
    streamOf(res, chunk({ role: 'assistant', tool_calls: [{ index: 0, ...call('.') }] }), chunk({ tool_calls: [{ index: 1, ...call('./') }] }), chunk({}, 'tool_calls'), '[DONE]')
  })
  const sessionId = await createSession(ctx, { tools: ['fs_list'] })
  const { run } = await sendAndWait(ctx, sessionId, 'list')
  t.match(run, { status: 'completed', error: null })
  const events = await eventsOf(ctx, sessionId, run.id)
  t.same(events.filter((e) => e.type === 'tool:end').map((e) => e.data.call.input), [{ path: '.' }, { path: './' }])
})

t.test('a thinking model that wants its reasoning back with its tool calls (DeepSeek) gets it: the run\'s own, else an empty one', async (t) => {
  // DeepSeek's thinking mode refuses a request whose assistant messages with tool calls lack
  // reasoning_content (400 "Missing `reasoning_content` field in the assistant message at message
  // index 2"). Before, every step after a tool call failed, and every later run of the session.
  let refused = 0
  const { ctx, requests } = await appWith(t, (res, request) => {
    const missing = request.messages.findIndex((m) => m.role === 'assistant' && 'tool_calls' in m && !('reasoning_content' in m))
    if (missing >= 0) {
      refused++
      return errorAnswer(res, 400, { error: { message: `Missing \`reasoning_content\` field in the assistant message at message index ${missing}. For more information, please refer to https://api-docs.deepseek.com/guides/thinking_mode#tool-calls`, type: 'invalid_request_error', param: null, code: 'invalid_request_error' } })
    }
    if (request.messages.at(-1)?.role === 'user' && request.messages.at(-1)?.content === 'list') {
      return streamOf(res, chunk({ role: 'assistant', reasoning_content: 'I should list the folder.' }),
        chunk({ tool_calls: [{ index: 0, id: 'call_00_x', type: 'function', function: { name: 'fs_list', arguments: '{}' } }] }), chunk({}, 'tool_calls'), '[DONE]')
    }
    textAnswer(res, 'listed')
  })
  const sessionId = await createSession(ctx, { model: 'deepseek-v4-pro', tools: ['fs_list'] })
  for (const content of ['list', 'and now?']) {
    const { run } = await sendAndWait(ctx, sessionId, content)
    t.match(run, { status: 'completed', error: null }, content)
  }
  t.equal(refused, 1, 'refused once; later requests carry the reasoning at once')
  const sent = (i: number) => (requests.at(i)?.messages ?? []).find((m) => m.role === 'assistant' && 'tool_calls' in m) as { reasoning_content?: string } | undefined
  t.equal(sent(-2)?.reasoning_content, 'I should list the folder.', 'within the run, its own reasoning')
  t.equal(sent(-1)?.reasoning_content, '', 'in a later run, an empty one: the reasoning is not stored')
})
