import type { Store } from './store.ts'
import { SqliteStore } from './sqlite.ts'

/** What the store reports of its background work, which has no caller to throw to. */
export interface StoreReports {
  /** PostgreSQL: an idle pooled connection failed (the pool replaces it). */
  onIdleError?: (err: Error) => void
  /** SQLite: the WAL checkpoint thread failed; the store checkpoints on its own connection from then on. */
  onCheckpointFailure?: (err: Error) => void
  /** SQLite: a session that a stop left half deleted or half forked could not be removed (the next start tries again). */
  onRemovalFailure?: (err: Error) => void
}

/**
 * Opens and migrates the store the configuration names (PostgreSQL when DATABASE_URL is set).
 * The PostgreSQL store, and `pg` with it, is loaded only then: a process on SQLite never holds
 * it (about 6 MB of heap and 0.1-0.2 s of start-up).
 */
export async function openStore(
  config: { db: string; databaseUrl?: string | undefined; storeTimeoutMs?: number }, reports: StoreReports = {}
): Promise<Store> {
  const { onIdleError, onCheckpointFailure } = reports
  if (config.databaseUrl) {
    const { PostgresStore } = await import('./postgres.ts')
    const store = new PostgresStore({
      connectionString: config.databaseUrl,
      ...(config.storeTimeoutMs ? { queryTimeoutMs: config.storeTimeoutMs } : {}),
      ...(onIdleError ? { onIdleError } : {})
    })
    try {
      await store.migrate()
    } catch (err) {
      await store.close().catch(() => undefined)
      throw err
    }
    return store
  }
  const store = new SqliteStore(config.db, onCheckpointFailure ? { onCheckpointFailure } : {})
  await store.migrate()
  await store.releaseOrphanedClaims()
  // Deletions and forks a stop cut short: hidden from now on, removed while the service runs.
  void store.removeUnfinished(reports.onRemovalFailure)
  return store
}
