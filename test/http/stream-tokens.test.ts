import t from 'tap'
import { StreamTokens } from '../../src/http/stream-tokens.ts'
import { buildTestApp, listen } from '../helpers/app.ts'
import { readSse } from '../helpers/sse.ts'

const KEY_A = 'key-of-tenant-a-0123456789abcdef'
const KEY_B = 'key-of-tenant-b-0123456789abcdef'
const KEYS = `a:${KEY_A},b:${KEY_B}`
const bearer = (key: string) => ({ authorization: `Bearer ${key}` })

t.test('with API keys on, a stream token opens one session\'s events without Authorization', async (t) => {
  const logLines: string[] = []
  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_API_KEYS: KEYS }, logLines })
  const base = await listen(app)
  const create = () => app.inject({ method: 'POST', url: '/v1/sessions', headers: bearer(KEY_A), payload: { tools: [] } })
  const session = (await create()).json()
  const other = (await create()).json()
  devModel.script({ text: 'hello there', chunks: 2 })
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, headers: bearer(KEY_A), payload: { content: 'hi' } })

  const issued = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/stream-tokens`, headers: bearer(KEY_A) })
  t.equal(issued.statusCode, 201)
  const { token, expiresAt, sessionId } = issued.json()
  t.equal(sessionId, session.id)
  const ttl = Date.parse(expiresAt) - Date.now()
  t.ok(ttl > 290_000 && ttl <= 300_000, `good for 5 minutes by default (${ttl} ms)`)

  t.test('the events route streams with ?token= and no Authorization header', async (t) => {
    const res = await readSse(`${base}/v1/sessions/${session.id}/events?until=done&token=${token}`)
    t.equal(res.status, 200)
    t.equal(res.events.at(-1)?.type, 'done', 'the whole run, to its done event')
    t.ok(res.events.every((e) => e.sessionId === session.id))
  })

  t.test('it is bound to its session and to the events route', async (t) => {
    const elsewhere = await app.inject({ method: 'GET', url: `/v1/sessions/${other.id}/events?token=${token}`, headers: { accept: 'application/json' } })
    t.equal(elsewhere.statusCode, 401, 'another session of the same tenant')
    t.equal(elsewhere.json().error.code, 'UNAUTHORIZED')
    t.match(elsewhere.json().error.message, /stream token/)
    for (const url of [`/v1/sessions/${session.id}?token=${token}`, `/v1/sessions/${session.id}/messages?token=${token}`]) {
      const res = await app.inject({ method: 'GET', url })
      t.equal(res.statusCode, 401, `GET ${url.split('?')[0]} does not take it`)
    }
    const post = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/stream-tokens?token=${token}` })
    t.equal(post.statusCode, 401, 'a token cannot mint tokens')
  })

  t.test('a tampered, expired or foreign token is 401', async (t) => {
    const [payload, signature] = token.split('.')
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString())
    const forged = `${Buffer.from(JSON.stringify({ ...claims, e: claims.e + 3_600_000 })).toString('base64url')}.${signature}`
    const keys = new Map([[KEY_A, 'a'], [KEY_B, 'b']])
    const expired = new StreamTokens(keys).issue({ tenant: 'a', keyId: claims.k }, session.id, 1_000, Date.now() - 2_000)?.token
    const otherServer = new StreamTokens(new Map([['some-other-key-0123456789abcdef', 'a']]))
    const foreign = otherServer.issue({ tenant: 'a', keyId: claims.k }, session.id, 60_000)?.token
    t.equal(foreign, undefined, 'a server without that key issues nothing for it')
    for (const [label, bad] of [['forged expiry', forged], ['expired', expired], ['garbage', 'x.y'], ['no signature', payload]] as const) {
      const res = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?token=${bad}`, headers: { accept: 'application/json' } })
      t.equal(res.statusCode, 401, label)
      t.equal(res.json().error.code, 'UNAUTHORIZED', label)
    }
  })

  t.test('another tenant\'s token does not open this tenant\'s session', async (t) => {
    const theirs = (await app.inject({ method: 'POST', url: '/v1/sessions', headers: bearer(KEY_B), payload: { tools: [] } })).json()
    const theirToken = (await app.inject({ method: 'POST', url: `/v1/sessions/${theirs.id}/stream-tokens`, headers: bearer(KEY_B) })).json().token
    const [payload] = theirToken.split('.')
    t.equal(JSON.parse(Buffer.from(payload, 'base64url').toString()).t, 'b')
    const res = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/stream-tokens`, headers: bearer(KEY_B) })
    t.equal(res.statusCode, 404, 'tenant b cannot get a token for tenant a\'s session')
    t.equal(res.json().error.code, 'SESSION_NOT_FOUND')
  })

  t.test('expiresInSeconds shortens or lengthens it, within limits', async (t) => {
    const short = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/stream-tokens`, headers: bearer(KEY_A), payload: { expiresInSeconds: 30 } })
    t.equal(short.statusCode, 201)
    t.ok(Date.parse(short.json().expiresAt) - Date.now() <= 30_000)
    const tooLong = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/stream-tokens`, headers: bearer(KEY_A), payload: { expiresInSeconds: 86_400 } })
    t.equal(tooLong.statusCode, 400)
    t.equal(tooLong.json().error.details.fields[0].field, 'body.expiresInSeconds')
    const missing = await app.inject({ method: 'POST', url: '/v1/sessions/ses_00000000000000000000000000/stream-tokens', headers: bearer(KEY_A) })
    t.equal(missing.statusCode, 404)
  })

  t.test('a token under a percent-encoded name works as ?token= does, and is redacted as well', async (t) => {
    for (const name of ['%74oken', 'tok%65n']) {
      const res = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events?${name}=${token}`, headers: { accept: 'application/json' } })
      t.equal(res.statusCode, 200, `?${name}= opens the events`)
    }
    t.ok(logLines.some((line) => line.includes('tok%65n=[redacted]')), 'the request line shows it redacted')
  })

  t.test('no log line holds a token', async (t) => {
    t.ok(logLines.some((line) => line.includes('token=[redacted]')), 'the request line shows the token redacted')
    t.notOk(logLines.some((line) => line.includes(token)), 'the token itself appears nowhere')
  })
})

t.test('with no API keys the events route needs no token and ignores one', async (t) => {
  const { app } = await buildTestApp(t)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions' })).json()
  t.match(session.id, /^ses_/, 'a session from a POST with no body')
  const issued = await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/stream-tokens` })
  t.equal(issued.statusCode, 201, 'a client written for keys gets a token anyway')
  for (const query of ['', `?token=${issued.json().token}`, '?token=anything']) {
    const res = await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/events${query}`, headers: { accept: 'application/json' } })
    t.equal(res.statusCode, 200, `events${query.replace(/=.*/, '=…')}`)
  }
})
