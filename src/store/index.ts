import type { Store } from './store.ts'
import { SqliteStore } from './sqlite.ts'

/**
 * Opens and migrates the store the configuration names (PostgreSQL when DATABASE_URL is set).
 * The PostgreSQL store, and `pg` with it, is loaded only then: a process on SQLite never holds
 * it (about 6 MB of heap and 0.1-0.2 s of start-up).
 */
export async function openStore(config: { db: string; databaseUrl?: string | undefined }, onIdleError?: (err: Error) => void): Promise<Store> {
  if (config.databaseUrl) {
    const { PostgresStore } = await import('./postgres.ts')
    const store = new PostgresStore({ connectionString: config.databaseUrl, ...(onIdleError ? { onIdleError } : {}) })
    try {
      await store.migrate()
    } catch (err) {
      await store.close().catch(() => undefined)
      throw err
    }
    return store
  }
  const store = new SqliteStore(config.db)
  await store.migrate()
  await store.releaseOrphanedClaims()
  return store
}
