import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { consoleOnNewSession, launchBrowser, openInConsole } from '../helpers/browser.ts'
import { until } from '../helpers/server-process.ts'

// Chromium drives the page: on a busy 2-core machine the file takes minutes.
t.setTimeout(300_000)

t.test('the session clicked last is the one shown, even when an earlier one was slower to open', async (t) => {
  // Before, each click's open ran to its end: the slow session opened last replaced the one
  // clicked last, and the other one's event stream stayed open for as long as the page lived.
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const create = async (content: string) => {
    const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
    await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content } })
    return session.id as string
  }
  const slow = await create('the slow one')
  const fast = await create('the fast one')
  const browser = await launchBrowser(t)
  const page = await browser.newPage()
  // The slow session's conversation takes a second to arrive (a long session, a slow network).
  await page.route(`**/v1/sessions/${slow}/messages?*`, async (route) => {
    await new Promise((resolve) => setTimeout(resolve, 1000))
    await route.continue()
  })
  await page.goto(`${base}/console`)
  await page.locator(`#session-list li[data-id="${slow}"] button`).click()
  await page.locator(`#session-list li[data-id="${fast}"] button`).click()
  await page.locator('.bubble.assistant', { hasText: 'You said: the fast one' }).waitFor()
  await page.waitForTimeout(1500)

  t.equal(await page.textContent('#session-id code'), fast, 'the session clicked last')
  t.equal(await page.locator('.bubble.user', { hasText: 'the slow one' }).count(), 0, 'nothing of the slow one')
  t.equal(await page.locator(`#session-list li.active`).getAttribute('data-id'), fast, 'marked in the list')
  await until(async () => app.streams.count === 1, 5000, 'one event stream').catch(() => undefined)
  t.equal(app.streams.count, 1, 'one event stream open, the shown session\'s')
})

t.test('a session that cannot be opened (deleted elsewhere) leaves the open one live', async (t) => {
  // Before, the open session's stream was closed before the other one was read: after the
  // SESSION_NOT_FOUND card, the session still on screen said "live" and showed nothing new.
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const create = async () => (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json().id as string
  const gone = await create()
  const open = await create()
  const browser = await launchBrowser(t)
  const page = await browser.newPage()
  await openInConsole(page, base, open)
  await app.inject({ method: 'DELETE', url: `/v1/sessions/${gone}` })

  await page.locator(`#session-list li[data-id="${gone}"] button`).click()
  await page.locator('.error-card', { hasText: 'SESSION_NOT_FOUND' }).waitFor()
  await app.inject({ method: 'POST', url: `/v1/sessions/${open}/messages`, payload: { content: 'sent after the failed open' } })
  const answer = page.locator('.bubble.assistant', { hasText: 'You said: sent after the failed open' })
  await answer.waitFor({ timeout: 10_000 }).catch(() => undefined)
  t.equal(await answer.count(), 1, 'the open session goes on showing its events')
  t.equal(await page.textContent('#session-id code'), open)
})

t.test('the session a tab had open, deleted since, is forgotten after the reload that says so', async (t) => {
  // Before, the tab kept its ID: every reload, for as long as the tab lived, began with a
  // SESSION_NOT_FOUND card.
  const { app, base, session, page } = await consoleOnNewSession(t)
  await app.inject({ method: 'DELETE', url: `/v1/sessions/${session.id}` })

  await page.reload()
  await page.locator('.error-card', { hasText: 'SESSION_NOT_FOUND' }).waitFor()
  await page.reload()
  await page.locator('#empty').waitFor()
  await page.waitForTimeout(1000)
  t.equal(await page.locator('.error-card').count(), 0, 'the next reload starts clean')
})

t.test('after a run the session list shows the session\'s status, as the head and a reload do', async (t) => {
  // Before, the list kept the run's last state ("completed", "failed") beside the head's "idle".
  const { app, base, session, page } = await consoleOnNewSession(t)
  await page.fill('#message', 'hello')
  await page.press('#message', 'Enter')
  await page.locator('.item.done').waitFor()
  await page.locator('#session-status', { hasText: 'idle' }).waitFor()
  const listed = page.locator(`#session-list li[data-id="${session.id}"] .badge`)
  await listed.filter({ hasText: 'idle' }).waitFor({ timeout: 5000 }).catch(() => undefined)
  t.equal(await listed.textContent(), 'idle')
})
