import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import t from 'tap'
import { startServer } from './helpers/server-process.ts'

// The import direction of the core (README, "Where error knowledge lives"): errors/ at the bottom,
// tools/ and model/ above it, agent/ on top. A cycle or an upward import fails here, not in review.

const src = path.resolve(import.meta.dirname, '../src')

/** Every folder of src/ that a file of `folder` imports from (relative imports only). */
function importedFolders(folder: string): Map<string, string[]> {
  const found = new Map<string, string[]>()
  const dir = path.join(src, folder)
  for (const entry of readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile() || !entry.name.endsWith('.ts')) continue
    const file = path.join(entry.parentPath, entry.name)
    const text = readFileSync(file, 'utf8')
    for (const [, specifier] of text.matchAll(/(?:^|\n)\s*(?:import|export)\s[^'"]*?from\s+'([^']+)'/g)) {
      if (!specifier?.startsWith('.')) continue
      const target = path.relative(src, path.resolve(path.dirname(file), specifier))
      const top = target.includes(path.sep) ? target.split(path.sep)[0] : target
      if (top === undefined || top === folder) continue
      found.set(top, [...(found.get(top) ?? []), path.relative(src, file)])
    }
  }
  return found
}

t.test('errors/ imports nothing of agentd but the shared schemas', async (t) => {
  t.same([...importedFolders('errors').keys()].filter((f) => f !== 'schemas'), [])
})

t.test('tools/ and model/ never import agent/, and not each other', async (t) => {
  const tools = importedFolders('tools')
  const model = importedFolders('model')
  t.notOk(tools.has('agent'), `tools/ → agent/: ${tools.get('agent')?.join(', ')}`)
  t.notOk(model.has('agent'), `model/ → agent/: ${model.get('agent')?.join(', ')}`)
  t.notOk(tools.has('model'), `tools/ → model/: ${tools.get('model')?.join(', ')}`)
  t.notOk(model.has('tools'), `model/ → tools/: ${model.get('tools')?.join(', ')}`)
})

t.test('the import scan sees the imports it is meant to check', async (t) => {
  const agent = importedFolders('agent')
  t.ok(agent.has('tools') && agent.has('model') && agent.has('errors'), 'agent/ imports tools/, model/ and errors/')
})

t.test('one process on SQLite without Redis never loads pg or ioredis', async (t) => {
  // They cost ~6 MB of heap and 0.1-0.2 s of start-up, and are loaded only for PostgreSQL or Redis.
  const loader = path.resolve(import.meta.dirname, 'fixtures/loader/report-loads.mjs')
  const dir = mkdtempSync(path.join(tmpdir(), 'agentd-loads-'))
  const server = await startServer({
    AGENTD_DB: path.join(dir, 'agentd.db'), AGENTD_WORKSPACES: path.join(dir, 'workspaces'), NODE_OPTIONS: `--import=${loader}`
  })
  t.teardown(() => {
    server.child.kill('SIGKILL')
    rmSync(dir, { recursive: true, force: true })
  })
  const session = await fetch(`${server.url}/v1/sessions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })
  t.equal(session.status, 201)
  const loaded = server.lines.filter((line) => line.startsWith('loaded ')).map((line) => line.slice('loaded '.length))
  t.ok(loaded.includes('fastify'), 'the loader sees the packages the process loads')
  t.same(loaded.filter((name) => name === 'pg' || name === 'ioredis'), [])
})
