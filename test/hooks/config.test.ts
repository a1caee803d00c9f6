import { spawn } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { loadConfig } from '../../src/config.ts'
import { HooksConfigError, hookCovers, parseHooks } from '../../src/hooks/config.ts'
import { tempDir } from '../helpers/app.ts'

const serverPath = new URL('../../src/server.ts', import.meta.url).pathname

t.test('a valid hooks file gets its defaults', async (t) => {
  const hooks = parseHooks({
    hooks: [
      { on: 'preToolUse', url: 'http://127.0.0.1:9000/policy', tools: ['fs_write', 'mcp__*'] },
      { name: 'ledger', on: 'runEnd', url: 'https://hooks.example.com/runs', timeoutMs: 2000, secret: 'a-secret-of-16-chars' }
    ]
  })
  t.same(hooks, [
    { name: 'preToolUse#0', on: 'preToolUse', url: 'http://127.0.0.1:9000/policy', tools: ['fs_write', 'mcp__*'], timeoutMs: 5000, onFailure: 'continue', secret: null },
    { name: 'ledger', on: 'runEnd', url: 'https://hooks.example.com/runs', tools: null, timeoutMs: 2000, onFailure: 'continue', secret: 'a-secret-of-16-chars' }
  ])
  t.ok(hookCovers(hooks[0]!, 'fs_write'))
  t.ok(hookCovers(hooks[0]!, 'mcp__search'), 'a trailing * matches a prefix')
  t.notOk(hookCovers(hooks[0]!, 'fs_read'))
})

t.test('each problem of a hooks file is named with its place', async (t) => {
  const cases: Array<[unknown, RegExp]> = [
    [[], /expected a JSON object \{"hooks": \[\.\.\.\]\}/],
    [{ hooks: [], extra: 1 }, /unknown top-level key "extra"/],
    [{ hooks: [{ on: 'beforeEverything', url: 'http://x' }] }, /hooks\[0\]\.on must be one of preToolUse, postToolUse, runEnd/],
    [{ hooks: [{ on: 'runEnd', url: 'ftp://x' }] }, /hooks\[0\]\.url must be an http\(s\) URL/],
    [{ hooks: [{ on: 'runEnd', url: 'not a url' }] }, /hooks\[0\]\.url must be an http\(s\) URL/],
    [{ hooks: [{ on: 'runEnd', url: 'http://x', tools: ['fs_read'] }] }, /hooks\[0\]\.tools applies to preToolUse and postToolUse hooks only/],
    [{ hooks: [{ on: 'preToolUse', url: 'http://x', tools: [] }] }, /hooks\[0\]\.tools must be a non-empty list/],
    [{ hooks: [{ on: 'preToolUse', url: 'http://x', timeoutMs: 10 }] }, /hooks\[0\]\.timeoutMs must be an integer of milliseconds from 50 to 60000/],
    [{ hooks: [{ on: 'preToolUse', url: 'http://x', onFailure: 'panic' }] }, /hooks\[0\]\.onFailure must be "continue" or "deny"/],
    [{ hooks: [{ on: 'preToolUse', url: 'http://x', secret: 'short' }] }, /hooks\[0\]\.secret must be a string of 16 or more characters/],
    [{ hooks: [{ on: 'preToolUse', url: 'http://x', colour: 'red' }] }, /hooks\[0\]\.colour is not a hook setting/],
    [{ hooks: [{ on: 'preToolUse', url: 'http://x' }, 'nope'] }, /hooks\[1\] must be an object/],
    [{ hooks: [{ name: 'a', on: 'preToolUse', url: 'http://x' }, { name: 'a', on: 'runEnd', url: 'http://y' }] }, /two hooks are named "a"/]
  ]
  for (const [document, message] of cases) {
    t.throws(() => parseHooks(document), message)
    try {
      parseHooks(document)
    } catch (err) {
      t.ok(err instanceof HooksConfigError)
    }
  }
})

t.test('AGENTD_HOOKS_CONFIG names a file; an unreadable or bad one is a configuration problem', async (t) => {
  const dir = tempDir(t)
  const good = join(dir, 'hooks.json')
  writeFileSync(good, JSON.stringify({ hooks: [{ on: 'runEnd', url: 'http://127.0.0.1:9/x' }] }))
  t.equal(loadConfig({ AGENTD_HOOKS_CONFIG: good }).hooks.length, 1)
  t.same(loadConfig({}).hooks, [], 'no file, no hooks')
  t.throws(() => loadConfig({ AGENTD_HOOKS_CONFIG: join(dir, 'missing.json') }), /AGENTD_HOOKS_CONFIG=".*missing.json" is invalid: cannot read the file \(ENOENT\)/)
  const broken = join(dir, 'broken.json')
  writeFileSync(broken, '{"hooks": [')
  t.throws(() => loadConfig({ AGENTD_HOOKS_CONFIG: broken }), /is invalid: the file is not JSON/)
})

t.test('a bad hooks file stops start-up with one line and exit code 1', async (t) => {
  const path = join(tempDir(t), 'hooks.json')
  writeFileSync(path, JSON.stringify({ hooks: [{ on: 'preToolUse', url: 'http://127.0.0.1:9/x', onFailure: 'maybe' }] }))
  const { code, stderr } = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
    const child = spawn(process.execPath, [serverPath], {
      env: { PATH: process.env.PATH ?? '', AGENTD_DB: ':memory:', AGENTD_HOOKS_CONFIG: path }, stdio: ['ignore', 'ignore', 'pipe']
    })
    let stderr = ''
    child.stderr.on('data', (chunk) => (stderr += chunk))
    // Generous: start-up alone takes seconds on a loaded machine.
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000)
    child.on('exit', (code) => {
      clearTimeout(timer)
      resolve({ code, stderr })
    })
  })
  t.equal(code, 1)
  t.equal(stderr.trim().split('\n').length, 1, 'one line')
  t.match(stderr, /^agentd: configuration error: AGENTD_HOOKS_CONFIG=".*hooks.json" is invalid: hooks\[0\]\.onFailure must be "continue" or "deny"/)
})
