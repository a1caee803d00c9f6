import { DatabaseSync } from 'node:sqlite'
import { sqliteMigrations } from '../../src/store/sqlite-migrations.ts'

/**
 * An SQLite file as an older agentd left it: the migrations up to `version` applied and recorded,
 * open for the test to write rows of that schema into (and close) before a store opens it.
 */
export function sqliteFileAtVersion(path: string, version: number): DatabaseSync {
  const db = new DatabaseSync(path)
  db.exec('CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)')
  for (const migration of sqliteMigrations.filter((m) => m.version <= version)) {
    db.exec(migration.sql)
    db.prepare('INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)').run(migration.version, migration.name, 'then')
  }
  return db
}
