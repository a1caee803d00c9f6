import pg from 'pg'
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { buildTestApp } from '../helpers/app.ts'
import { postgresUrl, schemaUrl, withSchema } from '../helpers/postgres.ts'

// On SQLite, a message to a session deleted between the route's lookup and the run's admission is
// a 404 SESSION_NOT_FOUND (the run's insert finds no session); on PostgreSQL it must be the same.
t.test('a message to a session deleted while its run is admitted is a 404 on PostgreSQL, not a 500', async (t) => {
  const schema = await withSchema(t)
  const { app } = await buildTestApp(t, { env: { DATABASE_URL: schemaUrl(schema) } })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()

  // Another client's DELETE, held at the session row until the message's admission waits for that row.
  const other = new pg.Client({ connectionString: postgresUrl, options: `-c search_path=${schema}` })
  await other.connect()
  t.teardown(() => other.end())
  await other.query('BEGIN')
  await other.query('SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE', [session.id])
  const posting = app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'hi' } })
  // The app's connections carry the schema's name (schemaUrl): its admission is the one waiting for the row.
  const waiting = async () => (await other.query(`SELECT count(*) AS n FROM pg_stat_activity
    WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'`, [schema])).rows[0].n > 0
  for (let tries = 0; tries < 200 && !(await waiting()); tries++) await sleep(10)
  await other.query('DELETE FROM sessions WHERE id = $1', [session.id])
  await other.query('COMMIT')

  const res = await posting
  t.equal(res.statusCode, 404, 'as if the message had come after the deletion')
  t.equal(res.json().error.code, 'SESSION_NOT_FOUND')
})
