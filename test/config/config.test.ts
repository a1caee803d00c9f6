import { spawn } from 'node:child_process'
import { createServer } from 'node:net'
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { ConfigError, EnvSchema, loadConfig } from '../../src/config.ts'
import { tempDir } from '../helpers/app.ts'

const serverPath = new URL('../../src/server.ts', import.meta.url).pathname

/** Starts the real server with the given environment and collects what it prints until it exits. */
function startServer(env: Record<string, string>): Promise<{ code: number | null; stderr: string; stdout: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [serverPath], {
      env: { PATH: process.env.PATH ?? '', AGENTD_DB: ':memory:', ...env },
      stdio: ['ignore', 'pipe', 'pipe']
    })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (chunk) => (stdout += chunk))
    child.stderr.on('data', (chunk) => (stderr += chunk))
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000)
    child.on('exit', (code) => {
      clearTimeout(timer)
      resolve({ code, stderr, stdout })
    })
  })
}

t.test('bad values stop start-up with one clear line per problem and exit code 1', async (t) => {
  const { code, stderr, stdout } = await startServer({
    PORT: 'abc',
    AGENTD_API_KEYS: 'no-colon-here',
    AGENTD_MAX_STEPS: '0',
    LOG_LEVEL: 'loud'
  })
  t.equal(code, 1)
  const lines = stderr.trim().split('\n')
  t.equal(lines.length, 4, 'one line per bad variable')
  t.match(stderr, /PORT="abc" is invalid: expected an integer from 0 to 65535/)
  t.match(stderr, /AGENTD_API_KEYS=\(value hidden\) is invalid: expected a comma list of tenant:key pairs/)
  t.match(stderr, /AGENTD_MAX_STEPS="0" is invalid/)
  t.match(stderr, /LOG_LEVEL="loud" is invalid: expected one of fatal/)
  t.notMatch(stderr, /\n\s+at /, 'no stack trace')
  t.equal(stdout, '')
})

t.test('a non-loopback HOST without API keys is refused', async (t) => {
  const { code, stderr } = await startServer({ HOST: '0.0.0.0' })
  t.equal(code, 1)
  t.match(stderr, /HOST="0.0.0.0" is invalid: without AGENTD_API_KEYS agentd listens only on a loopback address/)
})

t.test('a DATABASE_URL whose database cannot be reached stops start-up with one line', async (t) => {
  const { code, stderr } = await startServer({ DATABASE_URL: 'postgres://user:secret@127.0.0.1:1/test' })
  t.equal(code, 1)
  t.match(stderr, /^agentd: cannot start: cannot use the PostgreSQL database 127\.0\.0\.1:1\/test: .*ECONNREFUSED/)
  t.equal(stderr.trim().split('\n').length, 1, 'one line')
  t.notMatch(stderr, /secret/, 'the URL, which holds a password, is not printed')
  t.notMatch(stderr, /\n\s+at /, 'no stack trace')
  const bad = await startServer({ DATABASE_URL: 'mysql://127.0.0.1/test' })
  t.equal(bad.code, 1)
  t.match(bad.stderr, /DATABASE_URL=\(value hidden\) is invalid: expected a postgres:\/\/ connection URL/)
})

t.test('a port in use or an unusable store stops start-up with one line, no stack trace', async (t) => {
  const blocker = createServer()
  await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve))
  t.teardown(() => blocker.close())
  const port = String((blocker.address() as { port: number }).port)
  const busy = await startServer({ PORT: port })
  t.equal(busy.code, 1)
  t.match(busy.stderr, /^agentd: cannot start: .*EADDRINUSE/)
  t.notMatch(busy.stderr, /\n\s+at /)
  // A store path below a regular file cannot be created.
  const file = join(tempDir(t), 'a-file')
  writeFileSync(file, '')
  const store = await startServer({ AGENTD_DB: join(file, 'agentd.db') })
  t.equal(store.code, 1)
  t.match(store.stderr, /^agentd: cannot start: /)
  t.equal(store.stderr.trim().split('\n').length, 1, 'one line')
})

t.test('a non-loopback HOST with API keys is accepted', async (t) => {
  const config = loadConfig({ HOST: '0.0.0.0', AGENTD_API_KEYS: 'acme:0123456789abcdef,beta:fedcba9876543210' })
  t.equal(config.host, '0.0.0.0')
  t.same([...config.apiKeys], [['0123456789abcdef', 'acme'], ['fedcba9876543210', 'beta']])
})

t.test('defaults follow the SPEC', async (t) => {
  const config = loadConfig({})
  t.match(config, {
    host: '127.0.0.1', port: 3000, logLevel: 'info', db: './data/agentd.db', defaultModel: 'gpt-4o-mini',
    workspaces: './data/workspaces', maxSteps: 25, toolTimeoutMs: 60000, useDevModel: true
  })
  t.ok(Object.isFrozen(config))
  t.equal(loadConfig({ OPENAI_API_KEY: 'sk-x' }).useDevModel, false)
})

t.test('ConfigError carries every problem', async (t) => {
  try {
    loadConfig({ PORT: '70000', AGENTD_TOOL_TIMEOUT_MS: 'soon' })
    t.fail('should have thrown')
  } catch (err) {
    t.ok(err instanceof ConfigError)
    t.equal((err as ConfigError).problems.length, 2)
  }
})

t.test('.env.example lists every variable the schema reads', async (t) => {
  const example = readFileSync(new URL('../../.env.example', import.meta.url), 'utf8')
  const listed = new Set([...example.matchAll(/^#?\s*([A-Z][A-Z0-9_]+)=/gm)].map((m) => m[1]))
  t.same([...listed].sort(), Object.keys(EnvSchema.properties).sort())
})

t.test("the README's Configuration table lists every variable the schema reads, with its default", async (t) => {
  const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8')
  const start = readme.indexOf('\n## Configuration')
  const section = readme.slice(start, readme.indexOf('\n## ', start + 1))
  // A row: | `NAME`, `OTHER` | `default`, `other` (or "unset", "empty") | what it does |
  const documented = new Map<string, string>()
  for (const row of section.split('\n').filter((line) => line.startsWith('| `'))) {
    const [names = '', defaults = ''] = row.slice(2).split(' | ')
    const values = [...defaults.matchAll(/`([^`]*)`/g)].map((m) => m[1] ?? '')
    ;[...names.matchAll(/`([A-Z][A-Z0-9_]+)`/g)].forEach((m, i) => documented.set(m[1] ?? '', values[i] ?? values[0] ?? defaults.trim()))
  }
  for (const [name, schema] of Object.entries(EnvSchema.properties)) {
    t.ok(documented.has(name), `${name} has a row`)
    const fallback = (schema as { default?: unknown }).default
    if (documented.has(name) && typeof fallback === 'string') {
      t.equal(documented.get(name), fallback === '' ? 'empty' : fallback, `${name}: the README gives the schema's default`)
    }
  }
  t.same([...documented.keys()].filter((name) => !(name in EnvSchema.properties)), [], 'no row for a variable agentd does not read')
})
