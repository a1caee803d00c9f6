import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import t from 'tap'

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
