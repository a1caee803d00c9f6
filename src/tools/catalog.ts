import type { ChatCompletionTool } from 'openai/resources/chat/completions'
import { pino, type Logger } from 'pino'
import type { Config } from '../config.ts'
import type { ToolSpec } from '../schemas/tools.ts'
import type { SessionRecord } from '../store/store.ts'
import { createBuiltinTools, DEFAULT_TOOL_NAMES } from './builtin/index.ts'
import { checkToolInput } from './json-schema.ts'
import { describeTool, isClientTool, ToolRegistry, type ToolInfo, type ToolSelectionProblem } from './registry.ts'
import type { McpServerStatus } from './mcp/connection.ts'
import type { McpServers, McpServersOptions } from './mcp/servers.ts'
import { answerOutcome, createConcurrencyLimiter, runTool } from './runtime.ts'
import type { ExecuteTool, SessionTool, SessionToolSet } from './tool-set.ts'
import { createWebhookDispatcher } from './webhook.ts'
import { ensureWorkspace, removeWorkspace } from './workspace.ts'
import { wholeCharEnd } from '../whole-chars.ts'

/** A tool selection the server cannot honour (unknown name, host not allowed, bad schema). */
export class ToolSelectionError extends Error {
  readonly problems: ToolSelectionProblem[]
  constructor(problems: ToolSelectionProblem[]) {
    super(problems.map((p) => `${p.field} ${p.message}`).join('; '))
    this.problems = problems
  }
}

export interface ToolCatalogOptions {
  /** Bytes of one tool result the model gets; longer results are cut with a note. */
  maxOutputBytes?: number
  /** Tool calls of one session that may run at once. */
  perSessionConcurrency?: number
  /** Where MCP servers' state changes and stderr are logged. */
  logger?: Logger
  /** MCP connection limits and reconnect backoff (tests shorten them). */
  mcp?: Partial<McpServersOptions>
}

/**
 * The bridge between sessions and the tools layer: checks a session's selection when it is
 * created, resolves it for each run, and executes server-side calls in the isolation runtime
 * inside the session's workspace.
 */
export class ToolCatalog {
  readonly defaultNames: string[] = [...DEFAULT_TOOL_NAMES]
  readonly registry: ToolRegistry
  readonly #options: ToolCatalogOptions
  /** The MCP servers of AGENTD_MCP_CONFIG, once start() has loaded them; undefined when there are none. */
  #mcp: McpServers | undefined
  readonly #config: Readonly<Config>
  readonly #maxOutputBytes: number
  readonly #limiter: ReturnType<typeof createConcurrencyLimiter>
  /** Workspaces being made, by session: a session's removal waits for them, so none is made after it. */
  readonly #making = new Map<string, Promise<unknown>>()
  /** Workspaces made when their session was created (prepareWorkspace), each taken by the session's first run; null: none was needed. */
  readonly #prepared = new Map<string, Promise<string | null>>()
  /** The connections of every webhook tool's calls; closed with the catalog. */
  readonly #webhookDispatcher = createWebhookDispatcher()

  constructor(config: Readonly<Config>, options: ToolCatalogOptions = {}) {
    this.#config = config
    this.#maxOutputBytes = options.maxOutputBytes ?? 100_000
    this.#limiter = createConcurrencyLimiter(options.perSessionConcurrency ?? 4)
    this.#options = options
    this.registry = new ToolRegistry({
      webhook: { allowedHosts: config.webhookHosts, dispatcher: this.#webhookDispatcher },
      dynamic: { list: () => this.#mcp?.list() ?? [], select: (item) => this.#mcp?.select(item) }
    })
    for (const tool of createBuiltinTools({
      bashEnabled: config.bashEnabled,
      httpFetch: { allowPrivate: false, allowedHosts: config.fetchAllowHosts },
      maxOutputBytes: this.#maxOutputBytes
    })) {
      this.registry.register(tool)
    }
  }

  /** Connects the MCP servers; resolves once each has been tried (those that failed are retried in the background). */
  async start(): Promise<void> {
    if (this.#config.mcpServers.length === 0 || this.#mcp) return
    // The MCP SDK is loaded only when servers are configured: it is a large share of start-up time.
    const { McpServers } = await import('./mcp/servers.ts')
    this.#mcp = new McpServers(this.#config.mcpServers, this.#options.logger ?? pino({ enabled: false }), this.#options.mcp)
    await this.#mcp.start()
  }

  /** Stops the MCP servers (stdio ones with their process groups), lets the workspaces being made finish, and closes the webhook connections. */
  async close(): Promise<void> {
    await Promise.all([this.#mcp?.stop(), ...this.#making.values()])
    // The runs have ended by now (drain): a call still open would be one whose run was abandoned.
    await this.#webhookDispatcher.destroy().catch(() => undefined)
  }

  /** Each MCP server's state, for GET /v1/tools and /readyz. */
  mcpStatus(): McpServerStatus[] {
    return this.#mcp?.status() ?? []
  }

  /** Makes (or finds) a session's workspace. */
  #make(sessionId: string): Promise<string> {
    const making = ensureWorkspace(this.#config.workspaces, sessionId)
    this.#track(sessionId, making)
    return making
  }

  /** Holds a session's removal (removeWorkspace) until its workspace is made. */
  #track(sessionId: string, making: Promise<unknown>): void {
    const settled = making.then(() => undefined, () => undefined)
    this.#making.set(sessionId, settled)
    void settled.then(() => {
      if (this.#making.get(sessionId) === settled) this.#making.delete(sessionId)
    })
  }

  /** Deletes a session's workspace with its files (the session is gone). */
  async removeWorkspace(sessionId: string): Promise<void> {
    this.#prepared.delete(sessionId)
    await this.#making.get(sessionId)
    await removeWorkspace(this.#config.workspaces, sessionId)
  }

  /** GET /v1/tools: every server tool with its JSON Schema. */
  list(): Array<ToolInfo & { server?: string }> {
    return this.registry.list().map((info) => {
      const server = this.#mcp?.serverOf(info.name)
      return server === undefined ? info : { ...info, server }
    })
  }

  /** Checks a session's tool selection; returns it as it will be stored (null = server defaults). */
  async validateSelection(selection: Array<string | ToolSpec> | undefined): Promise<Array<string | ToolSpec> | null> {
    if (selection === undefined) return null
    const resolved = this.registry.resolveSelection(selection)
    if (!resolved.ok) throw new ToolSelectionError(resolved.problems)
    return selection
  }

  /**
   * The entries of a new session's `approval.tools` that no tool of a session on this server can
   * answer to: not a built-in, not one of the session's own client or webhook tools, not a tool
   * of a configured MCP server, and not a pattern (`fs_*`, `github__*`). Such an entry is a typo
   * (`fs_writ`) and, taken as it was, left the tool it meant running without approval. A built-in
   * the session did not select is a name a client's policy may hold, and is taken.
   */
  approvalProblems(approval: { mode: string; tools?: string[] } | undefined, selection: Array<string | ToolSpec> | null): ToolSelectionProblem[] {
    if (approval?.mode !== 'tools' || !approval.tools?.length) return []
    const own = (selection ?? []).flatMap((item) => (typeof item === 'string' ? [] : [item.name]))
    const known = new Set([...this.registry.names(), ...own])
    const problems: ToolSelectionProblem[] = []
    approval.tools.forEach((name, i) => {
      if (name.endsWith('*') || known.has(name) || this.#mcp?.serverOf(name) !== undefined) return
      const brought = own.length > 0 ? `, the session brings ${own.join(', ')}` : ''
      problems.push({ field: `approval.tools[${i}]`, message: `unknown tool ${name}; ${this.registry.offered()}${brought}` })
    })
    return problems
  }

  /** The tools of one session, as its runs offer them to the model. */
  async resolve(session: SessionRecord): Promise<SessionToolSet> {
    // A stored selection was valid when the session was created; a later change (a webhook host
    // removed, an MCP server down or without that tool now) drops that tool, not the others.
    const resolved = this.registry.resolveSelection((session.tools ?? undefined) as Array<string | ToolSpec> | undefined, { skipProblems: true })
    const tools = resolved.ok ? resolved.tools : []
    const byName = new Map<string, SessionTool>()
    const definitions: ChatCompletionTool[] = []
    for (const tool of tools) {
      const info = describeTool(tool)
      definitions.push(definitionOf(info))
      byName.set(
        tool.name,
        isClientTool(tool)
          ? {
              kind: 'client', name: tool.name, description: tool.description, parameters: info.parameters,
              check: (input) => checkToolInput(tool.name, tool.parameters, input),
              outcomeOf: (output) => answerOutcome({ name: tool.name }, output, this.#maxOutputBytes)
            }
          : { kind: 'server', name: tool.name, tool }
      )
    }
    return { names: [...byName.keys()], definitions, get: (name) => byName.get(name) }
  }

  /**
   * Makes a new session's workspace, when its tools include a server tool, for its first run to
   * find. Called as the session's 201 goes out, it starts the folder's creation at the next check
   * phase, once the answer is written: its call into libuv's thread pool (20-60 µs of the event
   * loop, then ~0.1 ms of file-system journal on the pool) falls between the session's creation
   * and its first message instead of at the run's start. A removal of the session waits for it
   * (#making). Should it fail, the first run makes the folder itself.
   */
  prepareWorkspace(session: SessionRecord): void {
    if (this.#prepared.size >= 10_000) this.#prepared.clear()
    const making = (async () => {
      await new Promise<void>((resolve) => setImmediate(resolve))
      return hasServerTool(await this.resolve(session)) ? ensureWorkspace(this.#config.workspaces, session.id) : null
    })()
    // #track handles its failure too: the first run then makes the folder itself.
    this.#track(session.id, making)
    this.#prepared.set(session.id, making)
  }

  /** Executes the server-side tool calls of one session (its tools as resolve() gave them) in the isolation runtime. */
  async executor(session: SessionRecord, tools: SessionToolSet, logger: Logger): Promise<ExecuteTool> {
    // The session's first run takes the workspace made with the session; later runs make sure of it themselves.
    let prepared = this.#prepared.get(session.id)
    this.#prepared.delete(session.id)
    let workspace: Promise<string> | undefined
    const ensure = () => {
      if (workspace) return workspace
      const making = prepared ? prepared.then((root) => root ?? this.#make(session.id)) : this.#make(session.id)
      prepared = undefined
      workspace = making.catch((err: unknown) => {
        workspace = undefined
        throw err
      })
      return workspace
    }
    // A run that may call a server tool has its workspace made (or found) while the model answers:
    // a new folder is a file-system journal write (~0.1 ms) that would otherwise be the first
    // tool call's. Should it fail, the first call tries again and fails classified.
    if (hasServerTool(tools)) ensure().catch(() => undefined)
    const timeoutMs = Math.min(session.limits.toolTimeoutMs ?? this.#config.toolTimeoutMs, this.#config.toolTimeoutMs)
    return async (call, signal, emit) => {
      const entry = tools.get(call.name)
      if (!entry || entry.kind !== 'server') throw new Error(`${call.name} is not a server tool of this session`)
      const root = await ensure()
      const outcome = await this.#limiter.run(session.id, () =>
        runTool(entry.tool, call.input, {
          signal, sessionId: session.id, callId: call.id, workspace: root, logger: logger.child({ callId: call.id, tool: call.name }),
          emit: (type, data) => void emit(type, data)
        }, { timeoutMs, maxOutputBytes: this.#maxOutputBytes }), signal)
      return outcome.ok ? { ok: true, result: outcome.result } : { ok: false, error: outcome.error }
    }
  }
}

function hasServerTool(tools: SessionToolSet): boolean {
  return tools.names.some((name) => tools.get(name)?.kind === 'server')
}

const definitions = new WeakMap<ToolInfo, ChatCompletionTool>()

/**
 * A tool's definition as the model is offered it: one object per described tool, so that every
 * run offering the tool hands the provider the same object and its JSON is made only once
 * (model/request-json.ts). Never changed after it is made.
 */
function definitionOf(info: ToolInfo): ChatCompletionTool {
  let definition = definitions.get(info)
  if (!definition) {
    definition = { type: 'function', function: { name: info.name, description: modelDescription(info.description), parameters: info.parameters } }
    definitions.set(info, definition)
  }
  return definition
}

/**
 * The longest function description OpenAI's chat completions accept: a longer one fails the
 * whole request (400 "string too long"), so one long description of an MCP server's tool would
 * fail every model call of every session that selects it. The parameters' descriptions are not
 * capped that way and are left as written.
 */
const MAX_MODEL_DESCRIPTION = 1024

/** A description as the model gets it: cut to MAX_MODEL_DESCRIPTION UTF-16 units with "…", never inside a surrogate pair. GET /v1/tools shows it whole. */
function modelDescription(description: string): string {
  if (description.length <= MAX_MODEL_DESCRIPTION) return description
  return `${description.slice(0, wholeCharEnd(description, MAX_MODEL_DESCRIPTION - 1))}…`
}
