import { classified, describeThrown } from '../errors/classified.ts'
import { errnoFamily, errnoOf, type ErrnoFamily } from '../errors/errno.ts'
import type { ClassifiedError, ErrorType } from '../schemas/common.ts'

/** SPEC 5.1: every code a tool error may carry. */
export const TOOL_ERROR_CODES = [
  'VALIDATION_ERROR',
  'TOOL_NOT_FOUND',
  'NOT_FOUND',
  'IO_ERROR',
  'PERMISSION_DENIED',
  'PATH_TRAVERSAL',
  'TIMEOUT',
  'RATE_LIMITED',
  'CONFIG_ERROR',
  'DENIED_BY_USER',
  'OUTPUT_TOO_LARGE',
  'UNKNOWN'
] as const
export type ToolErrorCode = (typeof TOOL_ERROR_CODES)[number]

/** One failure of a call, as a tool's `recommend` and the code table's general advice see it. */
export interface ToolFailureFacts {
  tool: string
  code: ToolErrorCode
  detail: Record<string, unknown> | undefined
  /** `detail.reason`: the tool's own name for the failure, e.g. `no_match`. */
  reason: unknown
  /** The path the failure is about: `detail.path`, else the input's `path`. */
  path: string | undefined
  input: unknown
}

/** A tool's advice on its own failures; undefined leaves them to the code's general advice. */
export type RecommendFn = (failure: ToolFailureFacts) => string[] | undefined

/** What the classifier needs of a tool: its name and, if it has any, its own advice. */
export interface ToolAdvisor {
  name: string
  recommend?: RecommendFn | undefined
}

interface ToolCodeEntry {
  /** The errorType a ToolFailure with this code gets unless it says otherwise. */
  errorType: ErrorType
  /** Overrides the errorType's default where repeating the same call cannot succeed. */
  retryable?: boolean
  /** Advice for any tool that has none of its own for this failure. */
  advice(failure: ToolFailureFacts): string[]
}

/**
 * The one table of tool codes (STYLE habit 4). A missing path is an answer, not a fault, so
 * NOT_FOUND is logical; a path outside the workspace is a bad argument, so PATH_TRAVERSAL is
 * validation; a user's refusal stops the call like an interrupt, so DENIED_BY_USER is aborted.
 * The advice here names no tool's reasons: each tool supplies those through its `recommend`.
 */
export const toolErrorCatalogue: Readonly<Record<ToolErrorCode, ToolCodeEntry>> = Object.freeze({
  VALIDATION_ERROR: {
    errorType: 'validation',
    advice: ({ tool }) => [`Call ${tool} again with arguments that match its parameters schema.`]
  },
  TOOL_NOT_FOUND: {
    errorType: 'validation',
    advice: ({ tool }) => [`${tool} reported that what it was asked to use does not exist; check the name against the tools this session offers.`]
  },
  NOT_FOUND: {
    errorType: 'logical',
    advice: ({ tool }) => [`${tool} could not find what it was asked for; check the arguments against what exists.`]
  },
  IO_ERROR: {
    errorType: 'runtime',
    advice: () => ['An input/output operation failed; retry once, and if it fails again try another approach.']
  },
  PERMISSION_DENIED: {
    errorType: 'runtime',
    retryable: false,
    advice: ({ path }) => [`Access to ${path ? `"${path}"` : 'this resource'} is not permitted; do not retry it, choose another target.`]
  },
  PATH_TRAVERSAL: {
    errorType: 'validation',
    advice: () => [
      'Paths are relative to the session workspace root, e.g. "src/index.ts"; "..", absolute paths outside the workspace and symbolic links leading out of it are refused.',
      'Use fs_list on "." to see the workspace.'
    ]
  },
  TIMEOUT: {
    errorType: 'aborted',
    advice: () => ['Call the tool with a smaller input or a narrower request so it finishes in time.']
  },
  RATE_LIMITED: {
    errorType: 'runtime',
    advice: () => ['The target is rate limited; wait before calling it again, and make fewer calls.']
  },
  CONFIG_ERROR: {
    errorType: 'runtime',
    retryable: false,
    advice: () => ['The tool is not configured on this server; do not retry it, tell the user it is unavailable.']
  },
  DENIED_BY_USER: {
    errorType: 'aborted',
    advice: ({ detail }) => [
      'Do not retry the same call. Ask the user what they want instead, or continue without it.',
      ...(typeof detail?.['note'] === 'string' ? [`The user's note: ${detail['note']}`] : [])
    ]
  },
  OUTPUT_TOO_LARGE: {
    errorType: 'runtime',
    retryable: false,
    advice: () => ['Ask for less output: use ranges, filters or paging.']
  },
  UNKNOWN: {
    errorType: 'runtime',
    advice: ({ tool }) => [`${tool} failed; check the arguments and the message, then retry or try another approach.`]
  }
})

/** True when `code` is one of the SPEC's tool codes. */
export function isToolErrorCode(code: unknown): code is ToolErrorCode {
  return typeof code === 'string' && (TOOL_ERROR_CODES as readonly string[]).includes(code)
}

export interface ToolFailureOptions {
  /** Defaults to the catalogue's errorType for the code. */
  errorType?: ErrorType
  retryable?: boolean
  /** Replaces the recommendations the tool and the catalogue would give. */
  recommendations?: string[]
  cause?: unknown
}

/** Thrown by a tool (or the tools layer) to choose the code of its failure: `throw new ToolFailure('NOT_FOUND', msg, {path})`. */
export class ToolFailure extends Error {
  readonly code: ToolErrorCode
  readonly errorType: ErrorType
  readonly detail: Record<string, unknown> | undefined
  readonly retryable: boolean | undefined
  readonly recommendations: string[] | undefined

  constructor(code: ToolErrorCode, message: string, detail?: Record<string, unknown>, options: ToolFailureOptions = {}) {
    super(message, { cause: options.cause })
    this.name = 'ToolFailure'
    this.code = code
    this.errorType = options.errorType ?? toolErrorCatalogue[code].errorType
    this.detail = detail
    this.retryable = options.retryable
    this.recommendations = options.recommendations
  }
}

/** What a tool returns to report a logical failure (SPEC 7); `code` picks a tool code, other fields become `detail`. */
export interface LogicalFailure {
  ok: false
  error?: string
  code?: string
  recommendations?: string[]
  [field: string]: unknown
}

/** True for a tool result of the form `{ok: false, ...}`. */
export function isLogicalFailure(value: unknown): value is LogicalFailure {
  return typeof value === 'object' && value !== null && (value as { ok?: unknown }).ok === false
}

export interface ClassifyOptions {
  /** The session's workspace root: replaced by "." in messages so the model sees workspace paths only. */
  workspace?: string
}

/**
 * Classifies a tool's failure: a ToolFailure keeps its code, a `{ok: false}` result is logical,
 * any other throw is runtime (SPEC 7). Recommendations come from the failure itself, else from
 * the tool, else from the code's general advice.
 */
export function classifyToolError(tool: ToolAdvisor, failure: unknown, input?: unknown, options: ClassifyOptions = {}): ClassifiedError {
  let errorType: ErrorType
  let code: ToolErrorCode
  let message: string
  let detail: Record<string, unknown> | undefined
  let retryable: boolean | undefined
  let recommendations: string[] | undefined

  if (failure instanceof ToolFailure) {
    ;({ errorType, code, message, detail, retryable, recommendations } = failure)
  } else if (isLogicalFailure(failure)) {
    const { ok: _ok, error, code: chosen, recommendations: given, ...rest } = failure
    errorType = 'logical'
    code = isToolErrorCode(chosen) ? chosen : 'UNKNOWN'
    message = typeof error === 'string' && error !== '' ? error : `${tool.name} reported a failure.`
    detail = Object.keys(rest).length > 0 ? rest : undefined
    recommendations = Array.isArray(given) ? given.filter((r): r is string => typeof r === 'string') : undefined
  } else {
    errorType = 'runtime'
    code = codeOfThrown(failure)
    message = failure instanceof Error ? failure.message : `${tool.name} threw ${describeThrown(failure)}`
    detail = detailOfThrown(failure)
  }

  if (options.workspace) {
    message = redact(message, options.workspace)
    if (detail) detail = redact(detail, options.workspace)
  }
  return classified({
    errorType,
    code,
    message,
    retryable: retryable ?? toolErrorCatalogue[code].retryable,
    recommendations: recommendations ?? advise(tool, code, detail, input),
    detail
  })
}

/** The model called a tool the session does not have. */
export function toolNotFound(name: string, availableTools: readonly string[]): ClassifiedError {
  return classified({
    errorType: 'validation',
    code: 'TOOL_NOT_FOUND',
    message: `There is no tool named "${name}" in this session.`,
    recommendations:
      availableTools.length > 0
        ? [`Use one of the available tools: ${availableTools.join(', ')}.`, 'Tool names are case-sensitive.']
        : ['This session has no tools; answer without calling one.'],
    detail: { name, availableTools: [...availableTools] }
  })
}

/** The call ran past its time limit and was stopped. */
export function toolTimeout(tool: ToolAdvisor, timeoutMs: number, input?: unknown): ClassifiedError {
  const detail = { timeoutMs }
  return classified({
    errorType: 'aborted',
    code: 'TIMEOUT',
    message: `${tool.name} did not finish within ${timeoutMs} ms and was stopped.`,
    recommendations: advise(tool, 'TIMEOUT', detail, input),
    detail
  })
}

/**
 * The call was interrupted (run cancelled or session deleted). The SPEC's catalogue has no
 * interrupt code, so this is `aborted` with `UNKNOWN`, as for an interrupted model call.
 */
export function toolInterrupted(toolName: string): ClassifiedError {
  return classified({
    errorType: 'aborted',
    code: 'UNKNOWN',
    message: `${toolName} was interrupted before it finished.`,
    recommendations: ['The run was interrupted; the call did not complete and its effects may be partial.'],
    detail: { reason: 'interrupted' }
  })
}

/** The user denied the call at the approval step (SPEC 7). */
export function deniedByUser(toolName: string, note?: string | null): ClassifiedError {
  const detail = note ? { note } : undefined
  return classified({
    errorType: 'aborted',
    code: 'DENIED_BY_USER',
    message: note ? `The user denied this call to ${toolName}: ${note}` : `The user denied this call to ${toolName}.`,
    recommendations: advise({ name: toolName }, 'DENIED_BY_USER', detail, undefined),
    detail
  })
}

/** The result the model sees for a failed call (SPEC 5.1), plus `detail` when there is one (e.g. a command's stderr). */
export interface ModelToolErrorResult {
  ok: false
  error: string
  errorType: ErrorType
  code: string
  retryable: boolean
  recommendations: string[]
  detail?: Record<string, unknown>
}

/** The payload given back to the model as the tool's result when the call failed. */
export function toModelToolResult(error: ClassifiedError): ModelToolErrorResult {
  const result: ModelToolErrorResult = {
    ok: false,
    error: error.message,
    errorType: error.errorType,
    code: error.code,
    retryable: error.retryable,
    recommendations: error.recommendations
  }
  if (error.detail !== undefined) result.detail = error.detail
  return result
}

/** The tool's own advice for this failure, else the code's general advice. */
function advise(tool: ToolAdvisor, code: ToolErrorCode, detail: Record<string, unknown> | undefined, input: unknown): string[] {
  const facts: ToolFailureFacts = { tool: tool.name, code, detail, reason: detail?.['reason'], path: pathOf(detail, input), input }
  return tool.recommend?.(facts) ?? toolErrorCatalogue[code].advice(facts)
}

const codeOfErrnoFamily: Readonly<Record<ErrnoFamily, ToolErrorCode>> = {
  not_found: 'NOT_FOUND',
  permission: 'PERMISSION_DENIED',
  timeout: 'TIMEOUT',
  network: 'IO_ERROR',
  filesystem: 'IO_ERROR'
}

/** A raw throw gets its code from the errno / undici code, never from message text. */
function codeOfThrown(err: unknown): ToolErrorCode {
  const family = errnoFamily(errnoOf(err))
  return family === undefined ? 'UNKNOWN' : codeOfErrnoFamily[family]
}

function detailOfThrown(err: unknown): Record<string, unknown> | undefined {
  if (!(err instanceof Error)) return undefined
  const detail: Record<string, unknown> = { name: err.name }
  const errno = errnoOf(err)
  if (errno) detail['errno'] = errno
  const syscall = (err as { syscall?: unknown }).syscall
  if (typeof syscall === 'string') detail['syscall'] = syscall
  return detail
}

function redact<T>(value: T, workspace: string): T {
  const root = workspace.endsWith('/') ? workspace.slice(0, -1) : workspace
  if (root === '') return value
  let text: string
  try {
    text = JSON.stringify(value)
  } catch {
    return value
  }
  const cleaned = text.split(`${root}/`).join('').split(root).join('.')
  return cleaned === text ? value : (JSON.parse(cleaned) as T)
}

function pathOf(detail: Record<string, unknown> | undefined, input: unknown): string | undefined {
  const fromDetail = detail?.['path']
  if (typeof fromDetail === 'string') return fromDetail
  const fromInput = typeof input === 'object' && input !== null ? (input as { path?: unknown }).path : undefined
  return typeof fromInput === 'string' ? fromInput : undefined
}
