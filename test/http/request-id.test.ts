import t from 'tap'
import { buildTestApp } from '../helpers/app.ts'

const GENERATED = /^req_[0-9A-Z]{26}$/

t.test('request IDs', async (t) => {
  const { app } = await buildTestApp(t)

  t.test('a well-formed X-Request-Id is echoed on success', async (t) => {
    const res = await app.inject({ method: 'GET', url: '/healthz', headers: { 'x-request-id': 'abc.DEF_1:2-3' } })
    t.equal(res.statusCode, 200)
    t.equal(res.headers['x-request-id'], 'abc.DEF_1:2-3')
  })

  t.test('a missing one is generated', async (t) => {
    const res = await app.inject({ method: 'GET', url: '/healthz' })
    t.match(res.headers['x-request-id'], GENERATED)
  })

  t.test('an invalid one is replaced, not echoed', async (t) => {
    for (const bad of ['has space', 'a'.repeat(129), 'semi;colon', 'ünïcode']) {
      const res = await app.inject({ method: 'GET', url: '/healthz', headers: { 'x-request-id': bad } })
      t.match(res.headers['x-request-id'], GENERATED, `replaces ${JSON.stringify(bad.slice(0, 20))}`)
    }
  })

  t.test('errors and unknown routes carry it, in the header and the envelope', async (t) => {
    const res = await app.inject({ method: 'GET', url: '/no/such/route', headers: { 'x-request-id': 'trace-404' } })
    t.equal(res.statusCode, 404)
    t.equal(res.headers['x-request-id'], 'trace-404')
    t.equal(res.json().error.requestId, 'trace-404')

    const missing = await app.inject({ method: 'GET', url: '/v1/sessions/ses_nope' })
    t.equal(missing.statusCode, 404)
    t.equal(missing.json().error.requestId, missing.headers['x-request-id'])
  })
})
