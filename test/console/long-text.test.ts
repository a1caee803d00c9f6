import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { launchBrowser } from '../helpers/browser.ts'
import { until } from '../helpers/server-process.ts'

// Chromium drives the page: on a busy 2-core machine the file takes minutes.
t.setTimeout(300_000)

t.test('a long unbroken word (a path, a URL) wraps inside the timeline and the error cards', async (t) => {
  // Before, a classified error's message and recommendations, the monitor's line of it and an
  // error card ran off the right edge: the timeline scrolled sideways, and the line's #seq and
  // fork buttons were out of sight.
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  const path = `${'d'.repeat(40)}/${'verylongdirectoryname'.repeat(12)}.txt`
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: `call fs_read {"path": "${path}"}` } })
  const browser = await launchBrowser(t)
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
  await page.goto(`${base}/console`)
  await page.locator(`#session-list li[data-id="${session.id}"] button`).click()
  await page.locator('.item.done').waitFor()
  await page.locator('.item.tool .classified').scrollIntoViewIfNeeded()

  const timeline = await page.$eval('#timeline', (node) => ({ scrollWidth: node.scrollWidth, clientWidth: node.clientWidth }))
  t.ok(timeline.scrollWidth <= timeline.clientWidth, `the timeline does not scroll sideways (scrollWidth ${timeline.scrollWidth}, clientWidth ${timeline.clientWidth})`)
  const outside = await page.$$eval('#timeline .item-tools button', (buttons, right) =>
    buttons.filter((button) => button.getBoundingClientRect().right > right).map((button) => button.textContent), 1280)
  t.same(outside, [], 'every #seq and fork button is on screen')

  // An error card whose message holds the long path.
  await page.fill('#message', 'x')
  await page.route('**/v1/sessions/*/messages', (route) => route.fulfill({
    status: 409, contentType: 'application/json', body: JSON.stringify({ error: { code: 'SESSION_BUSY', message: `busy with ${path}`, requestId: 'req_1' } })
  }))
  await page.click('#send')
  const card = page.locator('.error-card')
  await card.waitFor()
  const overflow = await card.evaluate((node) => node.scrollWidth - node.clientWidth)
  t.equal(overflow, 0, 'the error card holds its message')
  await page.locator('.item.tool .classified').scrollIntoViewIfNeeded()
  await page.screenshot({ path: join(tmpdir(), `agentd-console-long-text-${process.pid}.png`) })
})

t.test('an error message of several lines (a traceback from a client, a webhook, an MCP server) keeps its lines', async (t) => {
  // Before, the lines ran together into one paragraph: "no colour: Traceback: File "pick.py", line 3 …".
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [{ type: 'client', name: 'pick_colour', description: 'Ask the user', parameters: { type: 'object' } }] } })).json()
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'call pick_colour {}' } })
  const call = await until(async () => (await app.inject({ method: 'GET', url: `/v1/sessions/${session.id}/tool-calls` })).json().data[0], 10_000, 'the call')
  const message = 'no colour:\nTraceback (most recent call last):\n  File "pick.py", line 3, in <module>\nKeyError: \'colour\''
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/tool-results/${call.id}`, payload: { error: message } })
  const browser = await launchBrowser(t)
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
  await page.goto(`${base}/console`)
  await page.locator(`#session-list li[data-id="${session.id}"] button`).click()
  const shown = page.locator('.item.tool .classified .error-message')
  await shown.waitFor()
  t.equal(await shown.innerText(), `The client's pick_colour failed: ${message}`, 'line by line, indentation kept')
  await shown.scrollIntoViewIfNeeded()
  await page.screenshot({ path: join(tmpdir(), `agentd-console-error-lines-${process.pid}.png`) })
})

t.test('in a window half a laptop screen wide, the session head keeps its buttons on screen', async (t) => {
  // Before, at 900 px the status badges and the Raw events button ran past the right edge.
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: { approval: { mode: 'always' } } })).json()
  await app.inject({ method: 'POST', url: `/v1/sessions/${session.id}/messages`, payload: { content: 'call fs_list {"path": "."}' } })
  const browser = await launchBrowser(t)
  for (const width of [1280, 900, 760]) {
    const page = await browser.newPage({ viewport: { width, height: 640 } })
    await page.goto(`${base}/console`)
    await page.locator(`#session-list li[data-id="${session.id}"] button`).click()
    await page.locator('button.allow').waitFor()
    const right = await page.$eval('#toggle-raw', (button) => button.getBoundingClientRect().right)
    t.ok(right <= width, `Raw events ends at ${right}, inside ${width}`)
    await page.screenshot({ path: join(tmpdir(), `agentd-console-${width}-${process.pid}.png`) })
    await page.close()
  }
})
