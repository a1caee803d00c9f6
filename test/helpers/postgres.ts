import { randomBytes } from 'node:crypto'
import pg from 'pg'
import type { TapTest } from './app.ts'

/** The machine's PostgreSQL (trust auth); AGENTD_TEST_DATABASE_URL points the tests elsewhere. */
export const postgresUrl = process.env.AGENTD_TEST_DATABASE_URL ?? 'postgres://root@127.0.0.1:5432/test'

/**
 * Creates a schema of its own for this test and drops it (and everything in it) after; its name
 * padded to `length` bytes when given (PostgreSQL's names hold 63).
 */
export async function withSchema(t: TapTest, length?: number): Promise<string> {
  const random = `agentd_test_${randomBytes(6).toString('hex')}`
  const schema = length === undefined ? random : `${random}_`.padEnd(length, 'x')
  const client = new pg.Client({ connectionString: postgresUrl })
  await client.connect()
  try {
    await client.query(`CREATE SCHEMA ${schema}`)
  } finally {
    await client.end()
  }
  t.teardown(async () => {
    const admin = new pg.Client({ connectionString: postgresUrl })
    await admin.connect()
    try {
      await admin.query(`DROP SCHEMA ${schema} CASCADE`)
    } finally {
      await admin.end()
    }
  })
  return schema
}

/**
 * DATABASE_URL of the schema, for server processes (search_path through the `options` parameter);
 * their connections carry the schema's name as application_name, so a test can find them in
 * pg_stat_activity (and drop them) without touching other tests' connections.
 */
export function schemaUrl(schema: string): string {
  return `${postgresUrl}?options=${encodeURIComponent(`-c search_path=${schema}`)}&application_name=${schema}`
}
