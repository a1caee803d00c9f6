import t from 'tap'
import { startCluster } from '../helpers/cluster.ts'
import { readSse } from '../helpers/sse.ts'

/** Three real processes on one database; each request goes to a different one. */
t.test('three processes on one PostgreSQL: any process takes any request', async (t) => {
  const cluster = await startCluster(t, 3)
  const [a, b, c] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel, eventOf } = cluster

  t.test('every process reports the PostgreSQL store and an owner id of its own', async (t) => {
    const ready = await Promise.all([a, b, c].map(async (server) => (await api(server, 'GET', '/readyz')).json))
    t.same(ready.map((r) => r.store), ['postgres', 'postgres', 'postgres'])
    t.equal(new Set(ready.map((r) => r.owner)).size, 3)
  })

  t.test('a session made on A, streamed from B, answered through C: B sees every event in order; A resumes with no gap', async (t) => {
    const session = (await api(a, 'POST', '/v1/sessions', {})).json
    const streamed = readSse(`${b.url}/v1/sessions/${session.id}/events?until=done`, { timeoutMs: 15_000 })
    // Give B's stream a moment to subscribe: whatever it misses it replays, but this makes the live path carry the events.
    await new Promise((r) => setTimeout(r, 200))
    devModel.script({ text: 'one two three four five six seven eight', delayMs: 50 })
    const posted = await api(c, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'hi' })
    t.equal(posted.status, 202)
    const seen = await streamed
    t.ok(seen.endedByServer, "B's stream ended after done")
    const seqs = seen.events.map((e) => e.seq)
    t.same(seqs, seqs.map((_, i) => i + 1), 'every event, in order, once')
    t.equal(seen.events.at(-1)?.type, 'done')
    t.equal(seen.events.filter((e) => e.type === 'text_chunk').length, 8)
    const resumed = await readSse(`${a.url}/v1/sessions/${session.id}/events?until=done`, { headers: { 'last-event-id': '3' }, timeoutMs: 10_000 })
    t.same(resumed.events.map((e) => e.seq), seqs.slice(3), 'the rest after Last-Event-ID, no gap, no repeat')
  })

  t.test('interrupt through A a run that B owns', async (t) => {
    const session = (await api(a, 'POST', '/v1/sessions', {})).json
    devModel.script({ hang: true, afterChunks: 1 })
    const { run } = (await api(b, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'hang' })).json
    await eventOf(a, session.id, (e) => e.type === 'text_chunk', 10_000, 'the run streaming')
    const busy = await api(c, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'me too' })
    t.equal(busy.status, 409, 'another process sees the session busy')
    t.match(busy.json.error, { code: 'SESSION_BUSY', details: { activeRunId: run.id } })
    const interrupted = await api(a, 'POST', `/v1/sessions/${session.id}/interrupt`)
    t.equal(interrupted.status, 202)
    t.match(interrupted.json, { id: run.id, status: 'cancelled' })
    const done = await eventOf(c, session.id, (e) => e.type === 'done')
    t.equal(done.data.reason, 'interrupted')
    t.equal((await api(c, 'POST', `/v1/sessions/${session.id}/interrupt`)).status, 409, 'nothing left to interrupt')
  })

  t.test('approve through C a call waiting on A', async (t) => {
    const session = (await api(a, 'POST', '/v1/sessions', { approval: { mode: 'always' } })).json
    devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }] }, { text: 'listed' })
    const { run } = (await api(a, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'list' })).json
    const required = await eventOf(b, session.id, (e) => e.type === 'permission_required')
    const callId = required.data.call.id
    t.equal((await api(c, 'POST', `/v1/sessions/${session.id}/approvals/call_nope`, { decision: 'allow' })).status, 409, 'an unknown call is not awaiting')
    const approved = await api(c, 'POST', `/v1/sessions/${session.id}/approvals/${callId}`, { decision: 'allow' })
    t.equal(approved.status, 200)
    await eventOf(b, session.id, (e) => e.type === 'done')
    t.equal((await api(b, 'GET', `/v1/sessions/${session.id}/runs/${run.id}`)).json.status, 'completed')
    const again = await api(b, 'POST', `/v1/sessions/${session.id}/approvals/${callId}`, { decision: 'deny' })
    t.equal(again.status, 409, 'a decided call is not awaiting any more')
    t.equal(again.json.error.code, 'NOT_AWAITING')
  })

  t.test('a client tool result posted through B reaches the run on C', async (t) => {
    const spec = { type: 'client', name: 'ask', description: 'Ask the user', parameters: { type: 'object' } }
    const session = (await api(a, 'POST', '/v1/sessions', { tools: [spec] })).json
    devModel.script({ toolCalls: [{ name: 'ask', arguments: {} }] }, { text: 'thanks' })
    const { run } = (await api(c, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'ask me' })).json
    const required = await eventOf(a, session.id, (e) => e.type === 'tool_result_required')
    const answered = await api(b, 'POST', `/v1/sessions/${session.id}/tool-results/${required.data.call.id}`, { output: { answer: 42 } })
    t.equal(answered.status, 200)
    await eventOf(a, session.id, (e) => e.type === 'done')
    t.equal((await api(a, 'GET', `/v1/sessions/${session.id}/runs/${run.id}`)).json.status, 'completed')
  })

  t.test('?wait=true through A answers when a run that B executes has finished', async (t) => {
    const session = (await api(a, 'POST', '/v1/sessions', {})).json
    devModel.script({ text: 'first', delayMs: 400 }, { text: 'second answer' })
    const first = (await api(b, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'one' })).json.run
    await eventOf(a, session.id, (e) => e.type === 'state_changed' && e.data.to === 'running')
    // Queued behind B's run: B claims it when its first run ends, and A waits for it.
    const waited = await api(a, 'POST', `/v1/sessions/${session.id}/messages?wait=true`, { content: 'two', onBusy: 'enqueue' })
    t.equal(waited.status, 200)
    t.equal(waited.json.run.status, 'completed')
    t.equal(waited.json.message.content, 'second answer')
    t.equal((await api(c, 'GET', `/v1/sessions/${session.id}/runs/${first.id}`)).json.status, 'completed')
  })

  t.test('deleting a session through A ends its stream on B', async (t) => {
    const session = (await api(a, 'POST', '/v1/sessions', {})).json
    const streamed = readSse(`${b.url}/v1/sessions/${session.id}/events`, { timeoutMs: 10_000 })
    await new Promise((r) => setTimeout(r, 200))
    t.equal((await api(a, 'DELETE', `/v1/sessions/${session.id}`)).status, 204)
    const ended = await streamed
    t.ok(ended.endedByServer, "B's stream ended when the session was deleted on A")
  })

  t.test('20 messages with onBusy enqueue spread over three processes run one at a time, none lost', async (t) => {
    const session = (await api(a, 'POST', '/v1/sessions', {})).json
    const servers = [a, b, c]
    const accepted = await Promise.all(Array.from({ length: 20 }, (_, i) =>
      api(servers[i % 3]!, 'POST', `/v1/sessions/${session.id}/messages`, { content: `m${i}`, onBusy: 'enqueue' })))
    t.same(accepted.map((r) => r.status), Array(20).fill(202))
    const runIds = new Set(accepted.map((r) => r.json.run.id as string))
    const events = await cluster.until(async () => {
      const all = await cluster.events(b, session.id)
      return all.filter((e) => e.type === 'done').length === 20 ? all : undefined
    }, 60_000, '20 runs done')
    t.same(events.map((e) => e.seq), events.map((_, i) => i + 1), 'seq gap-free, no duplicate across processes')
    // One at a time: the events of a run are contiguous, from its first event to its done.
    const order: string[] = []
    for (const e of events) if (e.runId && order.at(-1) !== e.runId) order.push(e.runId)
    t.equal(order.length, 20, 'no two runs interleave')
    t.same(new Set(order), runIds, 'every accepted run ran')
    const dones = events.filter((e) => e.type === 'done')
    t.ok(dones.every((e) => e.data.reason === 'completed'))
  })

  t.test('12 messages with onBusy reject sent at once through three processes: exactly one run is accepted', async (t) => {
    const session = (await api(a, 'POST', '/v1/sessions', {})).json
    devModel.script({ text: 'the one that got in', delayMs: 300 })
    const servers = [a, b, c]
    const answers = await Promise.all(Array.from({ length: 12 }, (_, i) =>
      api(servers[i % 3]!, 'POST', `/v1/sessions/${session.id}/messages`, { content: `m${i}` })))
    const accepted = answers.filter((r) => r.status === 202)
    t.equal(accepted.length, 1, 'one admission saw the session idle; every other one saw its run')
    const refused = answers.filter((r) => r.status === 409)
    t.equal(refused.length, 11)
    t.ok(refused.every((r) => r.json.error.code === 'SESSION_BUSY' && r.json.error.details.activeRunId === accepted[0]?.json.run.id),
      'each refusal names the run that got in')
    const events = await cluster.until(async () => {
      const all = await cluster.events(a, session.id)
      return all.some((e) => e.type === 'done') ? all : undefined
    }, 10_000, 'the run done')
    t.same(new Set(events.filter((e) => e.runId).map((e) => e.runId)), new Set([accepted[0]?.json.run.id]), 'no refused message left a run')
  })

  t.test('messages accepted one after another through different processes run in the order accepted', async (t) => {
    const session = (await api(a, 'POST', '/v1/sessions', {})).json
    devModel.script({ text: 'slow', delayMs: 300 })
    const ids: string[] = []
    for (let i = 0; i < 6; i++) {
      ids.push((await api([a, b, c][i % 3]!, 'POST', `/v1/sessions/${session.id}/messages`, { content: `m${i}`, onBusy: 'enqueue' })).json.run.id)
    }
    const events = await cluster.until(async () => {
      const all = await cluster.events(c, session.id)
      return all.filter((e) => e.type === 'done').length === 6 ? all : undefined
    }, 30_000, '6 runs done')
    t.same(events.filter((e) => e.type === 'done').map((e) => e.runId), ids)
  })
})

t.test('a burst of messages to many sessions of one tenant through three processes: the active-run limit holds exactly', async (t) => {
  const cluster = await startCluster(t, 3, { AGENTD_MAX_ACTIVE_RUNS_PER_TENANT: '4' })
  const { api, devModel } = cluster
  const servers = cluster.servers
  const sessions: string[] = []
  for (let i = 0; i < 12; i++) sessions.push((await api(servers[i % 3]!, 'POST', '/v1/sessions', { tools: [] })).json.id)
  devModel.script(...Array.from({ length: 12 }, () => ({ text: 'slow', delayMs: 500 })))
  // Twelve admissions at once, none of the tenant's runs active yet: far from the limit as each one starts.
  const answers = await Promise.all(sessions.map((id, i) => api(servers[i % 3]!, 'POST', `/v1/sessions/${id}/messages`, { content: `m${i}` })))
  t.equal(answers.filter((r) => r.status === 202).length, 4, 'four runs accepted')
  const refused = answers.filter((r) => r.status !== 202)
  t.equal(refused.length, 8)
  t.ok(refused.every((r) => r.status === 429 && r.json.error.code === 'LIMIT_EXCEEDED' && r.json.error.details.limit === 'activeRunsPerTenant'),
    'the others: 429 LIMIT_EXCEEDED')
})
