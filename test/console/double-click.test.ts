import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { consoleOnNewSession, launchBrowser, openInConsole } from '../helpers/browser.ts'

// Chromium drives the page: on a busy 2-core machine the file takes minutes.
t.setTimeout(300_000)

t.test('a double click on Allow or on Send result answers once, without an error', async (t) => {
  // Before, the second click posted the answer again: refused with 409 NOT_AWAITING, shown as an
  // error card next to a call that had gone through.
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({
    method: 'POST',
    url: '/v1/sessions',
    payload: { approval: { mode: 'tools', tools: ['fs_list'] }, tools: ['fs_list', { type: 'client', name: 'pick_colour', description: 'Ask the user', parameters: { type: 'object' } }] }
  })).json()
  const browser = await launchBrowser(t)
  const page = await browser.newPage()
  await openInConsole(page, base, session.id)
  // As on a network that takes a moment to answer.
  await page.route('**/v1/sessions/*/{approvals,tool-results}/*', async (route) => {
    await new Promise((resolve) => setTimeout(resolve, 300))
    await route.continue()
  })

  await page.fill('#message', 'call fs_list {"path": "."}')
  await page.press('#message', 'Enter')
  await page.locator('.item.tool[data-tool=fs_list] button.allow').dblclick()
  await page.locator('.item.done').first().waitFor()

  await page.fill('#message', 'call pick_colour {}')
  await page.press('#message', 'Enter')
  const form = page.locator('.item.tool[data-tool=pick_colour] form.client-form')
  await form.locator('textarea').fill('"green"')
  await form.locator('button.send-result').dblclick()
  await page.locator('.item.done').nth(1).waitFor()
  await page.waitForTimeout(1000)

  t.same(await page.locator('.error-card').allTextContents(), [], 'no error')
  const tools = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
    .filter((m: { role: string }) => m.role === 'tool').map((m: { content: string }) => m.content)
  t.equal(tools.length, 2)
  t.match(tools[1], 'green')
})

t.test('a double click on Interrupt interrupts once, without an error', async (t) => {
  // Before, the second click asked again while the first was waiting for the run to stop: a
  // NO_ACTIVE_RUN card under the interrupted run.
  const { app, devModel, base, session, page } = await consoleOnNewSession(t)
  devModel.script({ hang: true })
  await page.fill('#message', 'this one hangs')
  await page.press('#message', 'Enter')
  await page.locator('#session-status', { hasText: 'running' }).waitFor()
  await page.route('**/v1/sessions/*/interrupt', async (route) => {
    await new Promise((resolve) => setTimeout(resolve, 300))
    await route.continue()
  })
  await page.locator('#interrupt').dblclick()
  await page.locator('.item.done', { hasText: 'interrupted' }).waitFor()
  await page.waitForTimeout(1000)
  t.same(await page.locator('.error-card').allTextContents(), [], 'no error')
})
