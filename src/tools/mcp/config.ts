import { readFileSync } from 'node:fs'
import { resolve, dirname } from 'node:path'
import { Type } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'

/** A server agentd starts as a child process and talks to over stdin/stdout. */
export interface McpStdioServerConfig {
  name: string
  transport: 'stdio'
  command: string
  args: string[]
  /** Added to the small default environment (PATH, HOME, …); agentd's own variables are not passed on. */
  env: Record<string, string>
  cwd: string | undefined
}

/** A server agentd reaches over Streamable HTTP. */
export interface McpHttpServerConfig {
  name: string
  transport: 'http'
  url: string
  headers: Record<string, string>
}

export type McpServerConfig = McpStdioServerConfig | McpHttpServerConfig

/** The MCP config file cannot be used; the message is one line naming the file and the entry. */
export class McpConfigError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'McpConfigError'
  }
}

/**
 * Server names become the prefix of tool names (`<server>__<tool>`), which the model's function
 * names restrict to [A-Za-z0-9_-]; `__` inside a name would make the split ambiguous.
 */
const SERVER_NAME = /^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$/
const MAX_SERVER_NAME = 32

const StringMap = Type.Record(Type.String(), Type.String())
const StdioEntrySchema = Type.Object({
  command: Type.String({ minLength: 1 }),
  args: Type.Optional(Type.Array(Type.String())),
  env: Type.Optional(StringMap),
  cwd: Type.Optional(Type.String({ minLength: 1 }))
}, { additionalProperties: false })
const HttpEntrySchema = Type.Object({
  url: Type.String({ pattern: '^https?://' }),
  headers: Type.Optional(StringMap),
  // Some clients' files say which transport a url entry uses; only Streamable HTTP is spoken here.
  type: Type.Optional(Type.Union([Type.Literal('http'), Type.Literal('streamable-http'), Type.Literal('streamableHttp')]))
}, { additionalProperties: false })

/**
 * Reads an `{"mcpServers": {...}}` file. Relative `cwd` values are taken from the file's folder.
 * Throws McpConfigError with one line that names the file and the first bad entry.
 */
export function readMcpConfig(path: string): McpServerConfig[] {
  const where = `AGENTD_MCP_CONFIG=${JSON.stringify(path)}`
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch (err) {
    throw new McpConfigError(`${where} is invalid: the file cannot be read (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`)
  }
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch (err) {
    throw new McpConfigError(`${where} is invalid: the file is not JSON (${(err as Error).message})`)
  }
  const servers = typeof json === 'object' && json !== null && !Array.isArray(json) ? (json as { mcpServers?: unknown }).mcpServers : undefined
  if (typeof servers !== 'object' || servers === null || Array.isArray(servers)) {
    throw new McpConfigError(`${where} is invalid: expected an object {"mcpServers": {"<name>": {...}}}`)
  }
  const folder = dirname(resolve(path))
  return Object.entries(servers).map(([name, entry]) => parseEntry(where, folder, name, entry))
}

function parseEntry(where: string, folder: string, name: string, entry: unknown): McpServerConfig {
  const bad = (problem: string) => new McpConfigError(`${where} is invalid: mcpServers.${name} ${problem}`)
  if (!SERVER_NAME.test(name) || name.length > MAX_SERVER_NAME) {
    throw bad(`has a bad name: use up to ${MAX_SERVER_NAME} of A-Z a-z 0-9 - _ without "__" (tools are named <server>__<tool>)`)
  }
  if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) throw bad('must be an object')
  const isStdio = 'command' in entry
  if (isStdio === 'url' in entry) throw bad('must have either "command" (stdio) or "url" (Streamable HTTP)')
  const schema = isStdio ? StdioEntrySchema : HttpEntrySchema
  const error = Value.Errors(schema, entry).First()
  if (error) {
    const field = error.path === '' ? '' : `.${error.path.slice(1).replace(/\//g, '.')}`
    throw new McpConfigError(`${where} is invalid: mcpServers.${name}${field}: ${error.message}`)
  }
  if (isStdio) {
    const e = entry as { command: string; args?: string[]; env?: Record<string, string>; cwd?: string }
    return { name, transport: 'stdio', command: e.command, args: e.args ?? [], env: e.env ?? {}, cwd: e.cwd === undefined ? undefined : resolve(folder, e.cwd) }
  }
  const e = entry as { url: string; headers?: Record<string, string> }
  try {
    new URL(e.url)
  } catch {
    throw bad(`.url is not a valid URL`)
  }
  return { name, transport: 'http', url: e.url, headers: e.headers ?? {} }
}
