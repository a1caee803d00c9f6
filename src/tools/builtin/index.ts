import type { Tool } from '../types.ts'
import { createBashRunTool } from './bash-run.ts'
import { createFsEditTool } from './fs-edit.ts'
import { createFsGlobTool } from './fs-glob.ts'
import { createFsGrepTool } from './fs-grep.ts'
import { createFsListTool } from './fs-list.ts'
import { createFsReadTool } from './fs-read.ts'
import { createFsWriteTool } from './fs-write.ts'
import { createHttpFetchTool } from './http-fetch.ts'

/** SPEC 3: what a session gets when it names no tools. */
export const DEFAULT_TOOL_NAMES = ['fs_read', 'fs_write', 'fs_edit', 'fs_list', 'fs_glob', 'fs_grep'] as const

export interface BuiltinToolOptions {
  /** bash_run is offered only when the server enables it (SPEC 7). */
  bashEnabled: boolean
  httpFetch: {
    /** Reach loopback, private and link-local addresses too (development only). */
    allowPrivate: boolean
    /** Hosts (`host` or `host:port`) reachable even though they resolve to such addresses. */
    allowedHosts?: readonly string[]
    /** Bytes of one result as JSON, the body cut to fit; default maxOutputBytes, the runtime's cap. */
    maxBytes?: number
    /** Per-hop connect/headers/body timeout; default 30 s. */
    timeoutMs?: number
  }
  /** Bytes of file content or command output one call returns; default 100 000. */
  maxOutputBytes?: number
}

/** The built-in tools this server offers, configured from server options. */
export function createBuiltinTools(opts: BuiltinToolOptions): Tool[] {
  const maxOutputBytes = opts.maxOutputBytes ?? 100_000
  const tools: Tool[] = [
    createFsReadTool({ maxBytes: maxOutputBytes }),
    createFsWriteTool(),
    createFsEditTool({ maxFileBytes: 10 * 1024 * 1024 }),
    createFsListTool({ maxEntries: 1000, maxBytes: maxOutputBytes }),
    createFsGlobTool({ maxResults: 1000, maxBytes: maxOutputBytes }),
    createFsGrepTool({ maxFileBytes: 5 * 1024 * 1024, maxHeapMb: 128, maxBytes: maxOutputBytes }),
    createHttpFetchTool({
      allowPrivate: opts.httpFetch.allowPrivate,
      allowedHosts: opts.httpFetch.allowedHosts ?? [],
      maxBytes: opts.httpFetch.maxBytes ?? maxOutputBytes,
      timeoutMs: opts.httpFetch.timeoutMs ?? 30_000,
      maxRedirects: 5
    })
  ]
  if (opts.bashEnabled) {
    tools.push(createBashRunTool({ maxOutputBytes, killAfterBytes: Math.max(16 * maxOutputBytes, 1024 * 1024) }))
  }
  return tools
}
