import { join } from 'node:path'
import t from 'tap'
import { SqliteStore } from '../../src/store/sqlite.ts'
import type { SessionRecord } from '../../src/store/store.ts'
import { tempDir } from '../helpers/app.ts'
import { testSession } from './contract.ts'
import { sqliteFileAtVersion } from './old-sqlite-file.ts'

const now = '2026-11-23T10:00:00.000Z'
const session = (id: string): SessionRecord => testSession(id, { createdAt: now, updatedAt: now })

t.test('a store written before summaries existed migrates, keeps its messages, and then stores summaries', async (t) => {
  const file = join(tempDir(t), 'agentd.db')
  const old = sqliteFileAtVersion(file, 2)
  old.prepare(`INSERT INTO sessions (id, tenant, created_at, updated_at, status, model, instructions, tools, approval, limits, metadata)
    VALUES ('ses_old', 't', ?, ?, 'idle', 'm', NULL, NULL, '{"mode":"auto"}', '{}', '{}')`).run(now, now)
  old.prepare(`INSERT INTO messages (id, session_id, run_id, role, content, at_seq, created_at) VALUES ('msg_old', 'ses_old', NULL, 'user', 'hello', 0, ?)`).run(now)
  old.close()

  const store = new SqliteStore(file)
  t.teardown(() => store.close())
  await store.migrate()
  t.same(await store.listMessages('ses_old'), [{ id: 'msg_old', sessionId: 'ses_old', runId: null, role: 'user', content: 'hello', createdAt: now }])

  await store.commit([{ type: 'message', message: { id: 'msg_sum', sessionId: 'ses_old', runId: null, role: 'summary', content: 'they said hello', replacesMessages: 1, createdAt: now } }])
  const [, summary] = await store.listMessages('ses_old')
  t.same(summary, { id: 'msg_sum', sessionId: 'ses_old', runId: null, role: 'summary', content: 'they said hello', replacesMessages: 1, createdAt: now })

  await store.forkSession('ses_old', session('ses_fork'), 0, { newMessageId: () => `msg_${Math.random().toString(36).slice(2)}`, sealedAnswer: () => 'sealed' })
  t.match(await store.listMessages('ses_fork'), [{ role: 'user', content: 'hello' }, { role: 'summary', replacesMessages: 1 }], 'a fork copies what a summary stands for')
})
