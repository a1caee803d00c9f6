import { existsSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { chromium } from 'playwright-core'
import t from 'tap'
import { buildTestApp, listen, tempDir } from '../helpers/app.ts'
import { CHROMIUM, CHROMIUM_ARGS } from '../helpers/browser.ts'

interface Received {
  seq: number
  type: string
  data: Record<string, unknown>
  lastEventId: string
}

/** What the page's scenario reports back. */
interface Scenario {
  scenario(api: string, key: string): Promise<{
    firstStatus: number
    received: Received[]
    opens: number
    unnamed: number
    middle: number
    resumed: number[]
    resumedOpens: number
  }>
}
const KEY = 'key-of-tenant-a-0123456789abcdef'

/**
 * The page a browser client would be: it creates a session with its key (fetch can send
 * Authorization), asks for a stream token, and follows the events with EventSource, one
 * listener per type, as the README shows.
 */
const PAGE = `<!doctype html>
<meta charset="utf-8">
<title>agentd EventSource</title>
<script>
const TYPES = ['state_changed', 'text_chunk_start', 'text_chunk', 'text_chunk_end', 'token_usage', 'step_complete', 'done']
window.scenario = async (api, key) => {
  const auth = { authorization: 'Bearer ' + key }
  const post = async (path, body) => {
    const res = await fetch(api + path, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: JSON.stringify(body) })
    return { status: res.status, body: await res.json() }
  }
  const session = (await post('/v1/sessions', { tools: [] })).body
  const { token } = (await post('/v1/sessions/' + session.id + '/stream-tokens', {})).body
  const eventsUrl = api + '/v1/sessions/' + session.id + '/events?until=done&token=' + encodeURIComponent(token)

  // One EventSource for two runs: the server ends the stream after the first done, the browser
  // reconnects by itself with Last-Event-ID, and the second run's events follow without a repeat.
  const received = []
  let opens = 0
  let unnamed = 0
  const es = new EventSource(eventsUrl)
  es.onmessage = () => unnamed++
  const doneCount = () => received.filter((e) => e.type === 'done').length
  const waitFor = (check) => new Promise((resolve) => { const timer = setInterval(() => { if (check()) { clearInterval(timer); resolve() } }, 20) })
  es.onopen = () => opens++
  for (const type of TYPES) es.addEventListener(type, (message) => received.push({ ...JSON.parse(message.data), lastEventId: message.lastEventId }))
  await waitFor(() => opens === 1)
  const first = await post('/v1/sessions/' + session.id + '/messages', { content: 'first' })
  await waitFor(() => doneCount() === 1)
  await waitFor(() => opens === 2)
  await post('/v1/sessions/' + session.id + '/messages', { content: 'second' })
  await waitFor(() => doneCount() === 2)
  es.close()

  // Resume in the middle of the first run, as a page reloaded after the seq it last saw would. The
  // stream ends at that run's done; the browser reconnects by itself to the URL it was opened with,
  // ?after included, sending Last-Event-ID: the second run follows, nothing of the first again.
  const middle = received[Math.floor(received.findIndex((e) => e.type === 'done') / 2)].seq
  const resumed = []
  let resumedOpens = 0
  await new Promise((resolve) => {
    const again = new EventSource(eventsUrl.replace('?', '?after=' + middle + '&'))
    again.onopen = () => resumedOpens++
    let dones = 0
    for (const type of TYPES) again.addEventListener(type, (message) => {
      resumed.push(JSON.parse(message.data).seq)
      if (type === 'done' && ++dones === 2) { again.close(); resolve() }
    })
  })
  return { sessionId: session.id, firstStatus: first.status, received, opens, unnamed, middle, resumed, resumedOpens }
}
</script>`

t.test('a browser EventSource on another origin follows a run with a stream token, reconnects and resumes', async (t) => {
  t.ok(existsSync(CHROMIUM), `${CHROMIUM} is installed (apt-get install chromium; .ci/run does it)`)
  const pages = createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(PAGE))
  await new Promise<void>((resolve) => pages.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>((resolve) => pages.close(() => resolve())))
  const pageOrigin = `http://localhost:${(pages.address() as AddressInfo).port}`

  const { app, devModel } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `a:${KEY}`, AGENTD_CORS_ORIGINS: pageOrigin } })
  const api = await listen(app)
  devModel.script({ text: 'one two three', chunks: 3 }, { text: 'four five', chunks: 2 })

  const context = await chromium.launchPersistentContext(tempDir(t, 'agentd-chromium-'), {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', ...CHROMIUM_ARGS]
  })
  t.teardown(() => context.close())
  const page = await context.newPage()
  const consoleErrors: string[] = []
  page.on('console', (message) => { if (message.type() === 'error') consoleErrors.push(message.text()) })
  await page.goto(pageOrigin)
  const result = await page.evaluate(([base, key]) => (globalThis as unknown as Scenario).scenario(base, key), [api, KEY] as const)

  t.equal(result.firstStatus, 202)
  const seqs = result.received.map((e) => e.seq)
  t.same(seqs, seqs.map((_, i) => i + 1), 'every event of both runs, once each, in order')
  t.same(result.received.filter((e) => e.type === 'text_chunk_end').map((e) => e.data.text), ['one two three', 'four five'])
  t.ok(result.received.every((e) => e.lastEventId === String(e.seq)), 'lastEventId is the seq')
  t.equal(result.opens, 2, 'the browser reconnected by itself after the server ended the stream at done')
  t.equal(result.unnamed, 0, 'onmessage never fires: every event is named by its type')
  t.same(result.resumed, seqs.filter((seq) => seq > result.middle), 'the resume starts right after ?after, and its reconnect after Last-Event-ID: no repeat')
  t.equal(result.resumedOpens, 2, 'the resumed stream ended at the first run\'s done and reconnected by itself')
  t.same(consoleErrors, [], 'no CORS or other error in the console')
})
