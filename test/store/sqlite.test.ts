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
