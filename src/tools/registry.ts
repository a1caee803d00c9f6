import type { TSchema } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import { ClientToolSpecSchema, WebhookToolSpecSchema, type ClientToolSpec, type ToolSpec } from '../schemas/tools.ts'
import { DEFAULT_TOOL_NAMES } from './builtin/index.ts'
import { ToolSpecError, parametersFromJsonSchema, plainJsonSchema } from './json-schema.ts'
import type { Tool } from './types.ts'
import { createWebhookTool, type WebhookOptions } from './webhook.ts'

export { ClientToolSpecSchema, ToolSchema, WebhookToolSpecSchema, type ClientToolSpec, type ToolSpec, type WebhookToolSpec } from '../schemas/tools.ts'

/**
 * A tool the client runs itself (SPEC 7): there is no execute; the loop pauses in
 * `awaiting_tool_result` when the model calls it.
 */
export interface ClientTool {
  kind: 'client'
  name: string
  description: string
  parameters: TSchema
}

/** What a session's selection resolves to: tools the service runs, and client tools it waits for. */
export type SessionTool = Tool | ClientTool

/** True for a client-side tool, which the loop must pause for instead of running. */
export function isClientTool(tool: SessionTool): tool is ClientTool {
  return (tool as { kind?: unknown }).kind === 'client'
}

/** `{name, description, parameters}` with parameters as plain JSON Schema: for GET /v1/tools and the model's tool list. */
export interface ToolInfo {
  name: string
  description: string
  parameters: Record<string, unknown>
}

const described = new WeakMap<object, ToolInfo>()

/** The tool as the model and clients see it. */
export function describeTool(tool: SessionTool): ToolInfo {
  let info = described.get(tool)
  if (!info) {
    info = { name: tool.name, description: tool.description, parameters: plainJsonSchema(tool.parameters) }
    described.set(tool, info)
  }
  return info
}

/** Builds a client tool from its spec; throws ToolSpecError when its parameters cannot be checked. */
export function createClientTool(spec: Omit<ClientToolSpec, 'type'>): ClientTool {
  return { kind: 'client', name: spec.name, description: spec.description, parameters: parametersFromJsonSchema(spec.parameters) }
}

/** One reason a session's `tools` cannot be used; `field` is relative to the request body, e.g. `tools[2].url`. */
export interface ToolSelectionProblem {
  field: string
  message: string
}

export type ToolSelection = { ok: true; tools: SessionTool[] } | { ok: false; problems: ToolSelectionProblem[] }

/** Tools that come and go while the service runs (MCP servers), offered next to the registered ones. */
export interface DynamicTools {
  /** Every such tool now. */
  list(): Tool[]
  /** The tools one selection item names (several for a pattern); undefined when the item is none of this source's names. */
  select(item: string): { tools: Tool[] } | { problem: string } | undefined
}

export interface ResolveOptions {
  /** Leave out the items that cannot be resolved instead of failing (a stored selection, resolved again for a run). */
  skipProblems?: boolean
}

export interface ToolRegistryOptions {
  /** Allowed hosts and limits of webhook tools. */
  webhook: WebhookOptions
  /** Names a session gets when it names no tools; default the fs_* built-ins (SPEC 3). */
  defaultToolNames?: readonly string[]
  /** MCP servers' tools. */
  dynamic?: DynamicTools
}

/** The tools this server offers, and the resolution of a session's `tools` selection against them. */
export class ToolRegistry {
  private readonly tools = new Map<string, Tool>()
  private readonly webhook: WebhookOptions
  private readonly defaultToolNames: readonly string[]
  private readonly dynamic: DynamicTools | undefined

  constructor(options: ToolRegistryOptions) {
    this.webhook = options.webhook
    this.defaultToolNames = options.defaultToolNames ?? DEFAULT_TOOL_NAMES
    this.dynamic = options.dynamic
  }

  /** Adds a server tool; a second tool with the same name is a programming error. */
  register(tool: Tool): this {
    if (this.tools.has(tool.name)) throw new Error(`A tool named ${tool.name} is already registered`)
    this.tools.set(tool.name, tool)
    return this
  }

  /** The server tool of that name. */
  get(name: string): Tool | undefined {
    return this.tools.get(name) ?? this.dynamic?.list().find((tool) => tool.name === name)
  }

  /** Names of every server tool: registered ones in registration order, then the MCP servers' tools. */
  names(): string[] {
    return this.all().map((tool) => tool.name)
  }

  /** What a problem naming an unknown tool tells the client it could name instead. */
  offered(): string {
    return `this server offers ${this.names().join(', ') || 'no tools'}`
  }

  /** Every server tool, as GET /v1/tools shows it. */
  list(): ToolInfo[] {
    return this.all().map(describeTool)
  }

  private all(): Tool[] {
    return [...this.tools.values(), ...(this.dynamic?.list() ?? [])]
  }

  /** The tools of a session that names none: the registered ones among the default names. */
  defaults(): Tool[] {
    return this.defaultToolNames.flatMap((name) => this.tools.get(name) ?? [])
  }

  /**
   * Resolves a session's `tools`: undefined → defaults(), names → registered tools, specs →
   * webhook or client tools, `<server>__*` → all tools of that MCP server. Every problem is
   * reported (unknown name, duplicate, host not allowed, unusable schema), not only the first.
   */
  resolveSelection(selection: readonly (string | ToolSpec)[] | undefined, options: ResolveOptions = {}): ToolSelection {
    if (selection === undefined) return { ok: true, tools: this.defaults() }
    const tools: SessionTool[] = []
    const problems: ToolSelectionProblem[] = []
    const seen = new Set<string>()
    selection.forEach((item, i) => {
      const field = `tools[${i}]`
      const resolved = this.resolveOne(item, field)
      if ('problem' in resolved) {
        problems.push(resolved.problem)
        return
      }
      for (const tool of resolved.tools) {
        if (seen.has(tool.name)) {
          problems.push({ field, message: `the tool name ${tool.name} is used twice` })
          continue
        }
        seen.add(tool.name)
        tools.push(tool)
      }
    })
    return problems.length > 0 && !options.skipProblems ? { ok: false, problems } : { ok: true, tools }
  }

  private resolveOne(item: string | ToolSpec, field: string): { tools: SessionTool[] } | { problem: ToolSelectionProblem } {
    if (typeof item === 'string') {
      const tool = this.tools.get(item)
      if (tool) return { tools: [tool] }
      const dynamic = this.dynamic?.select(item)
      if (dynamic && 'tools' in dynamic) return dynamic
      if (dynamic) return { problem: { field, message: dynamic.problem } }
      return { problem: { field, message: `unknown tool ${item}; ${this.offered()}` } }
    }
    try {
      if (Value.Check(WebhookToolSpecSchema, item)) return { tools: [createWebhookTool(item, this.webhook)] }
      if (Value.Check(ClientToolSpecSchema, item)) return { tools: [createClientTool(item)] }
    } catch (err) {
      if (err instanceof ToolSpecError) return { problem: { field: `${field}.${err.field}`, message: err.reason } }
      throw err
    }
    return { problem: { field, message: 'must be a tool name, a webhook tool spec or a client tool spec' } }
  }
}
