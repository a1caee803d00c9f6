import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { mkdirSync, statSync } from 'node:fs'
import type { Page } from 'playwright-core'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { launchBrowser } from '../helpers/browser.ts'
import { until } from '../helpers/server-process.ts'

// Chromium drives the page: on a busy 2-core machine the file takes minutes.
t.setTimeout(300_000)

/**
 * The picture of a finished run. The README's docs/console.png is refreshed with
 * AGENTD_UPDATE_SCREENSHOT=1; otherwise it goes to a temporary folder, so a test run leaves the tree clean.
 */
const SCREENSHOT = process.env.AGENTD_UPDATE_SCREENSHOT === '1'
  ? new URL('../../docs/console.png', import.meta.url)
  : new URL(`file://${join(tmpdir(), `agentd-console-${process.pid}`, 'console.png')}`)

/** Collects what would otherwise be silent: script errors and refused resources (a CSP violation is one). */
function watchConsole(page: Page): string[] {
  const problems: string[] = []
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`))
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push(`console error: ${message.text()}`)
  })
  return problems
}

async function send(page: Page, content: string): Promise<void> {
  await page.fill('#message', content)
  await page.click('#send')
}

/** The seq of every event the page shows in its raw view, in order. */
const shownSeqs = (page: Page) => page.$$eval('#raw li', (items) => items.map((item) => Number(item.getAttribute('data-seq'))))

t.test('the console drives a session through tools, an approval, a client tool and a reload', async (t) => {
  const { app, devModel } = await buildTestApp(t)
  const base = await listen(app)
  const browser = await launchBrowser(t)
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
  const problems = watchConsole(page)

  const served = await page.goto(`${base}/console`)
  t.equal(served?.status(), 200, 'GET /console serves the page')
  await page.waitForSelector('#new-session')

  // A session with two server tools (fs_write needs approval), a client tool, approval by tool.
  await page.click('#new-session')
  await page.waitForSelector('#new-tools input[value=fs_list]')
  await page.check('#new-tools input[name=use][value=fs_write]')
  await page.check('#new-tools input[name=ask][value=fs_write]')
  await page.fill('#new-instructions', 'You are a careful assistant.')
  await page.fill('#new-client-tools', '[{"name": "ask_user", "description": "Ask the person at the console", "parameters": {"type": "object", "properties": {"question": {"type": "string"}}}}]')
  await page.selectOption('#new-approval', 'tools')
  await page.click('#new-create')
  await page.waitForSelector('#session:not([hidden])')
  const sessionId = (await page.textContent('#session-id code')) ?? ''
  t.match(sessionId, /^ses_/, 'the new session is open')
  const session = (await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}` })).json()
  t.same(session.approval, { mode: 'tools', tools: ['fs_write'] }, 'the approval mode and tools were sent')
  t.ok(session.tools.some((tool: unknown) => typeof tool === 'object' && (tool as { name: string }).name === 'ask_user'), 'the client tool was sent')
  t.match(await page.textContent('#session-list'), sessionId, 'the list shows it')

  t.test('a tool call shows as a card with its input and result, then the streamed answer', async (t) => {
    await send(page, 'call fs_list {"path": "."}')
    const card = page.locator('.item.tool[data-tool=fs_list]')
    await card.locator('.badge', { hasText: 'completed' }).waitFor()
    t.match(await card.locator('.tool-input').textContent(), /"path": ?"\."/)
    await page.locator('.bubble.assistant', { hasText: 'Tool fs_list returned' }).waitFor()
    await page.locator('.item.done', { hasText: 'run completed' }).waitFor()
    t.match(await page.locator('.item.run').first().textContent(), 'call fs_list', 'the run shows what was said')
  })

  t.test('a failing tool shows its classified error', async (t) => {
    await send(page, 'call fs_read {"path": "missing.txt"}')
    const card = page.locator('.item.tool[data-tool=fs_read]')
    await card.locator('.classified').waitFor()
    const text = (await card.locator('.classified').textContent()) ?? ''
    t.match(text, 'NOT_FOUND')
    t.match(text, 'logical')
    t.match(text, 'retryable')
    t.ok(await card.locator('.recommendations li').count() > 0, 'with its recommendations')
    await page.locator('.item.done').nth(1).waitFor()
  })

  t.test('a call waiting for approval runs once allowed, and a reload on the way shows every event once', async (t) => {
    await send(page, 'call fs_write {"path": "notes.txt", "content": "hello"}')
    await page.locator('.item.tool[data-tool=fs_write]').locator('button.allow').waitFor()
    await page.reload()
    const allow = page.locator('.item.tool[data-tool=fs_write]').locator('button.allow')
    await allow.waitFor()
    t.equal(await page.textContent('#session-id code'), sessionId, 'the reload reopens the session')
    await allow.click()
    const card = page.locator('.item.tool[data-tool=fs_write]')
    await card.locator('.badge', { hasText: 'allowed' }).waitFor()
    await card.locator('.badge', { hasText: 'completed' }).waitFor()
    await page.locator('.item.done').nth(2).waitFor()
    const lastSeq = (await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}` })).json().lastSeq as number
    t.same(await shownSeqs(page), Array.from({ length: lastSeq }, (_, i) => i + 1), 'every event from 1 to lastSeq, none twice')
  })

  t.test('a client tool is answered with the form', async (t) => {
    await send(page, 'call ask_user {"question": "Which colour?"}')
    const form = page.locator('.item.tool[data-tool=ask_user]').locator('form.client-form')
    await form.waitFor()
    await form.locator('textarea').fill('{"colour": "blue"}')
    await form.locator('button.send-result').click()
    await page.locator('.bubble.assistant', { hasText: 'blue' }).waitFor()
    const messages = (await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}/messages` })).json().data
    t.match(messages.findLast((m: { role: string }) => m.role === 'tool').content, 'blue', 'the model got the answer')
    await page.locator('.item.done').nth(3).waitFor()
    // The picture for the README: the failed call, the approval and the client tool in one view.
    await page.setViewportSize({ width: 1280, height: 1400 })
    await page.locator('.item.run').nth(1).evaluate((run) => run.scrollIntoView({ block: 'start' }))
    mkdirSync(new URL('.', SCREENSHOT), { recursive: true })
    await page.screenshot({ path: SCREENSHOT.pathname })
    t.ok(statSync(SCREENSHOT).size > 10_000, 'the screenshot is written')
  })

  t.test('a model retry is a line of the timeline, and thinking stays folded', async (t) => {
    devModel.script({ status: 503 }, { reasoning: 'The person wants a colour; blue is safe.', text: 'Blue it is.' })
    await send(page, 'pick a colour')
    await page.locator('.bubble.assistant', { hasText: 'Blue it is.' }).waitFor()
    t.match(await page.locator('.item.retry', { hasText: 'model retry 1' }).textContent(), /SERVER_ERROR, HTTP 503/)
    const thinking = page.locator('.item.think details').last()
    t.equal(await thinking.getAttribute('open'), null, 'folded')
    t.match(await thinking.textContent(), 'blue is safe', 'with the reasoning inside')
  })

  t.test('a server error is shown with its envelope', async (t) => {
    devModel.script({ hang: true })
    await send(page, 'this one hangs')
    await page.locator('#session-status', { hasText: 'running' }).waitFor()
    await send(page, 'and this one is refused')
    const card = page.locator('.error-card', { hasText: 'SESSION_BUSY' })
    await card.waitFor()
    t.match(await card.textContent(), /request req_/, 'with its request ID')
    await page.click('#interrupt')
    await page.locator('.item.done', { hasText: 'interrupted' }).waitFor()
  })

  t.test('a dropped stream reconnects with Last-Event-ID and misses nothing', async (t) => {
    await page.locator('#stream-status', { hasText: 'live' }).waitFor()
    app.server.closeAllConnections()
    await page.locator('#stream-status', { hasText: 'reconnecting' }).waitFor()
    await app.inject({ method: 'POST', url: `/v1/sessions/${sessionId}/messages`, payload: { content: 'sent while the console was away' } })
    await page.locator('#stream-status', { hasText: 'live' }).waitFor()
    await page.locator('.bubble.assistant', { hasText: 'You said: sent while the console was away' }).waitFor()
    await page.locator('.item.run .bubble.user', { hasText: 'sent while the console was away' }).waitFor()
    const lastSeq = await until(async () => {
      const session = (await app.inject({ method: 'GET', url: `/v1/sessions/${sessionId}` })).json()
      return session.status === 'idle' && (await shownSeqs(page)).length === session.lastSeq ? session.lastSeq as number : null
    }, 10_000, 'every event on the page')
    t.same(await shownSeqs(page), Array.from({ length: lastSeq }, (_, i) => i + 1), 'every event once, in order')
  })

  t.test('forking at an event opens a new session with the history up to it', async (t) => {
    const target = page.locator('.item.done').first()
    const atSeq = Number(await target.getAttribute('data-seq'))
    await target.locator('button.fork').click()
    await page.locator('#session-id code', { hasNotText: sessionId }).waitFor()
    const forkId = (await page.textContent('#session-id code')) ?? ''
    const fork = (await app.inject({ method: 'GET', url: `/v1/sessions/${forkId}` })).json()
    t.equal(fork.lastSeq, atSeq, 'the fork holds the events up to the chosen one')
    await page.locator('.item.done').first().waitFor()
    t.equal(await page.locator('#raw li').count(), atSeq, 'and the console shows them')
  })

  t.same(problems, [], 'no script error and nothing refused by the CSP')
})

t.test('with API keys on, the page asks for a key and keeps it in the tab', async (t) => {
  const key = 'console-test-key-0123456789'
  const { app } = await buildTestApp(t, { env: { AGENTD_API_KEYS: `acme:${key}` } })
  const base = await listen(app)
  const created = await app.inject({ method: 'POST', url: '/v1/sessions', headers: { authorization: `Bearer ${key}` }, payload: { tools: [] } })
  const browser = await launchBrowser(t)
  const page = await browser.newPage()

  const served = await page.goto(`${base}/console`)
  t.equal(served?.status(), 200, 'the page itself needs no key')
  const refused = page.locator('.error-card', { hasText: 'UNAUTHORIZED' })
  await refused.waitFor()
  t.match(await refused.textContent(), 'HTTP 401')

  // More sessions than one page (20) holds, the first one oldest.
  for (let i = 0; i < 21; i++) await app.inject({ method: 'POST', url: '/v1/sessions', headers: { authorization: `Bearer ${key}` }, payload: { tools: [] } })
  await page.fill('#api-key', key)
  await page.click('#key-form button')
  await page.locator('#more-sessions:not([hidden])').waitFor()
  t.equal(await page.locator('#session-list li').count(), 20, 'one page of sessions')
  t.equal(await page.locator('#session-list li', { hasText: created.json().id }).count(), 0, 'newest first: the oldest is not on it')
  await page.click('#more-sessions')
  await page.locator('#more-sessions[hidden]').waitFor({ state: 'attached' })
  t.equal(await page.locator('#session-list li').count(), 22, 'the next page adds the rest')
  await page.locator('#session-list li', { hasText: created.json().id }).click()
  await page.locator('#stream-status', { hasText: 'live' }).waitFor()
  await send(page, 'hello with a key')
  await page.locator('.bubble.assistant', { hasText: 'You said: hello with a key' }).waitFor()

  await page.reload()
  t.equal(await page.inputValue('#api-key'), key, 'the key survives a reload of the tab')
  await page.locator('.bubble.assistant', { hasText: 'You said: hello with a key' }).waitFor()
  t.equal(await page.locator('.error-card').count(), 0, 'and no call is refused')
})
