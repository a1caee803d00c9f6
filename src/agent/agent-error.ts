/** Conflicts and lookups the agent core reports; the HTTP layer maps `code` to its envelope. */
export type AgentErrorCode = 'SESSION_NOT_FOUND' | 'RUN_NOT_FOUND' | 'SESSION_BUSY' | 'NO_ACTIVE_RUN' | 'NOT_AWAITING' | 'UNAVAILABLE' | 'LIMIT_EXCEEDED'

/** An expected failure of a request to the agent core (not a bug). */
export class AgentError extends Error {
  readonly code: AgentErrorCode
  readonly details: Record<string, unknown> | undefined
  constructor(code: AgentErrorCode, message: string, details?: Record<string, unknown>) {
    super(message)
    this.name = 'AgentError'
    this.code = code
    this.details = details
  }
}
