import t from 'tap'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { fileURLToPath } from 'node:url'
import { startDevModel, type DevModel } from '../../src/model/dev-model.ts'

async function devModelFor(t: { teardown(fn: () => unknown): void }): Promise<DevModel> {
  const devModel = await startDevModel({ port: 0 })
  t.teardown(() => devModel.close())
  return devModel
}

function chat(devModel: DevModel, body: Record<string, unknown>, headers: Record<string, string> = {}) {
  return fetch(`${devModel.url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'dev-model', ...body })
  })
}

// Response bodies are checked with t.match/t.same, so they need no static type.
const json = (res: Response): Promise<any> => res.json()

/** The `data:` payloads of an SSE body, in order. */
async function sseData(res: Response): Promise<string[]> {
  const text = await res.text()
  return text
    .split('\n\n')
    .filter((frame) => frame.startsWith('data: '))
    .map((frame) => frame.slice('data: '.length))
}

const user = (content: string) => ({ messages: [{ role: 'user', content }] })
const tools = [{ type: 'function', function: { name: 'fs_read', parameters: { type: 'object' } } }]

t.test('the request log keeps the latest requests only, so a long-running dev model does not grow without end', async (t) => {
  const devModel = await startDevModel({ port: 0, requestLog: 3 })
  t.teardown(() => devModel.close())
  for (let i = 1; i <= 5; i++) await (await chat(devModel, user(`question ${i}`))).text()
  t.same(devModel.requests.map((r) => r.body.messages[0]?.content), ['question 3', 'question 4', 'question 5'], 'the three latest, oldest first')
  const logged = await json(await fetch(devModel.url.replace(/\/v1$/, '/__dev/requests')))
  t.equal(logged.data.length, 3, 'GET /__dev/requests answers the same')
})

t.test('a stream is OpenAI-shaped: role first, content deltas, finish chunk, usage chunk, [DONE]', async (t) => {
  const devModel = await devModelFor(t)
  devModel.script({ text: 'a b c' })
  const res = await chat(devModel, { ...user('hi'), stream: true, stream_options: { include_usage: true } })
  t.equal(res.status, 200)
  t.match(res.headers.get('content-type'), /^text\/event-stream/)
  const data = await sseData(res)
  t.equal(data.at(-1), '[DONE]')
  const chunks = data.slice(0, -1).map((d) => JSON.parse(d))
  t.ok(chunks.every((c) => c.object === 'chat.completion.chunk' && c.model === 'dev-model' && c.id === chunks[0].id))
  t.same(chunks.slice(0, 3).map((c) => c.choices[0].delta), [{ role: 'assistant', content: 'a ' }, { content: 'b ' }, { content: 'c' }])
  t.match(chunks[3].choices[0], { delta: {}, finish_reason: 'stop' })
  t.same(chunks[4].choices, [])
  t.match(chunks[4].usage, { prompt_tokens: Number, completion_tokens: Number, total_tokens: Number })
  t.equal(chunks.length, 5)
})

t.test('without include_usage the stream carries no usage chunk', async (t) => {
  const devModel = await devModelFor(t)
  const data = await sseData(await chat(devModel, { ...user('hi'), stream: true }))
  t.notOk(data.slice(0, -1).some((d) => 'usage' in JSON.parse(d)))
})

t.test('a non-streaming request gets one chat.completion with usage', async (t) => {
  const devModel = await devModelFor(t)
  devModel.script({ toolCalls: [{ id: 'call_1', name: 'fs_read', arguments: { path: 'a.txt' } }] })
  const res = await chat(devModel, { ...user('read it'), tools })
  const body = await json(res)
  t.match(body, {
    object: 'chat.completion',
    choices: [
      {
        finish_reason: 'tool_calls',
        message: { role: 'assistant', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'fs_read', arguments: '{"path":"a.txt"}' } }] }
      }
    ],
    usage: { total_tokens: Number }
  })
})

t.test('tool calls stream the OpenAI way: id and name first, argument fragments after', async (t) => {
  const devModel = await devModelFor(t)
  devModel.script({ toolCalls: [{ name: 'fs_read', arguments: { path: 'notes/long-file-name.txt' } }] })
  const data = await sseData(await chat(devModel, { ...user('x'), tools, stream: true }))
  const calls = data.slice(0, -1).flatMap((d) => JSON.parse(d).choices[0]?.delta.tool_calls ?? [])
  t.match(calls[0], { index: 0, id: /^call_/, type: 'function', function: { name: 'fs_read', arguments: '' } })
  t.ok(calls.length > 2, 'arguments come in several fragments')
  t.ok(calls.slice(1).every((c: { id?: string; function: { name?: string } }) => c.id === undefined && c.function.name === undefined))
  t.equal(calls.map((c: { function: { arguments: string } }) => c.function.arguments).join(''), '{"path":"notes/long-file-name.txt"}')
})

t.test('by default it echoes the user in several chunks', async (t) => {
  const devModel = await devModelFor(t)
  const data = await sseData(await chat(devModel, { ...user('how are you'), stream: true }))
  const text = data.slice(0, -1).map((d) => JSON.parse(d).choices[0]?.delta.content ?? '')
  t.equal(text.join(''), 'You said: how are you')
  t.ok(text.filter(Boolean).length > 1)
})

t.test('by default "call <tool> {json}" becomes a tool call, but only for a tool the request offers', async (t) => {
  const devModel = await devModelFor(t)
  const offered = await json(await chat(devModel, { ...user('please call fs_read {"path": "a {b}.txt"} now'), tools }))
  t.same(offered.choices[0].message.tool_calls.map((c: { function: unknown }) => c.function), [
    { name: 'fs_read', arguments: '{"path":"a {b}.txt"}' }
  ])
  const notOffered = await json(await chat(devModel, { ...user('call fs_write {"path": "x"}'), tools }))
  t.equal(notOffered.choices[0].message.content, 'You said: call fs_write {"path": "x"}')
  t.notOk(notOffered.choices[0].message.tool_calls)
})

t.test('by default a tool result is answered with a short summary of it', async (t) => {
  const devModel = await devModelFor(t)
  const res = await chat(devModel, {
    messages: [
      { role: 'user', content: 'call fs_read {}' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'fs_read', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'x'.repeat(300) }
    ],
    tools
  })
  const content: string = (await json(res)).choices[0].message.content
  t.match(content, /^Tool fs_read returned: x+…$/)
  t.ok(content.length < 250, 'long results are shortened')
})

t.test('scripted steps are used once each, in order, then the default comes back', async (t) => {
  const devModel = await devModelFor(t)
  devModel.script({ text: 'first' }, { status: 503 }, { text: 'third' })
  const answers = []
  for (let i = 0; i < 4; i++) {
    const res = await chat(devModel, user('hi'))
    answers.push(res.status === 200 ? (await json(res)).choices[0].message.content : res.status)
  }
  t.same(answers, ['first', 503, 'third', 'You said: hi'])
})

t.test('an error step sends an OpenAI error body, or the given body verbatim, with its headers', async (t) => {
  const devModel = await devModelFor(t)
  devModel.script({ status: 429, headers: { 'retry-after-ms': '50' } }, { status: 400, body: { error: { message: 'm', type: 't', code: 'c' }, extra: 1 } })
  const limited = await chat(devModel, user('hi'))
  t.equal(limited.status, 429)
  t.equal(limited.headers.get('retry-after-ms'), '50')
  t.match(await json(limited), { error: { message: String, type: String, code: 'rate_limit_exceeded' } })
  const custom = await chat(devModel, user('hi'))
  t.same(await json(custom), { error: { message: 'm', type: 't', code: 'c' }, extra: 1 })
})

t.test('delayMs holds the answer back', async (t) => {
  const devModel = await devModelFor(t)
  devModel.script({ delayMs: 120, text: 'late' })
  const started = Date.now()
  const res = await chat(devModel, user('hi'))
  t.equal((await json(res)).choices[0].message.content, 'late')
  t.ok(Date.now() - started >= 110)
})

t.test('the request log keeps every body and its headers, including X-Request-Id', async (t) => {
  const devModel = await devModelFor(t)
  await (await chat(devModel, user('one'), { 'x-request-id': 'abc-1' })).text()
  const res = await chat(devModel, user('two'))
  await res.text()
  t.equal(devModel.requests.length, 2)
  t.equal(devModel.requests[0]?.headers['x-request-id'], 'abc-1')
  t.same(devModel.requests[1]?.body.messages, [{ role: 'user', content: 'two' }])
  t.match(res.headers.get('x-request-id'), /^req_dev_/)
})

t.test('an invalid request gets an OpenAI-style 400 and is not logged', async (t) => {
  const devModel = await devModelFor(t)
  const res = await fetch(`${devModel.url}/chat/completions`, { method: 'POST', body: '{nope' })
  t.equal(res.status, 400)
  t.match(await json(res), { error: { type: 'invalid_request_error' } })
  const noMessages = await chat(devModel, {})
  t.equal(noMessages.status, 400)
  t.equal(devModel.requests.length, 0)
})

t.test('it can be scripted, read and reset over HTTP', async (t) => {
  const devModel = await devModelFor(t)
  const root = devModel.url.replace(/\/v1$/, '')
  const scripted = await fetch(`${root}/__dev/script`, { method: 'POST', body: JSON.stringify([{ text: 'over http' }, { status: 500 }]) })
  t.equal(scripted.status, 200)
  t.same(await json(scripted), { queued: 2 })
  t.equal((await json(await chat(devModel, user('a'), { 'x-request-id': 'r1' }))).choices[0].message.content, 'over http')

  const log = await json(await fetch(`${root}/__dev/requests`))
  t.match(log.data, [{ body: { messages: [{ content: 'a' }] }, headers: { 'x-request-id': 'r1' } }])

  t.equal((await fetch(`${root}/__dev/reset`, { method: 'POST' })).status, 204)
  t.equal(devModel.requests.length, 0)
  const afterReset = await chat(devModel, user('b'))
  t.equal(afterReset.status, 200, 'the queued 500 was dropped by the reset')
  await afterReset.text()

  const notSteps = await fetch(`${root}/__dev/script`, { method: 'POST', body: JSON.stringify([1, 2]) })
  t.equal(notSteps.status, 400)
  const notJson = await fetch(`${root}/__dev/script`, { method: 'POST', body: '[{' })
  t.equal(notJson.status, 400)
})

t.test('close() does not wait for a hanging request', async (t) => {
  const devModel = await startDevModel({ port: 0 })
  devModel.script({ hang: true })
  const pending = chat(devModel, user('hi')).then(
    () => 'answered',
    () => 'failed'
  )
  while (devModel.requests.length === 0) await new Promise((resolve) => setTimeout(resolve, 5))
  await devModel.close()
  t.equal(await pending, 'failed')
})

t.test('run standalone, it listens on DEV_MODEL_PORT and prints its URL', async (t) => {
  const script = fileURLToPath(new URL('../../src/model/dev-model.ts', import.meta.url))
  const child = spawn(process.execPath, [script], { env: { ...process.env, DEV_MODEL_PORT: '0' }, stdio: ['ignore', 'pipe', 'inherit'] })
  t.teardown(() => {
    child.kill()
  })
  let out = ''
  child.stdout.setEncoding('utf8')
  while (!/\/v1\n/.test(out)) {
    const [chunk] = (await once(child.stdout, 'data')) as [string]
    out += chunk
  }
  const url = /(http:\/\/\S+\/v1)/.exec(out)?.[1]
  t.ok(url, `printed ${out.trim()}`)
  const res = await fetch(`${url}/chat/completions`, { method: 'POST', body: JSON.stringify(user('standalone')) })
  t.equal((await json(res)).choices[0].message.content, 'You said: standalone')
  child.kill('SIGTERM')
  const [code] = await once(child, 'exit')
  t.equal(code, 0, 'exits cleanly on SIGTERM')
})
