import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { buildTestApp } from '../helpers/app.ts'
import { schemaUrl, withSchema } from '../helpers/postgres.ts'

// A call may wait for a person's approval (or a client's result) as long as it takes. Its
// durationMs then passes 2^31 ms (24.8 days); SQLite keeps such a number, and so must PostgreSQL.
t.test('a tool call approved after 30 days ends its run and keeps its duration, on PostgreSQL', async (t) => {
  const schema = await withSchema(t)
  const { app, devModel } = await buildTestApp(t, { env: { DATABASE_URL: schemaUrl(schema) } })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { approval: { mode: 'always' } } })).json()
  devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }] }, { text: 'listed' })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'list it' } })
  const eventOf = async (type: string) => {
    for (let tries = 0; tries < 500; tries++) {
      const events = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?limit=1000`, headers: { accept: 'application/json' } })).json().data
      const found = events.find((e: { type: string }) => e.type === type)
      if (found) return found
      await sleep(10)
    }
    throw new Error(`no ${type} event`)
  }
  const required = await eventOf('permission_required')

  // The person answers 30 days later: this process's clock moves on.
  const days = 30 * 24 * 60 * 60 * 1000
  const realNow = Date.now
  Date.now = () => realNow() + days
  t.teardown(() => {
    Date.now = realNow
  })
  const decided = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/approvals/${required.data.call.id}`, payload: { decision: 'allow' } })
  t.equal(decided.statusCode, 200)
  t.match((await eventOf('done')).data, { reason: 'completed' }, 'the run ends (it stayed running for ever: its call could not be stored)')
  const [call] = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json().data
  t.match(call, { state: 'completed' })
  t.ok(call.durationMs >= days, `the audit shows how long it took (${call.durationMs} ms)`)
  t.equal((await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}` })).json().status, 'idle')
})
