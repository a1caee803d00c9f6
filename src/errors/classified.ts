import type { ClassifiedError, ErrorType } from '../schemas/common.ts'

// The bottom of the error vocabulary: tools/, model/ and agent/ build their ClassifiedErrors here,
// and this module imports nothing of theirs.

/** SPEC 5.1 table: the default `retryable` of each errorType. */
export const RETRYABLE_BY_ERROR_TYPE: Readonly<Record<ErrorType, boolean>> = Object.freeze({
  validation: false,
  runtime: true,
  logical: true,
  aborted: false,
  exception: true
})

export interface ClassifiedInit {
  errorType: ErrorType
  code: string
  message: string
  retryable?: boolean
  fatal?: boolean
  recommendations?: string[]
  detail?: Record<string, unknown>
}

/** Builds a ClassifiedError; `retryable` defaults per errorType (SPEC 5.1), `fatal` to false as for tool errors. */
export function classified(init: ClassifiedInit): ClassifiedError {
  const error: ClassifiedError = {
    errorType: init.errorType,
    code: init.code,
    message: init.message,
    retryable: init.retryable ?? RETRYABLE_BY_ERROR_TYPE[init.errorType],
    fatal: init.fatal ?? false,
    recommendations: init.recommendations ?? []
  }
  if (init.detail !== undefined) error.detail = init.detail
  return error
}

export type ExceptionPhase = 'model' | 'tool' | 'sandbox' | 'system'

/**
 * An unexpected failure of the service itself around a tool or model call (errorType exception).
 * Around a tool the run goes on and the model sees it; elsewhere it ends the run unless `fatal` says otherwise.
 */
export function classifyException(err: unknown, phase: ExceptionPhase, options: { fatal?: boolean } = {}): ClassifiedError {
  const reason = err instanceof Error ? err.message : describeThrown(err)
  return classified({
    errorType: 'exception',
    code: 'UNKNOWN',
    message: `Unexpected ${phase} failure in the service: ${reason}`,
    fatal: options.fatal ?? !(phase === 'tool' || phase === 'sandbox'),
    recommendations: [
      'This failure came from the service, not from the arguments; the same call may succeed if retried.',
      'If it keeps failing, report it with the request id from the service logs.'
    ],
    detail: { phase, name: err instanceof Error ? err.name : typeof err }
  })
}

/** A short description of a thrown value that is not an Error: a string (quoted, cut at 200 characters) or its type. */
export function describeThrown(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value.length > 200 ? value.slice(0, 200) : value)
  return value === null ? 'null' : typeof value
}
