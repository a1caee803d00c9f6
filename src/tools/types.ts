import type { TSchema, Static } from '@sinclair/typebox'
import type { Logger } from 'pino'
import type { RecommendFn, ToolFailure } from './tool-errors.ts'

/** What a tool's execute() gets besides its (already validated) input. SPEC 7. */
export interface ToolContext {
  /** Aborted on timeout or interrupt; long work must stop when it fires. */
  signal: AbortSignal
  sessionId: string
  callId: string
  /** Absolute, realpath'ed root of the session's workspace folder. */
  workspace: string
  logger: Logger
  /** Emits a custom progress event on the session's stream. */
  emit: (type: string, data: Record<string, unknown>) => void
}

/**
 * A tool the model can call. Returning `{ok: false, ...}` is a logical failure;
 * throwing is a runtime failure; the runtime turns both into a ClassifiedError.
 */
export interface Tool<S extends TSchema = TSchema> {
  name: string
  description: string
  parameters: S
  execute(input: Static<S>, ctx: ToolContext): Promise<unknown>
  /**
   * The tool only reads (the workspace): running it changes nothing a crash could leave half
   * done, so a run may start it at once and commit its `tool:start` with its answer, as one unit
   * (Decisions, "What a run waits for"). Leave it unset for anything that writes, runs commands
   * or calls out: such a tool runs only once its start is stored.
   */
  readOnly?: boolean
  /**
   * The tool's advice to the model on its own failures (by code and `reason`), including those the
   * runtime reports for it (TIMEOUT); undefined for a failure leaves it to the code's general advice.
   */
  recommend?: RecommendFn
  /**
   * A whole-schema check of the input, for parameters the runtime's check passes through (an MCP
   * tool's allOf, $ref or pattern): execute() runs it itself, and a preToolUse hook's rewritten
   * input is held to it before the call goes on, so a bad rewrite names the hook.
   */
  checkInput?: (input: unknown) => ToolFailure | null
}
