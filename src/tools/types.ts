import type { TSchema, Static } from '@sinclair/typebox'
import type { Logger } from 'pino'

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
}
