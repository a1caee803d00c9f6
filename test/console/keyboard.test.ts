import type { ConsoleMessage } from 'playwright-core'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { consoleOnNewSession, launchBrowser, openInConsole } from '../helpers/browser.ts'

// Chromium drives the page: on a busy 2-core machine the file takes minutes.
t.setTimeout(300_000)

t.test('Enter in the message box', async (t) => {
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json()
  const userMessages = async () => (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
    .filter((m: { role: string }) => m.role === 'user').map((m: { content: string }) => m.content)
  const browser = await launchBrowser(t)
  const page = await browser.newPage()
  const problems: string[] = []
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`))
  page.on('console', (message: ConsoleMessage) => {
    if (message.type() === 'error') problems.push(`console error: ${message.text()}`)
  })
  await openInConsole(page, base, session.id)

  t.test('that confirms an input method\'s composition (Japanese, Chinese, Korean) does not send', async (t) => {
    // Before, it sent the unconverted reading ("にほん") the moment Enter chose the conversion.
    await page.focus('#message')
    const cdp = await page.context().newCDPSession(page)
    await cdp.send('Input.imeSetComposition', { text: 'にほん', selectionStart: 3, selectionEnd: 3 })
    await cdp.send('Input.dispatchKeyEvent', { type: 'rawKeyDown', key: 'Enter', code: 'Enter', windowsVirtualKeyCode: 229 })
    await cdp.send('Input.insertText', { text: '日本' })
    await cdp.send('Input.dispatchKeyEvent', { type: 'keyUp', key: 'Enter', code: 'Enter', windowsVirtualKeyCode: 13 })
    await page.waitForTimeout(1000)
    t.equal(await page.inputValue('#message'), '日本', 'the converted text stays in the box')
    t.same(await userMessages(), [], 'nothing was sent')
  })

  t.test('sends the message, and the page stays where it is', async (t) => {
    // Before, the form was also submitted the browser's way (the handler's preventDefault ran a
    // tick late): only the page's CSP (form-action 'none') stopped it from navigating away.
    await page.press('#message', 'Enter')
    await page.locator('.bubble.assistant', { hasText: 'You said: 日本' }).waitFor()
    t.same(await userMessages(), ['日本'])
    t.equal(await page.inputValue('#message'), '', 'the box is emptied')
    t.same(problems, [], 'no script error and nothing refused by the CSP')
  })
})

t.test('Enter pressed twice while the first send is on its way sends the message once', async (t) => {
  // Before, each Enter posted the box's content until the first answer emptied it: a second
  // Enter on a slow network sent the message again (refused as SESSION_BUSY, or run twice with enqueue).
  const { app, base, session, page } = await consoleOnNewSession(t)
  await page.route(`**/v1/sessions/${session.id}/messages`, async (route) => {
    await new Promise((resolve) => setTimeout(resolve, 500))
    await route.continue()
  })
  await page.selectOption('#on-busy', 'enqueue')
  await page.fill('#message', 'only once')
  await page.press('#message', 'Enter')
  await page.press('#message', 'Enter')
  await page.locator('.item.done').first().waitFor()
  await page.waitForTimeout(1000)
  const sent = (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/messages` })).json().data
    .filter((m: { role: string }) => m.role === 'user').map((m: { content: string }) => m.content)
  t.same(sent, ['only once'])
  t.equal(await page.locator('.error-card').count(), 0, 'and no error')
})
