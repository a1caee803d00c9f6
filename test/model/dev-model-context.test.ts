import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { SUMMARY_INSTRUCTIONS } from '../../src/agent/context/summariser.ts'
import { startDevModel, type DevModel } from '../../src/model/dev-model.ts'
import { createOpenAIProvider } from '../../src/model/provider.ts'
import { ModelError } from '../../src/model/types.ts'

async function devModelFor(t: { teardown(fn: () => unknown): void }, contextLimit?: number): Promise<DevModel> {
  const devModel = await startDevModel({ port: 0, ...(contextLimit === undefined ? {} : { contextLimit }) })
  t.teardown(() => devModel.close())
  return devModel
}

const chat = (url: string, content: string) =>
  fetch(`${url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'dev-model', messages: [{ role: 'user', content }] })
  })

t.test('a request longer than its context limit gets OpenAI\'s 400 context_length_exceeded, and takes no scripted step', async (t) => {
  const devModel = await devModelFor(t, 20)
  devModel.script({ text: 'scripted' })
  const res = await chat(devModel.url, 'word '.repeat(40))
  t.equal(res.status, 400)
  t.match(await res.json() as object, {
    error: { type: 'invalid_request_error', code: 'context_length_exceeded', param: 'messages', message: /^This model's maximum context length is 20 tokens\. However, your messages resulted in \d+ tokens/ }
  })
  const short = await chat(devModel.url, 'hi')
  t.equal((await short.json() as { choices: Array<{ message: { content: string } }> }).choices[0]?.message.content, 'scripted', 'the scripted step went to the next request that fits')
  devModel.setContextLimit(null)
  t.equal((await chat(devModel.url, 'word '.repeat(40))).status, 200, 'null lifts the limit')
})

t.test('the provider classifies that refusal as CONTEXT_LENGTH_EXCEEDED, not retryable', async (t) => {
  const devModel = await devModelFor(t, 20)
  const provider = createOpenAIProvider({ kind: 'dev', apiKey: 'k', baseURL: devModel.url })
  t.teardown(() => provider.close())
  const parts = provider.stream({ model: 'dev-model', messages: [{ role: 'user', content: 'word '.repeat(40) }] }, { signal: new AbortController().signal, requestId: 'req_1' })
  const error = await (async () => {
    try {
      for await (const part of parts) void part
    } catch (err) {
      return err
    }
    return null
  })()
  t.ok(error instanceof ModelError)
  t.match((error as ModelError).classified, { code: 'CONTEXT_LENGTH_EXCEEDED', errorType: 'runtime', retryable: false, detail: { status: 400, providerCode: 'context_length_exceeded' } })
})

t.test('agentd\'s summary request gets a short summary of what the user said', async (t) => {
  const devModel = await devModelFor(t)
  const transcript = ['user: first ask about the build', 'assistant: You said: first ask', 'user: ' + 'then a very long question '.repeat(50)].join('\n')
  const res = await fetch(`${devModel.url}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'dev-model', messages: [{ role: 'system', content: SUMMARY_INSTRUCTIONS }, { role: 'user', content: `Summarise:\n\n${transcript}` }] })
  })
  const body = await res.json() as { choices: Array<{ message: { content: string } }> }
  const text = body.choices[0]?.message.content ?? ''
  t.match(text, /^Summary: the user said first ask about the build; then a very long question/)
  t.ok(text.length <= 600)
})

t.test('run standalone, DEV_MODEL_CONTEXT_TOKENS sets the limit and a bad value stops it with one line', async (t) => {
  const script = fileURLToPath(new URL('../../src/model/dev-model.ts', import.meta.url))
  const bad = spawn(process.execPath, [script], { env: { ...process.env, DEV_MODEL_PORT: '0', DEV_MODEL_CONTEXT_TOKENS: 'lots' }, stdio: ['ignore', 'ignore', 'pipe'] })
  let err = ''
  bad.stderr.setEncoding('utf8').on('data', (chunk: string) => { err += chunk })
  t.equal((await once(bad, 'exit'))[0], 1)
  t.equal(err, 'DEV_MODEL_CONTEXT_TOKENS: expected a positive integer of tokens, got "lots"\n')

  const child = spawn(process.execPath, [script], { env: { ...process.env, DEV_MODEL_PORT: '0', DEV_MODEL_CONTEXT_TOKENS: '20' }, stdio: ['ignore', 'pipe', 'inherit'] })
  t.teardown(() => {
    child.kill()
  })
  let out = ''
  child.stdout.setEncoding('utf8')
  while (!/\/v1\n/.test(out)) {
    const [chunk] = (await once(child.stdout, 'data')) as [string]
    out += chunk
  }
  const url = /(http:\/\/\S+\/v1)/.exec(out)?.[1] ?? ''
  t.equal((await chat(url, 'word '.repeat(40))).status, 400)
  t.equal((await chat(url, 'hi')).status, 200)
})
