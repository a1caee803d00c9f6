import t from 'tap'
import type { Test } from 'tap'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { brotliCompressSync, createGzip, deflateSync, gzipSync } from 'node:zlib'
import { createServer as createNetServer, type AddressInfo } from 'node:net'
import { createHttpFetchTool, type HttpFetchOptions } from '../../src/tools/builtin/http-fetch.ts'
import { hostAllowed, isForbiddenAddress } from '../../src/tools/net-guard.ts'
import { runTool, type ToolOutcome } from '../../src/tools/runtime.ts'
import type { Tool } from '../../src/tools/types.ts'
import { makeWorkspace } from '../fixtures/tools/context.ts'
import { buildTestApp } from '../helpers/app.ts'
import { selfSignedCertificate, serveHttps } from '../helpers/tls.ts'

interface TestServer {
  port: number
  origin: string
  hits: IncomingMessage[]
}

async function serve(t: Test, handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<TestServer> {
  const hits: IncomingMessage[] = []
  const server = createServer((req, res) => {
    hits.push(req)
    handler(req, res)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    server.closeAllConnections()
    server.close()
  })
  const port = (server.address() as AddressInfo).port
  return { port, origin: `http://127.0.0.1:${port}`, hits }
}

async function fetchWith(t: Test, options: Partial<HttpFetchOptions>, input: unknown): Promise<ToolOutcome> {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const tool = createHttpFetchTool({ allowPrivate: false, allowedHosts: [], maxBytes: 10_000, timeoutMs: 5000, maxRedirects: 5, ...options })
  return runTool(tool as Tool, input, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 100_000 })
}

t.test('forbidden addresses: loopback, private, link-local, metadata, unspecified, and IPv4 inside IPv6', async (t) => {
  const forbidden = [
    '127.0.0.1', '127.1.2.3', '10.0.0.1', '172.16.0.1', '172.31.255.255', '192.168.1.1', '169.254.169.254', '0.0.0.0',
    '100.64.0.1', '224.0.0.1', '255.255.255.255', '::1', '::', 'fe80::1', 'fc00::1', 'fd00:ec2::254',
    '::ffff:127.0.0.1', '::ffff:7f00:1', '::ffff:a9fe:a9fe', '::ffff:0:10.0.0.1', '::127.0.0.1', '64:ff9b::a9fe:a9fe',
    '[::1]', 'not-an-ip', '2002:7f00:1::', '2002:a9fe:a9fe::1', '2002:c0a8:101:1::5', '64:ff9b:1::a00:1', '64:ff9b:1:abcd::7f00:1'
  ]
  for (const ip of forbidden) t.equal(isForbiddenAddress(ip), true, `${ip} is refused`)
  for (const ip of ['8.8.8.8', '1.1.1.1', '172.32.0.1', '192.169.0.1', '2606:4700:4700::1111', '::ffff:8.8.8.8', '64:ff9b::808:808', '2002:808:808::1']) {
    t.equal(isForbiddenAddress(ip), false, `${ip} is allowed`)
  }
})

t.test('allowed hosts match a host on any port, or host:port exactly', async (t) => {
  t.equal(hostAllowed(new URL('http://Example.com:8080/x'), ['example.com']), true)
  t.equal(hostAllowed(new URL('http://example.com:8080/x'), ['example.com:8080']), true)
  t.equal(hostAllowed(new URL('http://example.com:8081/x'), ['example.com:8080']), false)
  t.equal(hostAllowed(new URL('https://example.com/x'), ['example.com:443']), true)
  t.equal(hostAllowed(new URL('http://[::1]:9000/'), ['[::1]:9000']), true)
  t.equal(hostAllowed(new URL('http://evil.com/'), ['example.com', '']), false)
})

t.test('http_fetch refuses 127.0.0.1 and a 10.x address without connecting', async (t) => {
  const target = await serve(t, (_req, res) => res.end('secret'))
  const loopback = await fetchWith(t, {}, { url: `${target.origin}/` })
  t.match(loopback, { ok: false, error: { errorType: 'runtime', code: 'PERMISSION_DENIED', retryable: false, detail: { address: '127.0.0.1' } } })
  if (!loopback.ok) t.match(loopback.error.recommendations[0], /public http\(s\) URL/)
  t.equal(target.hits.length, 0, 'the server was never reached')
  t.match(await fetchWith(t, {}, { url: 'http://10.1.2.3/' }), { ok: false, error: { code: 'PERMISSION_DENIED', detail: { address: '10.1.2.3' } } })
  t.match(await fetchWith(t, {}, { url: 'http://[::ffff:127.0.0.1]/' }), { ok: false, error: { code: 'PERMISSION_DENIED' } })
  t.match(await fetchWith(t, {}, { url: 'http://2130706433/' }), { ok: false, error: { code: 'PERMISSION_DENIED' } }, 'a decimal IPv4 host')
})

t.test('http_fetch refuses a host name that resolves to loopback', async (t) => {
  const target = await serve(t, (_req, res) => res.end('secret'))
  t.match(await fetchWith(t, {}, { url: `http://localhost:${target.port}/` }), { ok: false, error: { code: 'PERMISSION_DENIED' } })
  t.equal(target.hits.length, 0)
})

t.test('http_fetch refuses non-http schemes', async (t) => {
  t.match(await fetchWith(t, {}, { url: 'file:///etc/passwd' }), { ok: false, error: { errorType: 'validation', code: 'VALIDATION_ERROR' } })
  t.match(await fetchWith(t, {}, { url: 'not a url' }), { ok: false, error: { code: 'VALIDATION_ERROR' } })
})

t.test('an allowed host is fetched; a redirect from it to 127.0.0.1 is refused', async (t) => {
  const inner = await serve(t, (_req, res) => res.end('inner secret'))
  const allowed = await serve(t, (req, res) => {
    if (req.url === '/escape') res.writeHead(302, { location: `${inner.origin}/` }).end()
    else if (req.url === '/hop') res.writeHead(301, { location: '/page' }).end()
    else res.writeHead(200, { 'content-type': 'text/plain' }).end(`page ${req.url}`)
  })
  const allow = { allowedHosts: [`127.0.0.1:${allowed.port}`] }

  t.match(await fetchWith(t, allow, { url: `${allowed.origin}/page` }), {
    ok: true,
    result: { status: 200, body: 'page /page', truncated: false, redirects: 0, url: `${allowed.origin}/page` }
  })
  t.match(await fetchWith(t, allow, { url: `${allowed.origin}/hop` }), { ok: true, result: { status: 200, body: 'page /page', redirects: 1 } })
  t.match(await fetchWith(t, allow, { url: `${allowed.origin}/escape` }), {
    ok: false,
    error: { code: 'PERMISSION_DENIED', detail: { url: `${inner.origin}/`, address: '127.0.0.1' } }
  })
  t.equal(inner.hits.length, 0, 'the redirect target was never reached')
})

t.test('redirects: credentials stay with their origin, 303 turns POST into GET, the chain is bounded', async (t) => {
  const second = await serve(t, (req, res) => res.end(JSON.stringify({ method: req.method, auth: req.headers.authorization ?? null })))
  const first = await serve(t, (req, res) => {
    if (req.url === '/loop') res.writeHead(302, { location: '/loop' }).end()
    else res.writeHead(303, { location: `${second.origin}/` }).end()
  })
  const allow = { allowedHosts: [`127.0.0.1:${first.port}`, `127.0.0.1:${second.port}`] }
  const moved = await fetchWith(t, allow, { url: `${first.origin}/`, method: 'POST', body: 'x', headers: { Authorization: 'Bearer s3cret' } })
  t.match(moved, { ok: true, result: { status: 200, redirects: 1 } })
  if (moved.ok) t.same(JSON.parse((moved.result as { body: string }).body), { method: 'GET', auth: null })
  t.match(await fetchWith(t, allow, { url: `${first.origin}/loop` }), { ok: false, error: { code: 'IO_ERROR', detail: { reason: 'too_many_redirects' } } })
  t.equal(first.hits.filter((r) => r.url === '/loop').length, 6, 'the first request and 5 redirects')
})

t.test('the socket connects to the checked address, not to a fresh DNS answer', async (t) => {
  const target = await serve(t, (req, res) => res.end(`host ${req.headers.host}`))
  // "app.invalid" exists only in this resolver: if the connection did its own lookup, it would fail.
  const resolve = async (hostname: string) => (hostname === 'app.invalid' ? [{ address: '127.0.0.1', family: 4 as const }] : [])
  const url = `http://app.invalid:${target.port}/`
  t.match(await fetchWith(t, { resolve, allowedHosts: [`app.invalid:${target.port}`] }, { url }), {
    ok: true,
    result: { status: 200, body: `host app.invalid:${target.port}` }
  })
  t.match(await fetchWith(t, { resolve }, { url }), { ok: false, error: { code: 'PERMISSION_DENIED' } }, 'the same host, not allowed')
})

t.test('http_fetch keeps at most maxBytes of the body, and allowPrivate opens everything', async (t) => {
  const big = await serve(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end('x'.repeat(5_000_000))
  })
  const outcome = await fetchWith(t, { allowPrivate: true, maxBytes: 1000 }, { url: `${big.origin}/` })
  t.match(outcome, { ok: true, result: { status: 200, truncated: true } })
  if (outcome.ok) {
    t.match((outcome.result as { body: string }).body, /^x+\n\[output truncated: showing the first \d+ of more bytes\]$/)
    t.ok(Buffer.byteLength(JSON.stringify(outcome.result)) <= 1000, 'the whole result fits in maxBytes')
  }
  const binary = await serve(t, (_req, res) => res.writeHead(200, { 'content-type': 'image/png' }).end(Buffer.from([1, 2, 3])))
  t.match(await fetchWith(t, { allowPrivate: true }, { url: `${binary.origin}/` }), { ok: true, result: { body: null, note: /Binary content \(image\/png\)/ } })
})

t.test('headers that would inject lines or reframe the request are refused as bad arguments, before any connection', async (t) => {
  const target = await serve(t, (_req, res) => res.end('ok'))
  const allow = { allowedHosts: [`127.0.0.1:${target.port}`] }
  const refused: Array<[Record<string, string>, string]> = [
    [{ 'x-a': 'b\r\nX-Injected: 1' }, 'x-a'],
    [{ 'x b': 'c' }, 'x b'],
    [{ Host: 'admin.internal' }, 'Host'],
    [{ 'Transfer-Encoding': 'chunked' }, 'Transfer-Encoding'],
    [{ 'content-length': '5' }, 'content-length'],
    [{ expect: '100-continue' }, 'expect']
  ]
  for (const [headers, name] of refused) {
    const outcome = await fetchWith(t, allow, { url: `${target.origin}/`, method: 'POST', body: 'abc', headers })
    t.match(outcome, { ok: false, error: { errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false, detail: { header: name } } }, `${name} is refused`)
    if (!outcome.ok) t.match(outcome.error.recommendations[0], /valid headers/)
  }
  t.equal(target.hits.length, 0, 'no request went out')
})

t.test('a redirect to a Location that is no http(s) URL is the server\'s failure, with advice, not an unknown error', async (t) => {
  const target = await serve(t, (req, res) => {
    res.writeHead(302, { location: req.url === '/file' ? 'file:///etc/passwd' : 'http://[zz/' }).end()
  })
  const allow = { allowedHosts: [`127.0.0.1:${target.port}`] }
  for (const path of ['/broken', '/file']) {
    const outcome = await fetchWith(t, allow, { url: `${target.origin}${path}` })
    t.match(outcome, { ok: false, error: { errorType: 'runtime', code: 'IO_ERROR', retryable: false, detail: { reason: 'bad_redirect' } } }, path)
    if (!outcome.ok) t.match(outcome.error.recommendations[0], /not a valid http\(s\) URL/)
  }
})

t.test('credentials in the URL are sent as Basic authorization, never shown, and stay with their origin', async (t) => {
  const other = await serve(t, (req, res) => res.end(JSON.stringify({ auth: req.headers.authorization ?? null })))
  const target = await serve(t, (req, res) => {
    if (req.url === '/away') res.writeHead(302, { location: `${other.origin}/` }).end()
    else if (req.url === '/here') res.writeHead(302, { location: '/' }).end()
    else res.end(JSON.stringify({ auth: req.headers.authorization ?? null }))
  })
  const allow = { allowedHosts: [`127.0.0.1:${target.port}`, `127.0.0.1:${other.port}`] }
  const basic = `Basic ${Buffer.from('ann:p@ss').toString('base64')}`
  const withCredentials = (path: string) => `http://ann:p%40ss@127.0.0.1:${target.port}${path}`
  const bodyOf = (outcome: ToolOutcome) => (outcome.ok ? JSON.parse((outcome.result as { body: string }).body) : outcome.error)

  const direct = await fetchWith(t, allow, { url: withCredentials('/') })
  t.same(bodyOf(direct), { auth: basic })
  t.match(direct, { ok: true, result: { url: `${target.origin}/` } }, 'the password is not echoed')
  t.same(bodyOf(await fetchWith(t, allow, { url: withCredentials('/here') })), { auth: basic }, 'a redirect on the same origin keeps them')
  t.same(bodyOf(await fetchWith(t, allow, { url: withCredentials('/away') })), { auth: null }, 'a redirect elsewhere drops them')
  t.same(bodyOf(await fetchWith(t, allow, { url: withCredentials('/'), headers: { Authorization: 'Bearer t' } })), { auth: 'Bearer t' },
    "the caller's own Authorization wins")
  t.same(bodyOf(await fetchWith(t, allow, { url: `http://ann:50%zz@127.0.0.1:${target.port}/` })), { auth: `Basic ${Buffer.from('ann:50%zz').toString('base64')}` },
    'a stray % is sent as written')
  t.match(await fetchWith(t, {}, { url: 'http://ann:p%40ss@10.1.2.3/' }), { ok: false, error: { code: 'PERMISSION_DENIED', detail: { url: 'http://10.1.2.3/' } } },
    'a refusal does not show them either')
})

t.test('a gzip, deflate or br body is decoded up to maxBytes: a decompression bomb costs no more than the cap', async (t) => {
  const text = 'hello, decoded world'
  const target = await serve(t, (req, res) => {
    const [encoding, body] = req.url === '/gzip' ? ['gzip', gzipSync(text)]
      : req.url === '/deflate' ? ['deflate', deflateSync(text)]
        : req.url === '/br' ? ['br', brotliCompressSync(text)]
            : req.url === '/broken' ? ['gzip', Buffer.from('not gzip at all')]
              : req.url === '/proto' ? ['constructor', Buffer.from('as is')]
                : ['zstd', Buffer.from([0x28, 0xb5, 0x2f, 0xfd])]
    res.writeHead(200, { 'content-type': 'text/plain', 'content-encoding': encoding }).end(body)
  })
  // An endless body of gzip-ed a's: it inflates to as much as the reader asks for, and never ends.
  const bomb = await serve(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-encoding': 'gzip' })
    const gzip = createGzip()
    gzip.pipe(res)
    const block = Buffer.alloc(64 * 1024, 'a')
    const pump = () => {
      while (!res.destroyed && gzip.write(block));
    }
    gzip.on('drain', pump)
    res.on('close', () => gzip.destroy())
    pump()
  })
  const allow = { allowedHosts: [`127.0.0.1:${target.port}`], maxBytes: 10_000 }
  for (const encoding of ['gzip', 'deflate', 'br']) {
    t.match(await fetchWith(t, allow, { url: `${target.origin}/${encoding}` }), { ok: true, result: { body: text, truncated: false } }, encoding)
  }
  const exploded = await fetchWith(t, { allowedHosts: [`127.0.0.1:${bomb.port}`], maxBytes: 10_000 }, { url: `${bomb.origin}/` })
  t.match(exploded, { ok: true, result: { truncated: true, body: /^a+\n\[output truncated: showing the first \d+ of more bytes\]$/ } },
    'an endless gzip body is cut at the cap (reading it all would never end)')
  t.match(await fetchWith(t, allow, { url: `${target.origin}/broken` }), {
    ok: false, error: { errorType: 'runtime', code: 'IO_ERROR', retryable: false, detail: { encoding: 'gzip', reason: 'bad_encoding' } }
  })
  t.match(await fetchWith(t, allow, { url: `${target.origin}/zstd` }), { ok: true, result: { body: null, note: 'Content encoded as zstd is not shown.' } })
  t.match(await fetchWith(t, allow, { url: `${target.origin}/proto` }), { ok: true, result: { body: null, note: 'Content encoded as constructor is not shown.' } },
    'an encoding named like an Object.prototype member is one agentd does not decode')
  t.match(await fetchWith(t, allow, { url: `${target.origin}/gzip`, method: 'HEAD' }), { ok: true, result: { status: 200, body: '' } },
    'a HEAD answer names its encoding but has no body to decode')
  const empty = await serve(t, (_req, res) => res.writeHead(204, { 'content-type': 'text/plain', 'content-encoding': 'br' }).end())
  t.match(await fetchWith(t, { allowedHosts: [`127.0.0.1:${empty.port}`] }, { url: `${empty.origin}/` }), { ok: true, result: { status: 204, body: '' } })
})

t.test('a page larger than the tool output cap reaches the model as a result object with its body cut, not as cut JSON text', async (t) => {
  const html = '<p class="x">line "one"</p>\n'.repeat(2000)
  const page = await serve(t, (_req, res) => res.writeHead(200, { 'content-type': 'text/html', 'content-length': String(html.length) }).end(html))
  const { app, devModel } = await buildTestApp(t, {
    env: { AGENTD_TOOL_MAX_OUTPUT_BYTES: '5000', AGENTD_FETCH_ALLOW_HOSTS: `127.0.0.1:${page.port}` }
  })
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: ['http_fetch'] } })).json()
  devModel.script({ toolCalls: [{ name: 'http_fetch', arguments: { url: `${page.origin}/` } }] }, { text: 'read it' })
  const { run } = (await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'fetch' } })).json()
  t.equal(run.status, 'completed')
  const sent = devModel.requests.at(-1)?.body as { messages: Array<{ role: string; content: string }> }
  const content = sent.messages.find((m) => m.role === 'tool')?.content ?? ''
  t.ok(Buffer.byteLength(content) <= 5000, `within the cap (${Buffer.byteLength(content)} bytes)`)
  const result = JSON.parse(content)
  t.match(result, { status: 200, truncated: true, redirects: 0, body: /^<p class="x">line "one"<\/p>\n[^]*\n\[output truncated: showing the first \d+ of 56000 bytes\]$/ })
})

t.test('a server that answers broken HTTP is its fault, not a reason to retry', async (t) => {
  const server = createNetServer((socket) => {
    socket.on('error', () => {})
    socket.once('data', () => socket.end('not http at all\r\n\r\n'))
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => server.close())
  const port = (server.address() as AddressInfo).port
  const outcome = await fetchWith(t, { allowedHosts: [`127.0.0.1:${port}`] }, { url: `http://127.0.0.1:${port}/` })
  t.match(outcome, { ok: false, error: { code: 'IO_ERROR', retryable: false, detail: { reason: 'bad_answer' }, recommendations: [/broken HTTP response.*do not retry/] } })
})

t.test('a server whose certificate is not trusted is a TLS failure: not retryable, with the code named', async (t) => {
  const server = await serveHttps(t, selfSignedCertificate(t))
  const outcome = await fetchWith(t, { allowedHosts: [`127.0.0.1:${server.port}`] }, { url: `${server.origin}/` })
  t.match(outcome, {
    ok: false,
    error: {
      errorType: 'runtime',
      code: 'IO_ERROR',
      retryable: false,
      message: /failed the TLS handshake \(DEPTH_ZERO_SELF_SIGNED_CERT\)/,
      detail: { reason: 'tls_error', errno: 'DEPTH_ZERO_SELF_SIGNED_CERT', url: `${server.origin}/` },
      recommendations: [/certificate is not trusted.*do not retry/]
    }
  })
  t.equal(server.hits(), 0)
})
