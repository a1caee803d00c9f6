import type { Logger } from 'pino'
import type { Tool } from '../types.ts'
import type { McpServerConfig } from './config.ts'
import { McpConnection, type McpConnectionOptions, type McpServerStatus } from './connection.ts'

export type McpServersOptions = Omit<McpConnectionOptions, 'logger'>

export const DEFAULT_MCP_OPTIONS: McpServersOptions = {
  connectTimeoutMs: 30_000,
  backoffBaseMs: 1000,
  backoffCapMs: 30_000,
  maxMessageBytes: 16 * 1024 * 1024,
  killGraceMs: 2000
}

/** What a session's selection item means for MCP tools (see select()). */
export type McpSelection = { tools: Tool[] } | { problem: string }

/** The configured MCP servers: their connections, their tools as one list, and the resolution of `<server>__…` names. */
export class McpServers {
  readonly #connections = new Map<string, McpConnection>()

  constructor(configs: readonly McpServerConfig[], logger: Logger, options: Partial<McpServersOptions> = {}) {
    for (const config of configs) {
      this.#connections.set(config.name, new McpConnection(config, { ...DEFAULT_MCP_OPTIONS, ...options, logger }))
    }
  }

  /** Connects every server once; resolves when each first attempt has ended (a server that failed is retried in the background). */
  async start(): Promise<void> {
    await Promise.all([...this.#connections.values()].map((c) => c.start()))
  }

  /** Stops every server (stdio process groups included). */
  async stop(): Promise<void> {
    await Promise.all([...this.#connections.values()].map((c) => c.stop()))
  }

  /** Every tool of every server that is up. */
  list(): Tool[] {
    return [...this.#connections.values()].flatMap((c) => c.tools)
  }

  status(): McpServerStatus[] {
    return [...this.#connections.values()].map((c) => c.status())
  }

  /** The server a tool name or `<server>__*` pattern belongs to. */
  serverOf(item: string): string | undefined {
    const at = item.indexOf('__')
    if (at <= 0) return undefined
    const server = item.slice(0, at)
    return this.#connections.has(server) ? server : undefined
  }

  /**
   * Resolves one selection item of a configured server (undefined for any other item):
   * `<server>__*` is every tool the server has now; `<server>__<tool>` is that tool. While the
   * server is not up its tools are unknown, so a name is accepted and resolves to nothing until
   * the server is back; when it is up, a name it does not offer is a problem.
   */
  select(item: string): McpSelection | undefined {
    const server = this.serverOf(item)
    if (server === undefined) return undefined
    const connection = this.#connections.get(server) as McpConnection
    if (item === `${server}__*`) return { tools: [...connection.tools] }
    const tool = connection.tools.find((t) => t.name === item)
    if (tool) return { tools: [tool] }
    if (connection.state !== 'up') return { tools: [] }
    const names = connection.tools.map((t) => t.name)
    return { problem: `unknown tool ${item}; the MCP server ${server} offers ${names.join(', ') || 'no tools'}` }
  }
}
