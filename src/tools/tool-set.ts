import type { ChatCompletionTool } from 'openai/resources/chat/completions'
import type { ClassifiedError } from '../schemas/common.ts'
import type { ToolCallRecord } from '../store/store.ts'
import type { Tool } from './types.ts'

/** A tool as one session sees it: run by the service, or by the client (the run pauses for it). */
export type SessionTool =
  | { kind: 'server'; name: string; tool: Tool }
  | {
      kind: 'client'
      name: string
      description: string
      parameters: Record<string, unknown>
      /** Checks the model's arguments against the parameters before the run pauses; null when valid. */
      check(input: unknown): ClassifiedError | null
      /**
       * The call's outcome from the client's output, as runTool makes one from a server tool's
       * result: `{ok: false, …}` is the tool's logical failure, anything else its result, cut with
       * a note like any tool's (AGENTD_TOOL_MAX_OUTPUT_BYTES).
       */
      outcomeOf(output: unknown): ToolOutcome
    }

/** The tools of one session: what the model is offered and how each name is run. */
export interface SessionToolSet {
  readonly names: readonly string[]
  readonly definitions: ChatCompletionTool[]
  get(name: string): SessionTool | undefined
}

/** How a tool call that the service runs is executed (the isolation runtime). */
export type ExecuteTool = (
  call: ToolCallRecord,
  signal: AbortSignal,
  /** A tool's custom progress event (ToolContext.emit), published as `tool:<type>`. */
  emit: (type: string, data: Record<string, unknown>) => Promise<unknown>
) => Promise<ToolOutcome>

/** How a tool call ended: its result, or its classified error. */
export type ToolOutcome = { ok: true; result: unknown } | { ok: false; error: ClassifiedError }

/**
 * Whether a name pattern of an operator's or a session's tool list (a hook's `tools`, a session's
 * `approval.tools`) covers a tool: the tool's name, or a prefix ending in `*` (`github__*`, `fs_*`).
 */
export function namePatternCovers(pattern: string, toolName: string): boolean {
  return pattern.endsWith('*') ? toolName.startsWith(pattern.slice(0, -1)) : pattern === toolName
}
