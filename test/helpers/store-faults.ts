import { DatabaseSync } from 'node:sqlite'
import { connect } from 'node:net'
import type { Store } from '../../src/store/store.ts'

/** A real SQLITE_FULL from node:sqlite: a database whose page count is capped, filled past it. */
export function sqliteDiskFullError(): Error {
  const db = new DatabaseSync(':memory:')
  try {
    db.exec('CREATE TABLE t (v TEXT); PRAGMA max_page_count = 3')
    for (let i = 0; i < 100; i++) db.prepare('INSERT INTO t VALUES (?)').run('x'.repeat(4000))
  } catch (err) {
    return err as Error
  } finally {
    db.close()
  }
  throw new Error('the capped database never filled')
}

/**
 * Makes the store's writes fail as a full disk fails them (the error node:sqlite throws) while
 * `full` is true: every unit of work (`except` lets some through) and every new session.
 */
export function fullDisk(store: Store, except: (writes: Parameters<Store['commit']>[0]) => boolean = () => false): { full: boolean } {
  const state = { full: false }
  const error = sqliteDiskFullError()
  const commit = store.commit
  const createSession = store.createSession
  store.commit = async (writes) => {
    if (state.full && !except(writes)) throw error
    return commit.call(store, writes)
  }
  store.createSession = async (session) => {
    if (state.full) throw error
    return createSession.call(store, session)
  }
  return state
}

/** A real ECONNREFUSED from Node (a connection to a port nobody listens on): a database out of reach. */
export function connectionRefusedError(): Promise<Error> {
  return new Promise((resolve) => connect(1, '127.0.0.1').on('error', resolve))
}

/** Makes the store's next `times` session reads fail with `error` once `when()` holds; returns how many failed. */
export function failSessionReads(store: Store, error: Error, when: () => boolean, times = 1): { failed: number } {
  const state = { failed: 0 }
  const getSession = store.getSession
  store.getSession = async (tenant, id) => {
    if (state.failed < times && when()) {
      state.failed++
      throw error
    }
    return getSession.call(store, tenant, id)
  }
  return state
}
