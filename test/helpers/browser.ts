import { chromium, type Browser } from 'playwright-core'

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
