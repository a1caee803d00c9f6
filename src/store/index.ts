import type { Store } from './store.ts'
import { SqliteStore } from './sqlite.ts'

/** Opens and migrates the store the configuration names (PostgreSQL when DATABASE_URL is set). */
export async function openStore(config: { db: string; databaseUrl?: string | undefined }): Promise<Store> {
  if (config.databaseUrl) {
    throw new Error('DATABASE_URL is set, but this build has no PostgreSQL store yet; unset it to use SQLite (AGENTD_DB)')
  }
  const store = new SqliteStore(config.db)
  await store.migrate()
  await store.releaseOrphanedClaims()
  return store
}
