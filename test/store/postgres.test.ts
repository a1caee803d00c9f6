import t from 'tap'
import { PostgresStore } from '../../src/store/postgres.ts'
import type { TapTest } from '../helpers/app.ts'
import { postgresUrl, withSchema } from '../helpers/postgres.ts'
import { storeContract, testSession } from './contract.ts'

async function openPostgres(t: TapTest): Promise<PostgresStore> {
  const schema = await withSchema(t)
  const store = new PostgresStore({ connectionString: postgresUrl, options: `-c search_path=${schema}` })
  t.teardown(() => store.close())
  await store.migrate()
  return store
}

t.test('the PostgreSQL store keeps the store contract', async (t) => {
  storeContract(t, openPostgres)
})

t.test('units handed over together commit together, and one failing unit fails alone', async (t) => {
  const store = await openPostgres(t)
  const now = new Date().toISOString()
  await store.createSession(testSession('ses_g', { createdAt: now, updatedAt: now }))
  const event = { sessionId: 'ses_g', runId: null, channel: 'monitor' as const, type: 'x', at: now, requestId: null, data: {} }
  const message = { id: 'msg_dup', sessionId: 'ses_g', runId: null, role: 'user' as const, content: 'hi', createdAt: now }
  const results = await Promise.allSettled([
    store.commit([{ type: 'event', event }]),
    store.commit([{ type: 'message', message }, { type: 'event', event }]),
    store.commit([{ type: 'message', message }, { type: 'event', event }]),
    store.commit([{ type: 'event', event }])
  ])
  t.same(results.map((r) => r.status), ['fulfilled', 'fulfilled', 'rejected', 'fulfilled'], 'the duplicate message fails its unit only')
  t.same((await store.listEvents('ses_g', { after: 0 })).map((e) => e.seq), [1, 2, 3], 'seq stays gap-free')
})

t.test('several stores (processes) on one database keep one gap-free seq per session', async (t) => {
  const schema = await withSchema(t)
  const stores = [0, 1, 2].map(() => new PostgresStore({ connectionString: postgresUrl, options: `-c search_path=${schema}` }))
  t.teardown(() => Promise.all(stores.map((s) => s.close())))
  await Promise.all(stores.map((s) => s.migrate()))
  const now = new Date().toISOString()
  await stores[0]!.createSession(testSession('ses_m', { createdAt: now, updatedAt: now }))
  const event = { sessionId: 'ses_m', runId: null, channel: 'monitor' as const, type: 'x', at: now, requestId: null, data: {} }
  await Promise.all(Array.from({ length: 60 }, (_, i) => stores[i % 3]!.commit([{ type: 'event', event }, { type: 'event', event }])))
  const seqs = (await stores[1]!.listEvents('ses_m', { after: 0 })).map((e) => e.seq)
  t.same(seqs, Array.from({ length: 120 }, (_, i) => i + 1))
  t.equal((await stores[2]!.getSessionById('ses_m'))?.lastSeq, 120)
})

t.test('an unreachable database or a bad URL is one clear error', async (t) => {
  const closed = new PostgresStore({ connectionString: 'postgres://root@127.0.0.1:1/test' })
  t.teardown(() => closed.close())
  await t.rejects(closed.migrate(), { code: 'STORE_UNREACHABLE', message: /cannot use the PostgreSQL database 127\.0\.0\.1:1\/test: .*ECONNREFUSED/ })
  const missing = new PostgresStore({ connectionString: `${postgresUrl.replace(/\/test$/, '')}/no_such_database_agentd` })
  t.teardown(() => missing.close())
  await t.rejects(missing.migrate(), { code: 'STORE_UNREACHABLE', message: /no_such_database_agentd/ })
})

t.test('a message keeps what it stands for (replacesMessages), also in a fork', async (t) => {
  const store = await openPostgres(t)
  const now = new Date().toISOString()
  const session = (id: string) => testSession(id, { createdAt: now, updatedAt: now })
  await store.createSession(session('ses_s'))
  await store.commit([
    { type: 'message', message: { id: 'msg_1', sessionId: 'ses_s', runId: null, role: 'user', content: 'hello', createdAt: now } },
    { type: 'message', message: { id: 'msg_2', sessionId: 'ses_s', runId: null, role: 'assistant', content: 'earlier: hello', replacesMessages: 1, createdAt: now } }
  ])
  t.match(await store.listMessages('ses_s'), [{ id: 'msg_1', replacesMessages: undefined }, { id: 'msg_2', replacesMessages: 1 }])
  let ids = 0
  await store.forkSession('ses_s', session('ses_sf'), 0, { newMessageId: () => `msg_f${++ids}`, sealedAnswer: () => 'sealed' })
  t.match(await store.listMessages('ses_sf'), [{ content: 'hello' }, { content: 'earlier: hello', replacesMessages: 1 }])
})

t.test('a fork copies a long conversation in a few statements, in order, its open call sealed', async (t) => {
  const store = await openPostgres(t)
  await store.createSession(testSession('ses_long'))
  const count = 40_000
  const at = () => new Date().toISOString()
  for (let i = 0; i < count; i += 2000) {
    await store.commit(Array.from({ length: 2000 }, (_, j) => ({
      type: 'message' as const,
      message: { id: `msg_${i + j}`, sessionId: 'ses_long', runId: 'run_1', role: ((i + j) % 2 ? 'assistant' : 'user') as 'user' | 'assistant', content: `message ${i + j}`, createdAt: at() }
    })))
  }
  await store.commit([{ type: 'message', message: { id: 'msg_call', sessionId: 'ses_long', runId: 'run_2', role: 'assistant', content: null, createdAt: at(),
    toolCalls: [{ id: 'call_open', name: 'fs_read', arguments: '{}' }] } }])
  let ids = 0
  let copying: () => void = () => {}
  const copyStarted = new Promise<void>((resolve) => { copying = resolve })
  const started = performance.now()
  const order: string[] = []
  const forking = store.forkSession('ses_long', testSession('ses_long_fork'), 0, {
    newMessageId: () => {
      if (ids === 0) copying()
      return `msg_f${++ids}`
    },
    sealedAnswer: (name) => `sealed ${name}`
  }).then(() => order.push('forked'))
  // While it copies (its messages' inserts are still to come): the source's own writes go on; its
  // deletion waits for the fork to be whole.
  await copyStarted
  const updating = store.commit([{ type: 'session', id: 'ses_long', patch: { status: 'running' } }]).then(() => order.push('source updated'))
  const deleting = store.deleteSession('t', 'ses_long').then(() => order.push('source deleted'))
  await Promise.all([forking, updating, deleting])
  t.same(order, ['source updated', 'forked', 'source deleted'], 'the fork holds off a deletion of its source, and nothing else')
  const ms = performance.now() - started
  // A round trip per message held the fork's transaction 9 s here; a statement per 2 000, under one.
  t.ok(ms < 4000, `forking ${count} messages took ${ms.toFixed(0)} ms`)
  const copied = await store.listMessages('ses_long_fork')
  t.equal(copied.length, count + 2)
  t.ok(copied.slice(0, count).every((m, i) => m.content === `message ${i}` && m.id === `msg_f${i + 1}`), 'in order, under new IDs')
  t.match(copied.slice(-2), [{ id: 'msg_f40001', toolCalls: [{ id: 'call_open' }] }, { role: 'tool', toolCallId: 'call_open', content: 'sealed fs_read', runId: 'run_2' }])
})
