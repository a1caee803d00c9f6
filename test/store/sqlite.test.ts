import { join } from 'node:path'
import t from 'tap'
import { SqliteStore } from '../../src/store/sqlite.ts'
import { tempDir } from '../helpers/app.ts'

t.test('idempotency records are kept for their retention and then forgotten', async (t) => {
  const store = new SqliteStore(join(tempDir(t), 'agentd.db'))
  t.teardown(() => store.close())
  await store.migrate()
  const claim = { tenant: 'a', key: 'k1', fingerprint: 'f1', createdAt: new Date(Date.now() - 25 * 3600_000).toISOString() }
  t.same(await store.claimIdempotency(claim), { state: 'claimed' })
  await store.completeIdempotency('a', 'k1', { status: 201, body: { id: 1 } })
  t.same(await store.claimIdempotency({ ...claim, createdAt: new Date().toISOString() }), { state: 'completed', status: 201, body: { id: 1 } })
  t.same(await store.claimIdempotency({ ...claim, tenant: 'b', createdAt: new Date().toISOString() }), { state: 'claimed' }, 'another tenant has its own keys')
  t.equal(await store.purgeIdempotency(new Date(Date.now() - 24 * 3600_000)), 1, 'the 25 h old record is purged')
  t.same(await store.claimIdempotency({ ...claim, fingerprint: 'f2' }), { state: 'claimed' }, 'the key can be used again')
})

t.test('events get one gap-free seq per session', async (t) => {
  const store = new SqliteStore(':memory:')
  t.teardown(() => store.close())
  await store.migrate()
  const now = new Date().toISOString()
  for (const id of ['ses_a', 'ses_b']) {
    await store.createSession({
      id, tenant: 't', createdAt: now, updatedAt: now, status: 'idle', model: 'm', instructions: null, tools: null,
      approval: { mode: 'auto' }, limits: {}, metadata: {}, lastSeq: 0, usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 }, forkedFrom: null
    })
  }
  const append = (sessionId: string) => store.appendEvent({ sessionId, runId: null, channel: 'monitor', type: 'x', at: now, requestId: null, data: {} })
  const seqs = await Promise.all([append('ses_a'), append('ses_b'), append('ses_a'), append('ses_a'), append('ses_b')])
  t.same(seqs.map((e) => [e.sessionId, e.seq]), [['ses_a', 1], ['ses_b', 1], ['ses_a', 2], ['ses_a', 3], ['ses_b', 2]])
  t.equal((await store.getSessionById('ses_a'))?.lastSeq, 3)
  await t.rejects(append('ses_missing'), /does not exist/)
})

t.test('session counts per tenant follow creates, forks and deletes', async (t) => {
  const store = new SqliteStore(':memory:')
  t.teardown(() => store.close())
  await store.migrate()
  const now = new Date().toISOString()
  const session = (id: string, tenant: string) => ({
    id, tenant, createdAt: now, updatedAt: now, status: 'idle' as const, model: 'm', instructions: null, tools: null,
    approval: { mode: 'auto' as const }, limits: {}, metadata: {}, lastSeq: 0, usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 }, forkedFrom: null
  })
  await Promise.all([store.createSession(session('ses_1', 'a')), store.createSession(session('ses_2', 'a')), store.createSession(session('ses_3', 'b'))])
  await store.forkSession('ses_1', session('ses_4', 'a'), 0, () => 'msg_x')
  t.equal(await store.countSessions('a'), 3)
  t.equal(await store.countSessions('b'), 1)
  t.equal(await store.countSessions('c'), 0)
  t.equal(await store.deleteSession('a', 'ses_2'), true)
  t.equal(await store.deleteSession('b', 'ses_1'), false, 'another tenant cannot delete it')
  t.equal(await store.countSessions('a'), 2)
})

t.test('writes queued together commit together, and one failing write fails alone', async (t) => {
  const store = new SqliteStore(':memory:')
  t.teardown(() => store.close())
  await store.migrate()
  const now = new Date().toISOString()
  const base = {
    tenant: 't', createdAt: now, updatedAt: now, status: 'idle' as const, model: 'm', instructions: null, tools: null,
    approval: { mode: 'auto' as const }, limits: {}, metadata: {}, lastSeq: 0, usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 }, forkedFrom: null
  }
  const results = await Promise.allSettled([
    store.createSession({ ...base, id: 'ses_ok1' }),
    store.createSession({ ...base, id: 'ses_ok1' }),
    store.createSession({ ...base, id: 'ses_ok2' })
  ])
  t.same(results.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled'], 'the duplicate fails, the others commit')
  t.equal(await store.countSessions('t'), 2)
  const pending = store.createSession({ ...base, id: 'ses_late' })
  await store.close()
  await pending
  const reopened = await store.ping().catch((err: Error) => err)
  t.match(reopened, { code: 'STORE_CLOSED' }, 'a write queued before close is committed, later calls are refused')
})

t.test("a session's tool calls page in call order with their run's request ID; a saved call keeps its latest input", async (t) => {
  const store = new SqliteStore(':memory:')
  t.teardown(() => store.close())
  await store.migrate()
  const now = new Date().toISOString()
  for (const id of ['ses_a', 'ses_b']) {
    await store.createSession({
      id, tenant: 't', createdAt: now, updatedAt: now, status: 'idle', model: 'm', instructions: null, tools: null,
      approval: { mode: 'auto' }, limits: {}, metadata: {}, lastSeq: 0, usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 }, forkedFrom: null
    })
  }
  await store.createRun({
    id: 'run_1', sessionId: 'ses_a', status: 'completed', requestId: 'req-1', steps: 1, usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 },
    error: null, messageId: 'msg_1', input: 'hi', createdAt: now, startedAt: now, endedAt: now
  })
  const call = (id: string, sessionId: string) => ({
    id, sessionId, runId: 'run_1', step: 1, name: 'fs_read', input: { path: id }, state: 'pending' as const, startedAt: now, endedAt: null, durationMs: null
  })
  for (const id of ['call_3', 'call_1', 'call_2']) await store.saveToolCall(call(id, 'ses_a'))
  await store.saveToolCall(call('call_0', 'ses_b'))
  await store.saveToolCall({ ...call('call_2', 'ses_a'), input: { path: 'rewritten' }, state: 'completed', result: 'ok', endedAt: now, durationMs: 3 })

  const first = await store.listSessionToolCalls('ses_a', { limit: 2 })
  t.same(first.map((c) => c.id), ['call_1', 'call_2'])
  t.match(first[1], { requestId: 'req-1', input: { path: 'rewritten' }, state: 'completed', result: 'ok', durationMs: 3 })
  t.same((await store.listSessionToolCalls('ses_a', { limit: 2, after: 'call_2' })).map((c) => c.id), ['call_3'])
  t.same((await store.listSessionToolCalls('ses_b', { limit: 10 })).map((c) => c.id), ['call_0'], 'only the session asked for')
})
