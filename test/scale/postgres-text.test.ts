import t from 'tap'
import { fromPgText, toPgText } from '../../src/store/postgres-text.ts'
import { startCluster } from '../helpers/cluster.ts'

// JSON strings may carry NUL (U+0000); PostgreSQL's text may not. Through agentd on PostgreSQL a
// client gets back what it sent and what the model and the tools said, as it does on SQLite.
t.test('text with NUL characters, on PostgreSQL, from the client, the model and a tool call', async (t) => {
  const cluster = await startCluster(t, 2)
  const [a, b] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel, eventOf } = cluster

  const created = await api(a, 'POST', '/v1/sessions', { instructions: 'be\u0000brief', metadata: { note: 'x\u0000y' } })
  t.equal(created.status, 201, 'instructions with a NUL make a session (it was a 500)')
  const id = created.json.id
  t.match((await api(b, 'GET', `/v1/sessions/${id}`)).json, { instructions: 'be\u0000brief', metadata: { note: 'x\u0000y' } }, 'another process reads them back')

  // The model answers with a tool it names with a NUL (no such tool), then with a text holding one.
  devModel.script({ toolCalls: [{ name: 'fs\u0000list', arguments: { path: '\u0000' } }] }, { text: 'done\u0000here' })
  const posted = await api(a, 'POST', `/v1/sessions/${id}/messages`, { content: 'hi\u0000there' })
  t.equal(posted.status, 202, 'a message with a NUL is accepted (it was a 500)')
  const done = await eventOf(b, id, (e) => e.type === 'done')
  t.equal(done.data.reason, 'completed', 'the run completes: nothing it stores is refused')
  const messages = (await api(b, 'GET', `/v1/sessions/${id}/messages`)).json.data
  t.match(messages, [
    { role: 'user', content: 'hi\u0000there' },
    { role: 'assistant', toolCalls: [{ name: 'fs\u0000list' }] },
    { role: 'tool' },
    { role: 'assistant', content: 'done\u0000here' }
  ], 'the conversation as it was said')
  const calls = (await api(b, 'GET', `/v1/sessions/${id}/tool-calls`)).json.data
  t.match(calls, [{ name: 'fs\u0000list', input: { path: '\u0000' }, state: 'failed' }], 'the unknown tool failed as a tool call, under its name')
  t.match((await api(b, 'GET', `/v1/sessions/${id}/runs/${posted.json.run.id}`)).json, { status: 'completed' })

  const fork = await api(b, 'POST', `/v1/sessions/${id}/fork`, {})
  t.equal(fork.status, 201)
  t.match((await api(a, 'GET', `/v1/sessions/${fork.json.id}/messages`)).json.data.map((m: { content: string | null }) => m.content),
    ['hi\u0000there', null, /./, 'done\u0000here'], 'a fork copies it')
})

t.test('how the PostgreSQL store writes such text', async (t) => {
  for (const text of ['', 'plain', '"quoted"', 'a\u0000b', '\u0000', '\u0001', '\u0001"x"', '\u0001plain', 'é\u0000🦀']) {
    const written = toPgText(text)
    t.notOk(written.includes('\u0000'), `${JSON.stringify(text)}: no NUL reaches the server`)
    t.equal(fromPgText(written), text, `${JSON.stringify(text)}: read back as written`)
  }
  t.equal(toPgText('plain "text" \\ here'), 'plain "text" \\ here', 'text without a NUL or a leading U+0001 is written unchanged')
  t.equal(fromPgText('\u0001not json'), '\u0001not json', 'a value from before that begins with U+0001 is read as it is')
  t.equal(fromPgText('\u00011'), '\u00011', 'also when the rest is JSON but not a string')
})
