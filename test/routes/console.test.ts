import t from 'tap'
import { buildTestApp } from '../helpers/app.ts'

t.test('GET /console serves the page and its assets without a key, under their own CSP', async (t) => {
  const { app } = await buildTestApp(t, { env: { AGENTD_API_KEYS: 'acme:console-route-key-0123456789' } })
  const expected = [
    ['/console', 'text/html'],
    ['/console/', 'text/html'],
    ['/console/app.js', 'text/javascript'],
    ['/console/style.css', 'text/css']
  ] as const
  for (const [url, type] of expected) {
    const res = await app.inject({ method: 'GET', url })
    t.equal(res.statusCode, 200, url)
    t.match(res.headers['content-type'], type, `${url} is ${type}`)
    t.match(res.headers['content-security-policy'], "script-src 'self'", `${url} may run its own script`)
    t.match(res.headers['content-security-policy'], "connect-src 'self'", `${url} may call only its own origin`)
    t.match(res.headers['content-security-policy'], "frame-ancestors 'none'", `${url} may not be framed`)
  }
  t.match((await app.inject({ method: 'GET', url: '/console' })).body, '<script type="module" src="/console/app.js">')

  const missing = await app.inject({ method: 'GET', url: '/console/secrets.txt' })
  t.equal(missing.statusCode, 401, 'other paths under /console are not opened by it')
  t.equal(missing.json().error.code, 'UNAUTHORIZED')
  const api = await app.inject({ method: 'GET', url: '/v1/sessions' })
  t.equal(api.statusCode, 401, 'the API still needs the key')

  const document = (await app.inject({ method: 'GET', url: '/openapi.json' })).json()
  t.notOk(Object.keys(document.paths).some((path) => path.startsWith('/console')), 'the console is not part of the API document')
})
