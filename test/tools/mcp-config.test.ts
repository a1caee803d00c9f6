import { spawn } from 'node:child_process'
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import t from 'tap'
import { ConfigError, loadConfig } from '../../src/config.ts'
import { tempDir } from '../helpers/app.ts'
import { startServer, until } from '../helpers/server-process.ts'

const serverPath = new URL('../../src/server.ts', import.meta.url).pathname
const misbehaving = new URL('../fixtures/mcp/misbehaving-server.ts', import.meta.url).pathname

/** loadConfig's problem lines for this MCP config file text. */
function problems(dir: string, text: string): string[] {
  const file = join(dir, `mcp-${Math.random().toString(36).slice(2)}.json`)
  writeFileSync(file, text)
  try {
    loadConfig({ AGENTD_MCP_CONFIG: file })
    return []
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err
    return err.problems.map((line) => line.replace(file, 'FILE'))
  }
}

t.test('a bad MCP config file or entry is one line naming it', async (t) => {
  const dir = tempDir(t)
  const cases: Array<[string, string, RegExp]> = [
    ['not JSON', '{"mcpServers":', /AGENTD_MCP_CONFIG="FILE" is invalid: the file is not JSON/],
    ['no mcpServers object', '{"servers": {}}', /expected an object \{"mcpServers": \{"<name>": \{\.\.\.\}\}\}/],
    ['neither command nor url', '{"mcpServers": {"fs": {"args": []}}}', /mcpServers\.fs must have either "command" \(stdio\) or "url"/],
    ['both command and url', '{"mcpServers": {"fs": {"command": "x", "url": "http://h"}}}', /mcpServers\.fs must have either/],
    ['args not strings', '{"mcpServers": {"fs": {"command": "x", "args": [1]}}}', /mcpServers\.fs\.args\.0: Expected string/],
    ['an unknown field', '{"mcpServers": {"fs": {"command": "x", "cmd": "y"}}}', /mcpServers\.fs\.cmd: Unexpected property/],
    ['a url that is not http', '{"mcpServers": {"web": {"url": "ftp://h"}}}', /mcpServers\.web\.url: Expected string to match/],
    ['a name with __', '{"mcpServers": {"a__b": {"command": "x"}}}', /mcpServers\.a__b has a bad name/],
    ['a name with a dot', '{"mcpServers": {"a.b": {"command": "x"}}}', /mcpServers\.a\.b has a bad name/]
  ]
  for (const [what, text, expected] of cases) {
    const lines = problems(dir, text)
    t.equal(lines.length, 1, `${what}: one line`)
    t.match(lines[0], expected, what)
  }
  const missing = problems(dir, '{}')
  t.match(missing[0], /expected an object/)
  try {
    loadConfig({ AGENTD_MCP_CONFIG: join(dir, 'nope.json') })
    t.fail('a missing file is refused')
  } catch (err) {
    t.match((err as ConfigError).problems, [/AGENTD_MCP_CONFIG=".*nope\.json" is invalid: the file cannot be read \(ENOENT\)/])
  }
})

t.test('a good file gives stdio and Streamable HTTP servers; a relative cwd is taken from the file folder', async (t) => {
  const dir = tempDir(t)
  const file = join(dir, 'mcp.json')
  writeFileSync(file, JSON.stringify({
    mcpServers: {
      filesystem: { command: 'npx', args: ['-y', '@modelcontextprotocol/server-filesystem', '/srv/docs'], env: { DEBUG: '1' }, cwd: 'servers' },
      remote: { url: 'https://mcp.example.com/mcp', headers: { authorization: 'Bearer x' } }
    }
  }))
  t.same(loadConfig({ AGENTD_MCP_CONFIG: file }).mcpServers, [
    { name: 'filesystem', transport: 'stdio', command: 'npx', args: ['-y', '@modelcontextprotocol/server-filesystem', '/srv/docs'], env: { DEBUG: '1' }, cwd: join(dir, 'servers') },
    { name: 'remote', transport: 'http', url: 'https://mcp.example.com/mcp', headers: { authorization: 'Bearer x' } }
  ])
  t.same(loadConfig({}).mcpServers, [], 'unset: no MCP servers')
})

t.test('the real server refuses a bad MCP config at start-up with one line and exit code 1', async (t) => {
  const dir = tempDir(t)
  const file = join(dir, 'mcp.json')
  writeFileSync(file, '{"mcpServers": {"fs": {"command": 42}}}')
  const child = spawn(process.execPath, [serverPath], {
    env: { PATH: process.env.PATH ?? '', AGENTD_DB: ':memory:', AGENTD_MCP_CONFIG: file },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let stderr = ''
  child.stderr.on('data', (chunk) => (stderr += chunk))
  const code = await new Promise((resolve) => child.on('exit', resolve))
  t.equal(code, 1)
  t.equal(stderr.trim().split('\n').length, 1, 'one line')
  t.match(stderr, /AGENTD_MCP_CONFIG=".*mcp\.json" is invalid: mcpServers\.fs\.command: Expected string/)
})

t.test('SIGTERM drains and stops the stdio MCP servers', async (t) => {
  const dir = tempDir(t)
  const log = join(dir, 'fixture.log')
  writeFileSync(log, '')
  const file = join(dir, 'mcp.json')
  writeFileSync(file, JSON.stringify({ mcpServers: { misbehaving: { command: process.execPath, args: [misbehaving], env: { MCP_FIXTURE_LOG: log } } } }))
  t.teardown(() => {
    // Whatever happened, no fixture process outlives the test.
    for (const [, pid] of readFileSync(log, 'utf8').matchAll(/started (\d+)/g)) {
      try {
        process.kill(Number(pid), 'SIGKILL')
      } catch {
        // already gone
      }
    }
  })
  // Start-up under a loaded machine (7 agents on 2 cores) can take a while.
  const server = await startServer({ AGENTD_DB: ':memory:', AGENTD_WORKSPACES: join(dir, 'ws'), AGENTD_MCP_CONFIG: file }, 60_000)
  t.teardown(() => server.child.kill('SIGKILL'))
  const listed = await (await fetch(`${server.url}/v1/tools`)).json() as { servers: Array<{ state: string }> }
  t.match(listed.servers, [{ state: 'up' }], 'the server is up once agentd listens')
  const pid = Number(/started (\d+)/.exec(readFileSync(log, 'utf8'))?.[1])
  t.ok(pid > 0)
  server.child.kill('SIGTERM')
  t.match(await server.exited, { code: 0 })
  await until(async () => {
    try {
      process.kill(pid, 0)
      return false
    } catch {
      return true
    }
  }, 5000, 'the MCP server process to be gone')
  t.pass('the MCP server process is gone')
})
