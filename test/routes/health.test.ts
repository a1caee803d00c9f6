import t from 'tap'
import { buildTestApp } from '../helpers/app.ts'

t.test('healthz answers while the process is up', async (t) => {
  const { app } = await buildTestApp(t)
  const res = await app.inject({ method: 'GET', url: '/healthz' })
  t.equal(res.statusCode, 200)
  t.same(res.json(), { status: 'ok' })
})

t.test("readyz reports the store, the process's owner id and the model provider", async (t) => {
  const { app } = await buildTestApp(t)
  const res = await app.inject({ method: 'GET', url: '/readyz' })
  t.equal(res.statusCode, 200)
  t.same(res.json(), { status: 'ready', store: 'sqlite', owner: app.agentd.coordinator.ownerId, model: 'dev' })
  t.match(res.json().owner, /^own_/)
})

t.test('readyz is 503 with the reason while the store is unreachable', async (t) => {
  const { app } = await buildTestApp(t)
  await app.agentd.store.close()
  const res = await app.inject({ method: 'GET', url: '/readyz' })
  t.equal(res.statusCode, 503)
  t.equal(res.json().error.code, 'UNAVAILABLE')
  t.match(res.json().error.message, /store is unreachable/)
  t.equal((await app.inject({ method: 'GET', url: '/healthz' })).statusCode, 200, 'liveness is unaffected')
})
