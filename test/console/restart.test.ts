import { createServer } from 'node:net'
import type { AddressInfo } from 'node:net'
import t from 'tap'
import { tempDir } from '../helpers/app.ts'
import { launchBrowser, openInConsole } from '../helpers/browser.ts'
import { startServer } from '../helpers/server-process.ts'

// Chromium drives the page, and the service is started twice: on a busy 2-core machine the file takes minutes.
t.setTimeout(300_000)

/** A port free now, for a service that must come back on the same one. */
const freePort = () => new Promise<number>((resolve) => {
  const probe = createServer()
  probe.listen(0, '127.0.0.1', () => {
    const { port } = probe.address() as AddressInfo
    probe.close(() => resolve(port))
  })
})

t.test('after the service is killed and started again, the console resumes and says how many calls recovery sealed', async (t) => {
  // Before, the recovered run's line read "(was awaiting_tool_result; call_01… calls sealed)":
  // the list of sealed call IDs where their number belonged (and " calls sealed" for none).
  const dir = tempDir(t)
  const env = { PORT: String(await freePort()), AGENTD_DB: `${dir}/agentd.db`, AGENTD_WORKSPACES: `${dir}/workspaces` }
  let server = await startServer(env)
  t.teardown(() => server.child.kill('SIGKILL'))
  const base = server.url
  const created = await fetch(`${base}/v1/sessions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ tools: [{ type: 'client', name: 'pick_colour', description: 'Ask the user', parameters: { type: 'object' } }] })
  })
  const session = await created.json() as { id: string }
  const browser = await launchBrowser(t)
  const page = await browser.newPage()
  await openInConsole(page, base, session.id)
  await page.fill('#message', 'call pick_colour {}')
  await page.press('#message', 'Enter')
  await page.locator('form.client-form').waitFor()

  server.child.kill('SIGKILL')
  await server.exited
  await page.locator('#stream-status', { hasText: 'reconnecting' }).waitFor()
  server = await startServer(env)
  await page.locator('.item.done', { hasText: 'run failed' }).waitFor({ timeout: 30_000 })
  // The end may come with the stored events read first, the live stream opening after them.
  await page.locator('#stream-status', { hasText: 'live' }).waitFor()
  t.equal(await page.locator('.item[data-type=run_recovered] .item-title').textContent(),
    'run recovered after a restart (was awaiting_tool_result; 1 call sealed)')
  const { lastSeq } = await (await fetch(`${base}/v1/sessions/${session.id}`)).json() as { lastSeq: number }
  const shown = await page.$$eval('#raw li', (items) => items.map((item) => Number(item.getAttribute('data-seq'))))
  t.same(shown, Array.from({ length: lastSeq }, (_, i) => i + 1), 'every event once, in order')
})
