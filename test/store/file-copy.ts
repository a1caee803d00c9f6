import { copyFileSync } from 'node:fs'
import { DatabaseSync } from 'node:sqlite'

/**
 * The rows of `table` that a copy of the SQLite file alone holds, as a backup taking only that
 * file would (not its WAL): 0 while the table itself is only in the WAL. The copy is written to
 * `copyPath`.
 */
export function rowsInFileCopy(path: string, copyPath: string, table: string): number {
  copyFileSync(path, copyPath)
  const db = new DatabaseSync(copyPath, { readOnly: true })
  try {
    const tables = db.prepare('SELECT count(*) AS n FROM sqlite_master WHERE name = ?').get(table) as { n: number }
    return tables.n === 0 ? 0 : (db.prepare(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n
  } finally {
    db.close()
  }
}
