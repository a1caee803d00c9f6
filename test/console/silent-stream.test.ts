import { request as httpRequest, createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { launchBrowser, openInConsole } from '../helpers/browser.ts'

// Chromium drives the page; its clock is Playwright's, moved past the console's 45 s of silence
// (STREAM_IDLE_MS) at once instead of waited out.

t.test('an event stream that goes silent is given up and reopened, and what was sent meanwhile shows', async (t) => {
  // Before, a stream whose connection stopped carrying anything without being closed (a NAT that
  // forgot it, a server host that lost power) was read for ever under a "live" badge, though the
  // server pings every stream every 15 s: nothing new ever showed.
  const { app } = await buildTestApp(t)
  const target = new URL(await listen(app))
  // An HTTP proxy in front of the service that can freeze the event streams open now: they stay
  // open and carry nothing more; every other request, and streams opened later, go through.
  const streams = new Set<ServerResponse>()
  const frozen = new Set<ServerResponse>()
  const proxy = createServer((incoming, outgoing) => {
    const upstream = httpRequest({ host: target.hostname, port: target.port, method: incoming.method, path: incoming.url, headers: incoming.headers }, (answer) => {
      outgoing.writeHead(answer.statusCode ?? 502, answer.headers)
      const isStream = answer.headers['content-type']?.startsWith('text/event-stream') === true
      if (isStream) streams.add(outgoing)
      answer.on('data', (chunk) => {
        if (!frozen.has(outgoing)) outgoing.write(chunk)
      })
      answer.on('end', () => {
        if (!frozen.has(outgoing)) outgoing.end()
      })
    })
    incoming.pipe(upstream)
    outgoing.on('close', () => upstream.destroy())
  })
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    proxy.closeAllConnections()
    proxy.close()
  })
  const base = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`

  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const browser = await launchBrowser(t)
  const page = await browser.newPage()
  await page.clock.install()
  await openInConsole(page, base, session.id)

  for (const stream of streams) frozen.add(stream)
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'sent while the stream was silent' } })
  const answer = page.locator('.bubble.assistant', { hasText: 'You said: sent while the stream was silent' })
  await page.waitForTimeout(200)
  t.equal(await answer.count(), 0, 'nothing comes over the silent stream')
  await page.clock.fastForward(46_000)
  await answer.waitFor({ timeout: 15_000 }).catch(() => undefined)
  t.equal(await answer.count(), 1, 'the answer shows, over a new stream')
  t.equal(await page.textContent('#stream-status'), 'live')
})
