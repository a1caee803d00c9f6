import t from 'tap'
import type { StoreWrite } from '../../src/store/store.ts'
import { buildTestApp, listen } from '../helpers/app.ts'
import { launchBrowser } from '../helpers/browser.ts'

// Chromium drives the page: on a busy 2-core machine the file takes a minute.
t.setTimeout(300_000)

t.test('a session of 300 runs opens with every prompt, a few requests and a layout per page of events', async (t) => {
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const sessionId = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json().id as string
  // 300 finished runs as a long-lived session has them: the question, a streamed answer, the end.
  const runs = 300
  const at = () => new Date().toISOString()
  for (let r = 0; r < runs; r++) {
    const runId = `run_${String(r).padStart(26, '0')}`
    const event = (channel: 'control' | 'progress', type: string, data: Record<string, unknown>): StoreWrite =>
      ({ type: 'event', event: { sessionId, runId, channel, type, at: at(), requestId: 'req_1', data } })
    await app.agentd.store.commit([
      { type: 'message', message: { id: `msg_q${r}`, sessionId, runId, role: 'user', content: `question ${r}`, createdAt: at() } },
      event('control', 'state_changed', { from: 'idle', to: 'running' }),
      event('progress', 'text_chunk_start', { step: 1 }),
      ...Array.from({ length: 30 }, (_, i) => event('progress', 'text_chunk', { step: 1, delta: `word${i} ` })),
      event('progress', 'text_chunk_end', { step: 1, text: `answer ${r}` }),
      event('control', 'state_changed', { from: 'running', to: 'idle' }),
      event('control', 'done', { reason: 'completed' }),
      { type: 'message', message: { id: `msg_a${r}`, sessionId, runId, role: 'assistant', content: `answer ${r}`, createdAt: at() } }
    ])
  }

  const browser = await launchBrowser(t)
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
  const problems: string[] = []
  page.on('pageerror', (err) => problems.push(err.message))
  await page.goto(`${base}/console`)
  await page.waitForSelector(`#session-list li[data-id="${sessionId}"] button`)

  const devtools = await page.context().newCDPSession(page)
  await devtools.send('Performance.enable')
  const layouts = async () => (await devtools.send('Performance.getMetrics')).metrics.find((m) => m.name === 'LayoutCount')?.value ?? 0
  const layoutsBefore = await layouts()
  const requests: string[] = []
  page.on('request', (request) => requests.push(new URL(request.url()).pathname))

  await page.click(`#session-list li[data-id="${sessionId}"] button`)
  await page.locator('#stream-status', { hasText: 'live' }).waitFor({ timeout: 240_000 })

  const prompts = await page.$$eval('.item.run .bubble.user', (nodes) => nodes.map((node) => node.textContent))
  t.equal(prompts.length, runs, 'every run shows its question')
  t.same([prompts[0], prompts.at(-1)], ['question 0', `question ${runs - 1}`], 'the first and the last, in order')
  t.equal(await page.$$eval('#raw li', (items) => items.length), runs * 35, 'every event is in the raw view')
  // Before: a GET of the session for each run's `done` and of the first 100 messages for each run
  // whose question was not on them (575 requests); now the conversation in pages of 1000, the
  // events in pages of 1000, the session once, the stream.
  const reads = requests.filter((path) => path.startsWith(`/v1/sessions/${sessionId}`))
  t.ok(reads.length <= 20, `${reads.length} requests to open it: ${[...new Set(reads)].join(', ')}`)
  // Before: a layout per event (the timeline's height read to follow its end), 10 500 of them,
  // each longer than the last: 15 s to open this session.
  const laidOut = (await layouts()) - layoutsBefore
  t.ok(laidOut < 200, `the page was laid out ${laidOut} times while it read ${runs * 35} events`)
  t.same(problems, [], 'no script errors')
})
