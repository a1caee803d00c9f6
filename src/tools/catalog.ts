import type { Logger } from 'pino'
import type { ExecuteTool } from '../agent/run-execution.ts'
import type { SessionToolSet } from '../agent/tool-set.ts'
import type { Config } from '../config.ts'
import type { SessionRecord } from '../store/store.ts'

/** A tool selection that names tools the server does not have. */
export class ToolSelectionError extends Error {
  readonly problems: string[]
  constructor(problems: string[]) {
    super(problems.join('; '))
    this.problems = problems
  }
}

/** The tools sessions may select, resolved per session, and how their calls are executed. */
export class ToolCatalog {
  readonly defaultNames = ['fs_read', 'fs_write', 'fs_edit', 'fs_list', 'fs_glob', 'fs_grep']
  readonly #config: Readonly<Config>

  constructor(config: Readonly<Config>) {
    this.#config = config
  }

  /** Checks a session's tool selection; returns it as it will be stored (null = server defaults). */
  async validateSelection(selection: unknown[] | undefined): Promise<unknown[] | null> {
    if (selection === undefined) return null
    const unknown = selection.filter((item) => typeof item === 'string' && !this.defaultNames.includes(item))
    if (unknown.length > 0) throw new ToolSelectionError(unknown.map((name) => `unknown tool ${String(name)}`))
    return selection
  }

  /** The tools of one session. */
  async resolve(_session: SessionRecord): Promise<SessionToolSet> {
    return { names: [], definitions: [], get: () => undefined }
  }

  /** Executes server-side tool calls of one session. */
  async executor(_session: SessionRecord, _logger: Logger): Promise<ExecuteTool> {
    void this.#config
    return async () => { throw new Error('no tools yet') }
  }
}
