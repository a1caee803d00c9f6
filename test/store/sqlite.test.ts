import { readdirSync, renameSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { backup, DatabaseSync } from 'node:sqlite'
import { setTimeout } from 'node:timers/promises'
import t from 'tap'
import { SqliteStore } from '../../src/store/sqlite.ts'
import type { NewEvent } from '../../src/store/store.ts'
import { tempDir, type TapTest } from '../helpers/app.ts'
import { storeContract, testSession } from './contract.ts'
import { sqliteFileAtVersion } from './old-sqlite-file.ts'
import { rowsInFileCopy } from './file-copy.ts'

/** A monitor event of the session, ready for `commit`. */
function monitorEvent(sessionId: string, type = 'tick', data: Record<string, unknown> = {}): NewEvent {
  return { sessionId, runId: null, channel: 'monitor', type, at: new Date().toISOString(), requestId: null, data }
}

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
  const results = await Promise.allSettled([
    store.createSession(testSession('ses_ok1')),
    store.createSession(testSession('ses_ok1')),
    store.createSession(testSession('ses_ok2'))
  ])
  t.same(results.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled'], 'the duplicate fails, the others commit')
  t.equal(await store.countSessions('t'), 2)
  const pending = store.createSession(testSession('ses_late'))
  await store.close()
  await pending
  const reopened = await store.ping().catch((err: Error) => err)
  t.match(reopened, { code: 'STORE_CLOSED' }, 'a write queued before close is committed, later calls are refused')
})

t.test('a group commit runs after the immediates queued in the turn of its first write, and takes in the writes they make', async (t) => {
  const store = await openSqlite(t, join(tempDir(t), 'agentd.db'))
  const order: string[] = []
  const first = store.createSession(testSession('ses_first')).then(() => order.push('committed'))
  // Queued after the write, in the same turn: as undici queues a model request on a reused socket.
  setImmediate(() => {
    order.push('immediate of the same turn')
    // A write queued before the commit has run joins it.
    void store.createSession(testSession('ses_second')).then(() => order.push('committed'))
  })
  await first
  await setTimeout(1)
  t.same(order, ['immediate of the same turn', 'committed', 'committed'], 'the turn\'s immediate first, then one commit for both writes')
  t.equal(await store.countSessions('t'), 2)
})

t.test("a file whose folders cannot be made is refused with the folder's error, and folders that can are made", async (t) => {
  // Before, a path under /proc never returned: Node's recursive mkdirSync retried on the event loop, and agentd never started.
  t.throws(() => new SqliteStore('/proc/agentd-no-such-folder/deeper/agentd.db'), { code: 'ENOENT', message: /mkdir '\/proc\/agentd-no-such-folder'/ })
  const store = new SqliteStore(join(tempDir(t), 'two', 'levels', 'agentd.db'))
  t.teardown(() => store.close())
  t.ok(store, 'missing folders are made')
})

t.test('a second store on the same file is refused while the first is open, and allowed after', async (t) => {
  const path = join(tempDir(t), 'agentd.db')
  const first = new SqliteStore(path)
  await first.migrate()
  t.throws(() => new SqliteStore(path), { code: 'STORE_LOCKED', message: /in use by another process/ })
  // The claim is the lock on <file>-lock: the database itself stays readable (sqlite3, a backup tool).
  t.same(readdirSync(dirname(path)).sort(), ['agentd.db', 'agentd.db-lock', 'agentd.db-shm', 'agentd.db-wal'], 'the files of an open store')
  const reader = new DatabaseSync(path, { readOnly: true })
  t.same(reader.prepare('SELECT count(*) AS n FROM sessions').get(), { n: 0 }, 'another connection can read the database meanwhile')
  reader.close()
  await first.close()
  const second = new SqliteStore(path)
  t.teardown(() => second.close())
  await second.migrate()
  await second.ping()
  t.pass('the file opens again once its owner has closed it')
})

t.test('while the store is open, an online backup from another connection holds its newest commit', async (t) => {
  const dir = tempDir(t)
  const store = await openSqlite(t, join(dir, 'agentd.db'))
  await store.createSession(testSession('ses_backup'))
  const source = new DatabaseSync(join(dir, 'agentd.db'), { readOnly: true })
  await backup(source, join(dir, 'backup.db'))
  source.close()
  const copy = new DatabaseSync(join(dir, 'backup.db'), { readOnly: true })
  t.teardown(() => copy.close())
  t.same(copy.prepare('SELECT id FROM sessions').all().map((row) => row['id']), ['ses_backup'])
})

t.test('a file still held the way an agentd before the lock file held it is refused too', async (t) => {
  const path = join(tempDir(t), 'agentd.db')
  // What the store did until <file>-lock: SQLite's exclusive mode on the database itself, kept.
  const old = new DatabaseSync(path)
  t.teardown(() => old.close())
  old.exec('PRAGMA locking_mode = EXCLUSIVE; PRAGMA journal_mode = WAL; BEGIN IMMEDIATE; COMMIT;')
  const started = performance.now()
  t.throws(() => new SqliteStore(path), { code: 'STORE_LOCKED', message: /in use by another process/ })
  t.ok(performance.now() - started < 2_000, 'at once, not after the 5 s busy timeout')
})

t.test("a session's newest seq comes from its events: after a restart, and in a file written before schema version 5", async (t) => {
  const path = join(tempDir(t), 'agentd.db')
  // The file as version 4 left it: the newest seq was a column of the sessions row.
  const old = sqliteFileAtVersion(path, 4)
  old.exec(`INSERT INTO sessions (id, tenant, created_at, updated_at, status, model, approval, limits, metadata, last_seq)
    VALUES ('ses_old', 't', 'then', 'then', 'idle', 'm', '{}', '{}', '{}', 2), ('ses_empty', 't', 'then', 'then', 'idle', 'm', '{}', '{}', '{}', 0)`)
  old.exec(`INSERT INTO events (session_id, seq, channel, type, at, data) VALUES ('ses_old', 1, 'monitor', 'x', 'then', '{}'),
    ('ses_old', 2, 'monitor', 'x', 'then', '{}')`)
  old.close()

  const event = monitorEvent('ses_old', 'y')
  const first = await openSqlite(t, path)
  t.same((await first.listSessions('t', { limit: 10 })).map((s) => [s.id, s.lastSeq]), [['ses_old', 2], ['ses_empty', 0]])
  t.same((await first.commit([{ type: 'event', event }])).map((e) => e.seq), [3], 'the next event follows the newest one stored')
  await first.close()

  const second = await openSqlite(t, path)
  t.equal((await second.getSession('t', 'ses_old'))?.lastSeq, 3, 'a reopened store reads it back')
  t.same((await second.commit([{ type: 'event', event }, { type: 'event', event }])).map((e) => e.seq), [4, 5])
  t.same((await second.listEvents('ses_old', { after: 0 })).map((e) => e.seq), [1, 2, 3, 4, 5])
})

t.test('a session whose token totals were summed past 2^53 before schema version 8 is readable again', async (t) => {
  const path = join(tempDir(t), 'agentd.db')
  const old = sqliteFileAtVersion(path, 7)
  // Past 2^63 SQLite had gone on in floating point; past 2^53 node:sqlite refuses to read the value.
  old.exec(`INSERT INTO sessions (id, tenant, created_at, updated_at, status, model, approval, limits, metadata, input_tokens, output_tokens,
      total_tokens) VALUES ('ses_big', 't', 'then', 'then', 'idle', 'm', '{}', '{}', '{}', 18014398509481982, 5, 1.0e19)`)
  old.close()
  const store = await openSqlite(t, path)
  t.same((await store.getSession('t', 'ses_big'))?.usage, { inputTokens: Number.MAX_SAFE_INTEGER, outputTokens: 5, totalTokens: Number.MAX_SAFE_INTEGER })
})

t.test('once the store goes idle, the database file alone holds every commit (the WAL is checkpointed)', async (t) => {
  const dir = tempDir(t)
  const path = join(dir, 'agentd.db')
  const store = await openSqlite(t, path)
  await store.createSession(testSession('ses_idle'))
  const event = monitorEvent('ses_idle', 'tick', { n: 0 })
  // A busy store: one group commit after another, as a stream of runs makes them.
  for (let n = 1; n <= 40; n++) await store.commit([{ type: 'event', event: { ...event, data: { n } } }])

  /** The events a copy of the database file alone holds (the store's only session is ses_idle). */
  const eventsInFile = (name: string): number => rowsInFileCopy(path, join(dir, name), 'events')
  t.ok(eventsInFile('busy.db') < 40, 'while writes come one after another, the newest ones are only in the WAL')
  // Quiet for longer than the store waits (2 ms); the copy is made on the checkpoint thread.
  await setTimeout(20)
  await store.checkpointed()
  t.equal(eventsInFile('idle.db'), 40, 'a moment of quiet later, the file has all of them')
  t.same((await store.commit([{ type: 'event', event }])).map((e) => e.seq), [41], 'and the store goes on where it was')
})

t.test('a checkpoint thread that cannot open the file is reported once, and the store checkpoints on its own connection', async (t) => {
  const dir = tempDir(t)
  const failures: Error[] = []
  const store = new SqliteStore(join(dir, 'a', 'agentd.db'), { onCheckpointFailure: (err) => failures.push(err) })
  t.teardown(() => store.close())
  await store.migrate()
  await store.createSession(testSession('ses_moved'))
  // The folder is moved under the open store: its connection keeps the file, a new one cannot find it.
  renameSync(join(dir, 'a'), join(dir, 'b'))
  const event = monitorEvent('ses_moved')
  const eventsInFile = (): number => rowsInFileCopy(join(dir, 'b', 'agentd.db'), join(dir, 'copy.db'), 'events')
  const quiet = async (): Promise<void> => {
    await setTimeout(20)
    await store.checkpointed()
    await setTimeout(5)
  }
  for (let n = 1; n <= 40; n++) await store.commit([{ type: 'event', event }])
  await quiet()
  t.equal(failures.length, 1, 'the thread failed, and said so')
  t.match(failures[0]?.message, /unable to open database file/, "with SQLite's reason")
  t.equal(eventsInFile(), 40, 'the checkpoint it was asked for was made on the store\'s own connection')
  for (let n = 41; n <= 80; n++) await store.commit([{ type: 'event', event }])
  await quiet()
  t.equal(eventsInFile(), 80, 'and so are the next ones')
  t.equal(failures.length, 1, 'the failure is reported once')
  t.same((await store.commit([{ type: 'event', event }])).map((e) => e.seq), [81], 'the store goes on')
})

/**
 * A store on a file with one session, whose quiet moment never comes (only commits can start a
 * checkpoint), and how many events a copy of its database file alone holds.
 */
async function storeNeverIdle(t: TapTest, sessionId: string): Promise<{ store: SqliteStore; eventsInFile: () => number }> {
  const dir = tempDir(t)
  const path = join(dir, 'agentd.db')
  const store = new SqliteStore(path, { idleCheckpointMs: 3_600_000 })
  t.teardown(() => store.close())
  await store.migrate()
  await store.createSession(testSession(sessionId))
  return { store, eventsInFile: () => rowsInFileCopy(path, join(dir, 'copy.db'), 'events') }
}

t.test('under writes without a quiet moment, the WAL is still checkpointed every 200 commits', async (t) => {
  const { store, eventsInFile } = await storeNeverIdle(t, 'ses_busy')
  const event = monitorEvent('ses_busy')
  // The migrations and the session are commits too: 150 more stay under 200.
  for (let n = 1; n <= 150; n++) await store.commit([{ type: 'event', event }])
  await setTimeout(20)
  await store.checkpointed()
  t.equal(eventsInFile(), 0, 'after 150 commits, nothing is copied yet')
  for (let n = 151; n <= 250; n++) await store.commit([{ type: 'event', event }])
  await store.checkpointed()
  t.ok(eventsInFile() >= 150, 'past 200, the database file alone holds them')
})

t.test('large commits one after another have the WAL checkpointed by the thread well before SQLite would, inside a commit', async (t) => {
  const { store, eventsInFile } = await storeNeverIdle(t, 'ses_large')
  const event = monitorEvent('ses_large', 'tick', { text: 'x'.repeat(200) })
  // A fork's or a deletion's pieces: a dozen commits of thousands of rows each (each holds the loop
  // for milliseconds), ~2 000 pages in all. Counted one each they stayed far under 200 commits, and
  // the WAL grew until SQLite checkpointed it inside a commit (10 000 pages: 60-90 ms of the loop).
  for (let n = 0; n < 12; n++) await store.commit(Array.from({ length: 3000 }, () => ({ type: 'event' as const, event })))
  await store.checkpointed()
  t.ok(eventsInFile() >= 3000, `the database file holds the first pieces (${eventsInFile()} of 36 000 events)`)
})
