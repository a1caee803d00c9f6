import { join } from 'node:path'
import t from 'tap'
import { SqliteStore } from '../../src/store/sqlite.ts'
import { tempDir, type TapTest } from '../helpers/app.ts'
import { storeContract } from './contract.ts'

async function openSqlite(t: TapTest, path: string): Promise<SqliteStore> {
  const store = new SqliteStore(path)
  t.teardown(() => store.close())
  await store.migrate()
  return store
}

t.test('the SQLite store on a file keeps the store contract', async (t) => {
  storeContract(t, (t) => openSqlite(t, join(tempDir(t), 'agentd.db')))
})

t.test('the SQLite store in memory keeps the store contract', async (t) => {
  storeContract(t, (t) => openSqlite(t, ':memory:'))
})

t.test('writes queued together commit together, and one failing unit fails alone', async (t) => {
  const store = await openSqlite(t, ':memory:')
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

t.test('a second store on the same file is refused while the first is open, and allowed after', async (t) => {
  const path = join(tempDir(t), 'agentd.db')
  const first = new SqliteStore(path)
  await first.migrate()
  t.throws(() => new SqliteStore(path), { code: 'STORE_LOCKED', message: /in use by another process/ })
  await first.close()
  const second = new SqliteStore(path)
  t.teardown(() => second.close())
  await second.migrate()
  await second.ping()
  t.pass('the file opens again once its owner has closed it')
})
