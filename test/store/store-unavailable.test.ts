import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import t from 'tap'
import { observeStore } from '../../src/store/observed.ts'
import { PostgresStore } from '../../src/store/postgres.ts'
import { SqliteStore } from '../../src/store/sqlite.ts'
import { storeUnavailable, type Store } from '../../src/store/store.ts'
import { postgresUrl, withSchema } from '../helpers/postgres.ts'
import { sqliteDiskFullError } from '../helpers/store-faults.ts'

t.test('what counts as the database being unavailable, from the drivers themselves', async (t) => {
  const full = sqliteDiskFullError()
  t.match(full, { code: 'ERR_SQLITE_ERROR', errcode: 13 }, 'node:sqlite reports a full database as SQLITE_FULL')
  t.equal(storeUnavailable(full), 'failing')

  // pg against a port nobody listens on, and against a server that ends the connection.
  const refused = new pg.Client({ host: '127.0.0.1', port: 1, connectionTimeoutMillis: 2000 })
  const connectError = await refused.connect().then(() => null, (err: unknown) => err)
  t.equal(storeUnavailable(connectError), 'unreachable', 'ECONNREFUSED')
  const client = new pg.Client({ connectionString: postgresUrl })
  client.on('error', () => undefined)
  await client.connect()
  const killer = new pg.Client({ connectionString: postgresUrl })
  await killer.connect()
  t.teardown(() => killer.end())
  const pid = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid
  const dying = client.query('SELECT pg_sleep(5)').then(() => null, (err: unknown) => err)
  await killer.query('SELECT pg_terminate_backend($1)', [pid])
  const terminated = await dying
  t.ok(terminated, 'the query failed')
  t.equal(storeUnavailable(terminated), 'unreachable', `a terminated backend (${(terminated as Error).message})`)
  await client.end().catch(() => undefined)

  // A statement that outlives query_timeout.
  const slow = new pg.Client({ connectionString: postgresUrl, query_timeout: 100 })
  slow.on('error', () => undefined)
  await slow.connect()
  const timedOut = await slow.query('SELECT pg_sleep(2)').then(() => null, (err: unknown) => err)
  t.equal(storeUnavailable(timedOut), 'unreachable', 'Query read timeout')
  await slow.end().catch(() => undefined)

  // A database error of the statement itself is the caller's or agentd's, never an outage.
  const plain = new pg.Client({ connectionString: postgresUrl })
  await plain.connect()
  const syntax = await plain.query('SELEC 1').then(() => null, (err: unknown) => err)
  await plain.end()
  t.match(syntax, { code: '42601' })
  t.equal(storeUnavailable(syntax), null, 'a syntax error')
  t.equal(storeUnavailable(new TypeError('x is undefined')), null, 'a bug')
  t.equal(storeUnavailable(null), null)
  t.equal(storeUnavailable({ code: '57P01', message: 'terminating connection due to administrator command' }), 'unreachable', 'the server shutting down')
  t.equal(storeUnavailable({ code: '53100', message: 'could not extend file' }), 'failing', "PostgreSQL's disk full")
})

t.test('/readyz failures: kept per operation, cleared by its success, by any commit for a full disk, and by age', async (t) => {
  const inner = new SqliteStore(':memory:')
  await inner.migrate()
  t.teardown(() => inner.close())
  const health = { storeFailure: null as string | null }
  const logged: string[] = []
  const store: Store = observeStore(inner, health, (operation) => logged.push(operation), 200)
  const session = {
    id: 'ses_1', tenant: 'default', createdAt: new Date().toISOString(), updatedAt: new Date().toISOString(), status: 'idle' as const,
    model: 'm', instructions: null, tools: [], approval: { mode: 'auto' as const }, limits: {}, metadata: {}, lastSeq: 0,
    usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 }, forkedFrom: null
  }
  await store.createSession(session)
  const failWith = (err: Error, method: 'getSession' | 'commit') => {
    const original = inner[method].bind(inner)
    ;(inner as any)[method] = async () => { throw err }
    return () => { (inner as any)[method] = original }
  }

  // An unknown failure of one call is kept until that call succeeds (or it ages out).
  let restore = failWith(new Error('no such column: foo'), 'getSession')
  await t.rejects(store.getSession('default', 'ses_1'))
  t.equal(health.storeFailure, 'getSession: no such column: foo')
  await store.commit([{ type: 'session', id: 'ses_1', patch: { status: 'idle' } }])
  t.equal(health.storeFailure, 'getSession: no such column: foo', 'another call succeeding says nothing of it')
  restore()
  await store.getSession('default', 'ses_1')
  t.equal(health.storeFailure, null, 'the same call succeeding clears it')

  // A full disk is the whole database's: the next unit of work committed clears it.
  const full = sqliteDiskFullError()
  restore = failWith(full, 'getSession')
  await t.rejects(store.getSession('default', 'ses_1'))
  t.match(health.storeFailure, /^getSession: database or disk is full/)
  restore()
  await store.commit([{ type: 'session', id: 'ses_1', patch: { status: 'idle' } }])
  t.equal(health.storeFailure, null, 'a commit clears a full disk')

  // A database out of reach is logged, not kept (/readyz pings it itself).
  restore = failWith(Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:5432'), { code: 'ECONNREFUSED' }), 'getSession')
  await t.rejects(store.getSession('default', 'ses_1'))
  t.equal(health.storeFailure, null)
  t.equal(logged.at(-1), 'getSession', 'but logged')
  restore()

  // Nothing clears it: it ages out.
  restore = failWith(new Error('no such column: foo'), 'getSession')
  await t.rejects(store.getSession('default', 'ses_1'))
  t.ok(health.storeFailure)
  restore()
  await sleep(300)
  t.equal(health.storeFailure, null, 'gone after its time to live')
})

t.test('PostgreSQL ends a connection the store holds between two statements: that call fails, the process goes on', async (t) => {
  // Before, pg emitted the server's "terminating connection" on a checked-out client with no
  // listener: an uncaught error, and the process exited (seen under load in test/scale/chaos.test.ts).
  const schema = await withSchema(t)
  const store = new PostgresStore({ connectionString: postgresUrl, options: `-c search_path=${schema}` })
  t.teardown(() => store.close())
  await store.migrate()
  const admin = new pg.Client({ connectionString: postgresUrl })
  await admin.connect()
  t.teardown(() => admin.end())
  const failed = await store.transaction(async (client) => {
    const pid = (await client.query('SELECT pg_backend_pid() AS pid')).rows[0].pid
    await admin.query('SELECT pg_terminate_backend($1)', [pid])
    // No statement in flight while the server's goodbye arrives.
    await sleep(200)
    return client.query('SELECT 1')
  }).then(() => null, (err: unknown) => err)
  t.equal(storeUnavailable(failed), 'unreachable', `the transaction failed as a lost connection (${(failed as Error)?.message})`)
  t.same((await store.pool.query('SELECT 1 AS one')).rows, [{ one: 1 }], 'the pool serves the next call on a new connection')
})
