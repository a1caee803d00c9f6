import type { Store } from './store.ts'
import { PostgresStore } from './postgres.ts'
import { SqliteStore } from './sqlite.ts'

/** Opens and migrates the store the configuration names (PostgreSQL when DATABASE_URL is set). */
export async function openStore(config: { db: string; databaseUrl?: string | undefined }, onIdleError?: (err: Error) => void): Promise<Store> {
  if (config.databaseUrl) {
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
