import { chromium, type Browser, type Page } from 'playwright-core'
import { buildTestApp, listen, type TestApp } from './app.ts'

/** Debian's chromium (.ci/run installs it when missing); playwright-core brings no browser of its own. */
export const CHROMIUM = process.env.AGENTD_CHROMIUM ?? '/usr/bin/chromium'

/** Chromium's flags for these tests: headless, no sandbox (root in CI), nothing reaching the network on its own. */
export const CHROMIUM_ARGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync']

/** A headless Chromium, closed when the test ends; launch() gives every browser a fresh temporary profile of its own. */
export async function launchBrowser(t: { teardown(fn: () => unknown): void }): Promise<Browser> {
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS })
  t.teardown(() => browser.close())
  return browser
}

/** Opens the console served at `base` on a session and waits for its event stream to be live. */
export async function openInConsole(page: Page, base: string, sessionId: string): Promise<void> {
  await page.goto(`${base}/console`)
  await page.locator(`#session-list li[data-id="${sessionId}"] button`).click()
  await page.locator('#stream-status', { hasText: 'live' }).waitFor()
}

/** A test app listening on a port, with a new session (no tools) open in the console in a fresh Chromium. */
export async function consoleOnNewSession(t: { teardown(fn: () => unknown): void }): Promise<TestApp & { base: string; session: { id: string }; page: Page }> {
  const built = await buildTestApp(t)
  const base = await listen(built.app)
  const session = (await built.app.inject({ method: 'POST', url: '/v1/sessions', payload: { tools: [] } })).json() as { id: string }
  const page = await (await launchBrowser(t)).newPage()
  await openInConsole(page, base, session.id)
  return { ...built, base, session, page }
}
