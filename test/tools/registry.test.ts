import t from 'tap'
import { Type } from '@sinclair/typebox'
import { createBuiltinTools } from '../../src/tools/builtin/index.ts'
import { ToolRegistry, describeTool, isClientTool } from '../../src/tools/registry.ts'
import type { Tool } from '../../src/tools/types.ts'

function registry(): ToolRegistry {
  const r = new ToolRegistry({ webhook: { allowedHosts: ['hooks.example.com'] } })
  for (const tool of createBuiltinTools({ bashEnabled: true, httpFetch: { allowPrivate: false } })) r.register(tool)
  return r
}

const clientSpec = {
  type: 'client' as const,
  name: 'pick_file',
  description: 'Ask the user to pick a file',
  parameters: { type: 'object', properties: { prompt: { type: 'string' } } }
}
const webhookSpec = {
  type: 'webhook' as const,
  name: 'weather',
  description: 'Weather',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  url: 'https://hooks.example.com/weather'
}

t.test('list() shows every server tool with plain JSON Schema parameters', async (t) => {
  const tools = registry().list()
  t.same(tools.map((tool) => tool.name), ['fs_read', 'fs_write', 'fs_edit', 'fs_list', 'fs_glob', 'fs_grep', 'http_fetch', 'bash_run'])
  for (const tool of tools) {
    t.ok(tool.description.length > 20, `${tool.name} has a description`)
    t.equal(tool.parameters['type'], 'object')
    t.same(Object.getOwnPropertySymbols(tool.parameters), [], 'no TypeBox symbols')
    t.same(JSON.parse(JSON.stringify(tool.parameters)), tool.parameters)
  }
})

t.test('omitted tools mean the fs_* built-ins; [] means none', async (t) => {
  const r = registry()
  const omitted = r.resolveSelection(undefined)
  t.same(omitted.ok && omitted.tools.map((tool) => tool.name), ['fs_read', 'fs_write', 'fs_edit', 'fs_list', 'fs_glob', 'fs_grep'])
  t.same(r.defaults().map((tool) => tool.name), ['fs_read', 'fs_write', 'fs_edit', 'fs_list', 'fs_glob', 'fs_grep'])
  t.same(r.resolveSelection([]), { ok: true, tools: [] })
})

t.test('names and specs resolve; client tools are marked for the loop to pause', async (t) => {
  const resolved = registry().resolveSelection(['fs_read', 'bash_run', webhookSpec, clientSpec])
  t.equal(resolved.ok, true)
  if (!resolved.ok) return
  t.same(resolved.tools.map((tool) => tool.name), ['fs_read', 'bash_run', 'weather', 'pick_file'])
  t.same(resolved.tools.map(isClientTool), [false, false, false, true])
  const webhook = resolved.tools[2] as Tool & { kind: string }
  t.equal(webhook.kind, 'webhook')
  t.type(webhook.execute, 'function')
  t.notOk('execute' in (resolved.tools[3] as object), 'a client tool has no execute')
  t.same(describeTool(resolved.tools[3] as Tool), { name: 'pick_file', description: 'Ask the user to pick a file', parameters: clientSpec.parameters })
})

t.test('every problem of a selection is reported with its field', async (t) => {
  const resolved = registry().resolveSelection([
    'fs_read',
    'fs_delete',
    { ...webhookSpec, url: 'https://evil.example.com/x' },
    { ...clientSpec, parameters: { type: 'object', properties: { p: { $ref: '#/x' } } } },
    'fs_read',
    { type: 'mystery', name: 'x' } as never
  ])
  t.equal(resolved.ok, false)
  if (resolved.ok) return
  t.same(resolved.problems.map((p) => p.field), ['tools[1]', 'tools[2].url', 'tools[3].parameters.properties.p', 'tools[4]', 'tools[5]'])
  t.match(resolved.problems[0]?.message, /unknown tool fs_delete; this server offers fs_read, fs_write/)
  t.match(resolved.problems[1]?.message, /evil\.example\.com is not allowed/)
  t.match(resolved.problems[2]?.message, /"\$ref" is not supported/)
  t.match(resolved.problems[3]?.message, /used twice/)
  t.match(resolved.problems[4]?.message, /must be a tool name, a webhook tool spec or a client tool spec/)
})

t.test('registering a second tool with the same name fails', async (t) => {
  const r = new ToolRegistry({ webhook: { allowedHosts: [] } })
  const tool: Tool = { name: 'x', description: 'd', parameters: Type.Object({}), execute: async () => null }
  r.register(tool)
  t.equal(r.get('x'), tool)
  t.equal(r.get('y'), undefined)
  t.throws(() => r.register(tool), /already registered/)
  t.same(r.defaults(), [], 'defaults only include registered tools')
})
