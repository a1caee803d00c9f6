import { tmpdir } from 'node:os'
import { join } from 'node:path'
import t from 'tap'
import { buildTestApp, listen } from '../helpers/app.ts'
import { launchBrowser } from '../helpers/browser.ts'

// Chromium drives the page: on a busy 2-core machine the file takes minutes.
t.setTimeout(300_000)

t.test('a session the service refuses to create shows why in the dialog, where it can be read and dismissed', async (t) => {
  // Before, the error card went behind the modal dialog: dimmed by the backdrop, partly under the
  // dialog, and out of reach of the mouse (its × could not be clicked).
  const { app } = await buildTestApp(t)
  const base = await listen(app)
  const browser = await launchBrowser(t)
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } })
  await page.goto(`${base}/console`)
  await page.click('#new-session')
  await page.waitForSelector('#new-tools input[value=fs_list]')
  await page.fill('#new-client-tools', '[{"name": "bad name with spaces"}]')
  await page.click('#new-create')
  const card = page.locator('.error-card', { hasText: 'VALIDATION_ERROR' })
  await card.waitFor()
  t.ok(await page.locator('#new-dialog[open]').isVisible(), 'the dialog stays open to fix the mistake')
  t.equal(await card.evaluate((node) => node.closest('dialog')?.id), 'new-dialog', 'the card is in the dialog, above the backdrop')
  await page.screenshot({ path: join(tmpdir(), `agentd-console-dialog-error-${process.pid}.png`) })
  await card.locator('button.close').click({ timeout: 5000 })
  t.equal(await card.count(), 0, 'its × dismisses it')

  await page.fill('#new-client-tools', '')
  await page.click('#new-create')
  await page.locator('#session:not([hidden])').waitFor()
  t.equal(await page.locator('#new-dialog[open]').count(), 0, 'a valid session closes the dialog')
})
