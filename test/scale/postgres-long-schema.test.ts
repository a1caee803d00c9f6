import t from 'tap'
import { startCluster } from '../helpers/cluster.ts'
import { schemaUrl, withSchema } from '../helpers/postgres.ts'
import { readSse } from '../helpers/sse.ts'

// PostgreSQL names (a schema's, a LISTEN channel's) hold 63 bytes. The processes' wake-up channel
// was `agentd:<schema>`: for a schema name of 57 bytes or more, every NOTIFY failed ("channel
// name too long"), and nothing one process did reached the others.
t.test('processes on a schema whose name is 63 bytes long hear each other', async (t) => {
  const schema = await withSchema(t, 63)
  t.equal(Buffer.byteLength(schema), 63)
  const cluster = await startCluster(t, 2, { DATABASE_URL: schemaUrl(schema) })
  const [a, b] = cluster.servers as [typeof cluster.servers[0], typeof cluster.servers[0]]
  const { api, devModel, eventOf } = cluster
  const session = (await api(a, 'POST', '/v1/sessions', { approval: { mode: 'always' } })).json
  const streamed = readSse(`${b.url}/v1/sessions/${session.id}/events?until=done`, { timeoutMs: 10_000 })
  await new Promise((resolve) => setTimeout(resolve, 200))
  devModel.script({ toolCalls: [{ name: 'fs_list', arguments: { path: '.' } }] }, { text: 'listed' })
  t.equal((await api(a, 'POST', `/v1/sessions/${session.id}/messages`, { content: 'list' })).status, 202)
  const required = await eventOf(b, session.id, (e) => e.type === 'permission_required')
  const approved = await api(b, 'POST', `/v1/sessions/${session.id}/approvals/${required.data.call.id}`, { decision: 'allow' })
  t.equal(approved.status, 200, 'an approval through B reaches the run on A')
  const seen = await streamed
  t.ok(seen.endedByServer, "B's stream sees A's run through to its done")
  t.same(seen.events.map((e) => e.seq), seen.events.map((_, i) => i + 1), 'every event, once, in order')
})
