import t from 'tap'
import { buildTestApp } from '../helpers/app.ts'

t.test('?wait=true answers when the run pauses for an approval, with the call to answer', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { approval: { mode: 'always' } } })).json()
  devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }] }, { text: 'listed' })
  const paused = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'list' } })
  t.equal(paused.statusCode, 200)
  const body = paused.json()
  t.equal(body.run.status, 'awaiting_approval')
  t.match(body.pendingCall, { name: 'fs_list', state: 'approval_required', input: { path: '.' } })
  const decided = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/approvals/${body.pendingCall.id}`, payload: { decision: 'allow' } })
  t.equal(decided.statusCode, 200)
  t.match(await app.agentd.runs.waitFor(session.id, body.run.id), { status: 'completed' })
})

t.test('?wait=true answers when the run waits for a client tool, with the call to answer', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const tools = [{ type: 'client', name: 'ask_user', description: 'ask the user', parameters: { type: 'object', properties: { q: { type: 'string' } } } }]
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools } })).json()
  devModel.script({ toolCalls: [{ name: 'ask_user', arguments: { q: 'colour?' } }] }, { text: 'blue it is' })
  const paused = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'pick' } })).json()
  t.equal(paused.run.status, 'awaiting_tool_result')
  t.match(paused.pendingCall, { name: 'ask_user', state: 'executing', input: { q: 'colour?' } })
  t.equal(paused.message?.toolCalls?.[0]?.id, paused.pendingCall.id, 'the message so far is the one that made the call')
  const sent = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/tool-results/${paused.pendingCall.id}`, payload: { output: 'blue' } })
  t.equal(sent.statusCode, 200)
  const finished = await app.agentd.runs.waitFor(session.id, paused.run.id)
  t.equal(finished?.status, 'completed')
})
