import { once } from 'node:events'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import t from 'tap'
import type { DevModel } from '../../src/model/dev-model.ts'
import { buildTestApp } from '../helpers/app.ts'

// A provider that reports absurd token counts (any safe integer is taken as a count): two answers
// took the session's total past 2^53, which SQLite stored and node:sqlite then refused to read.
t.test('a session whose model reports huge token counts stays readable, its totals stopping at 2^53 - 1', async (t) => {
  const huge = Number.MAX_SAFE_INTEGER - 10
  const server = createServer((req, res) => {
    req.resume()
    req.on('end', () => {
      const chunk = (fields: object) => `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 0, model: 'm', ...fields })}\n\n`
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.end(chunk({ choices: [{ index: 0, delta: { role: 'assistant', content: 'hi' }, finish_reason: null }] }) +
        chunk({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }) +
        chunk({ choices: [], usage: { prompt_tokens: huge, completion_tokens: huge, total_tokens: huge } }) + 'data: [DONE]\n\n')
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => new Promise((resolve) => server.close(resolve)))
  const model = { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1` } as DevModel
  const { app } = await buildTestApp(t, { devModel: model })

  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  for (const content of ['one', 'two']) {
    const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content } })
    t.equal(res.json().run.status, 'completed')
  }
  const read = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })
  t.equal(read.statusCode, 200, 'the session is read (it was a 500 for good, as was the listing)')
  const most = Number.MAX_SAFE_INTEGER
  t.same(read.json().usage, { inputTokens: most, outputTokens: most, totalTokens: most })
  t.equal((await app.inject({ method: 'GET', url: '/v1/sessions' })).statusCode, 200)
  t.equal((await app.inject({ method: 'DELETE', url: `/v1/sessions/${session.id}` })).statusCode, 204, 'and can be deleted')
})
