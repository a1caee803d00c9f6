import { Value } from '@sinclair/typebox/value'
import type { TSchema } from '@sinclair/typebox'
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

/** SPEC 5.1: every code a model error may carry (src/model/model-errors.ts says what each means). */
export const MODEL_ERROR_CODES = [
  'PROVIDER_NOT_CONFIGURED',
  'AUTHENTICATION_ERROR',
  'PERMISSION_DENIED',
  'RATE_LIMITED',
  'MODEL_NOT_FOUND',
  'CONTEXT_LENGTH_EXCEEDED',
  'NETWORK_ERROR',
  'TIMEOUT',
  'SERVER_ERROR',
  'INVALID_RESPONSE',
  'UNKNOWN'
] as const
export type ModelErrorCode = (typeof MODEL_ERROR_CODES)[number]

/** SPEC 5.1 table: the default `retryable` of each errorType. */
export const RETRYABLE_BY_ERROR_TYPE: Readonly<Record<ErrorType, boolean>> = Object.freeze({
  validation: false,
  runtime: true,
  logical: true,
  aborted: false,
  exception: true
})

interface ToolCodeEntry {
  /** The errorType a ToolFailure with this code gets unless it says otherwise. */
  errorType: ErrorType
  /** Overrides the errorType's default where repeating the same call cannot succeed. */
  retryable?: boolean
}

/**
 * The one table of tool codes (STYLE habit 4). A missing path is an answer, not a fault, so
 * NOT_FOUND is logical; a path outside the workspace is a bad argument, so PATH_TRAVERSAL is
 * validation; a user's refusal stops the call like an interrupt, so DENIED_BY_USER is aborted.
 */
export const toolErrorCatalogue: Readonly<Record<ToolErrorCode, ToolCodeEntry>> = Object.freeze({
  VALIDATION_ERROR: { errorType: 'validation' },
  TOOL_NOT_FOUND: { errorType: 'validation' },
  NOT_FOUND: { errorType: 'logical' },
  IO_ERROR: { errorType: 'runtime' },
  PERMISSION_DENIED: { errorType: 'runtime', retryable: false },
  PATH_TRAVERSAL: { errorType: 'validation' },
  TIMEOUT: { errorType: 'aborted' },
  RATE_LIMITED: { errorType: 'runtime' },
  CONFIG_ERROR: { errorType: 'runtime', retryable: false },
  DENIED_BY_USER: { errorType: 'aborted' },
  OUTPUT_TOO_LARGE: { errorType: 'runtime', retryable: false },
  UNKNOWN: { errorType: 'runtime' }
})

/** True when `code` is one of the SPEC's tool codes. */
export function isToolErrorCode(code: unknown): code is ToolErrorCode {
  return typeof code === 'string' && (TOOL_ERROR_CODES as readonly string[]).includes(code)
}

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

export interface ToolFailureOptions {
  /** Defaults to the catalogue's errorType for the code. */
  errorType?: ErrorType
  retryable?: boolean
  /** Replaces the recommendations the classifier would derive. */
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
  /** Names offered to the model, for TOOL_NOT_FOUND. */
  availableTools?: readonly string[]
  /** The session's workspace root: replaced by "." in messages so the model sees workspace paths only. */
  workspace?: string
}

/**
 * Classifies a tool's failure: a ToolFailure keeps its code, a `{ok: false}` result is logical,
 * any other throw is runtime (SPEC 7). Recommendations depend on the code and on the tool.
 */
export function classifyToolError(toolName: string, failure: unknown, input?: unknown, options: ClassifyOptions = {}): ClassifiedError {
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
    message = typeof error === 'string' && error !== '' ? error : `${toolName} reported a failure.`
    detail = Object.keys(rest).length > 0 ? rest : undefined
    recommendations = Array.isArray(given) ? given.filter((r): r is string => typeof r === 'string') : undefined
  } else {
    errorType = 'runtime'
    code = codeOfThrown(failure)
    message = failure instanceof Error ? failure.message : `${toolName} threw ${describeThrown(failure)}`
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
    recommendations: recommendations ?? recommend(toolName, code, detail, input, options),
    detail
  })
}

/** The arguments failed the tool's schema: names every failing field with what it expects (from TypeBox's Value.Errors). */
export function validationFailure(toolName: string, schema: TSchema, input: unknown, errors?: Iterable<FieldError>): ClassifiedError {
  const fields = [...(errors ?? fieldErrors(schema, input))]
  const summary = fields.map((f) => `${f.field}: ${f.message}`).join('; ')
  return classified({
    errorType: 'validation',
    code: 'VALIDATION_ERROR',
    message: `Invalid arguments for ${toolName}: ${summary || 'they do not match the schema'}.`,
    recommendations: [
      ...fields.map((f) => f.recommendation),
      `Call ${toolName} again with arguments that match its parameters schema.`
    ],
    detail: { fields: fields.map(({ field, expected, message }) => ({ field, expected, message })) }
  })
}

/** The model called a tool the session does not have. */
export function toolNotFound(name: string, availableTools: readonly string[]): ClassifiedError {
  return classified({
    errorType: 'validation',
    code: 'TOOL_NOT_FOUND',
    message: `There is no tool named "${name}" in this session.`,
    recommendations: recommend(name, 'TOOL_NOT_FOUND', undefined, undefined, { availableTools }),
    detail: { name, availableTools: [...availableTools] }
  })
}

/** The call ran past its time limit and was stopped. */
export function toolTimeout(toolName: string, timeoutMs: number, input?: unknown): ClassifiedError {
  const detail = { timeoutMs }
  return classified({
    errorType: 'aborted',
    code: 'TIMEOUT',
    message: `${toolName} did not finish within ${timeoutMs} ms and was stopped.`,
    recommendations: recommend(toolName, 'TIMEOUT', detail, input, {}),
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
    recommendations: recommend(toolName, 'DENIED_BY_USER', detail, undefined, {}),
    detail
  })
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

export interface FieldError {
  /** Dotted path of the field, `arguments` for the whole object. */
  field: string
  /** What the schema expects there, e.g. `string`, `integer >= 1`, `"GET" or "POST"`. */
  expected: string
  message: string
  recommendation: string
}

/** One entry per failing field (the first complaint about each), from TypeBox's Value.Errors. */
export function fieldErrors(schema: TSchema, input: unknown, max = 10): FieldError[] {
  const byPath = new Map<string, FieldError>()
  for (const e of Value.Errors(schema, input)) {
    if (byPath.has(e.path)) continue
    const field = fieldName(e.path)
    const nodeSchema = e.schema as Record<string, unknown>
    if (e.message === 'Unexpected property') {
      const allowed = Object.keys((nodeSchema['properties'] as object | undefined) ?? {})
      byPath.set(e.path, {
        field,
        expected: 'no such field',
        message: 'unexpected field',
        recommendation: `Remove the field "${field}"${allowed.length ? `; the allowed fields are ${allowed.join(', ')}` : ''}.`
      })
    } else {
      const expected = describeExpected(nodeSchema)
      const missing = e.message === 'Expected required property'
      byPath.set(e.path, {
        field,
        expected,
        message: missing ? `missing, expected ${expected}` : `${e.message} (got ${preview(e.value)})`,
        recommendation:
          e.path === ''
            ? `Pass the arguments as a JSON object (${expected}).`
            : missing
              ? `Add the required field "${field}" (${expected}).`
              : `Field "${field}" must be ${expected}; got ${preview(e.value)}.`
      })
    }
    if (byPath.size >= max) break
  }
  return [...byPath.values()]
}

function fieldName(pointer: string): string {
  if (pointer === '') return 'arguments'
  return pointer
    .slice(1)
    .split('/')
    .map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'))
    .reduce((acc, s) => (/^\d+$/.test(s) ? `${acc}[${s}]` : acc ? `${acc}.${s}` : s), '')
}

/** A short human description of what a schema node accepts. */
function describeExpected(schema: Record<string, unknown>): string {
  if ('const' in schema) return JSON.stringify(schema['const'])
  if (Array.isArray(schema['enum'])) return `one of ${schema['enum'].map((v) => JSON.stringify(v)).join(', ')}`
  const alternatives = (schema['anyOf'] ?? schema['oneOf']) as Record<string, unknown>[] | undefined
  if (Array.isArray(alternatives)) return alternatives.map(describeExpected).join(' or ')
  const type = schema['type']
  const base = Array.isArray(type) ? type.join(' or ') : typeof type === 'string' ? type : 'a value'
  const parts = [base === 'array' && schema['items'] ? `array of ${describeExpected(schema['items'] as Record<string, unknown>)}` : base]
  const bounds: [string, string][] = [
    ['minimum', '>='],
    ['exclusiveMinimum', '>'],
    ['maximum', '<='],
    ['exclusiveMaximum', '<'],
    ['minLength', 'length >='],
    ['maxLength', 'length <='],
    ['minItems', 'items >='],
    ['maxItems', 'items <=']
  ]
  for (const [key, op] of bounds) if (typeof schema[key] === 'number') parts.push(`${op} ${schema[key]}`)
  if (typeof schema['pattern'] === 'string') parts.push(`matching /${schema['pattern']}/`)
  return parts.join(' ')
}

function preview(value: unknown): string {
  if (value === undefined) return 'nothing'
  const text = JSON.stringify(value) ?? String(value)
  return text.length > 60 ? `${text.slice(0, 57)}...` : text
}

const notFoundErrnos = new Set(['ENOENT'])
const permissionErrnos = new Set(['EACCES', 'EPERM'])
const timeoutErrnos = new Set(['ETIMEDOUT', 'UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT'])
const ioErrnos = new Set([
  'EISDIR', 'ENOTDIR', 'EEXIST', 'ENOTEMPTY', 'ENOSPC', 'EMFILE', 'ENFILE', 'EROFS', 'ELOOP', 'EBUSY', 'EIO', 'EPIPE',
  'ECONNREFUSED', 'ECONNRESET', 'ECONNABORTED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH',
  'UND_ERR_SOCKET', 'UND_ERR_CLOSED', 'UND_ERR_CONNECT'
])

function errnoOf(err: unknown): string | undefined {
  const code = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined
  return typeof code === 'string' ? code : undefined
}

/** A raw throw gets its code from the errno / undici code, never from message text. */
function codeOfThrown(err: unknown): ToolErrorCode {
  const errno = errnoOf(err)
  if (errno === undefined) return 'UNKNOWN'
  if (notFoundErrnos.has(errno)) return 'NOT_FOUND'
  if (permissionErrnos.has(errno)) return 'PERMISSION_DENIED'
  if (timeoutErrnos.has(errno)) return 'TIMEOUT'
  if (ioErrnos.has(errno)) return 'IO_ERROR'
  return 'UNKNOWN'
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

function describeThrown(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value.length > 200 ? value.slice(0, 200) : value)
  return value === null ? 'null' : typeof value
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

const fsTools = new Set(['fs_read', 'fs_write', 'fs_edit', 'fs_list', 'fs_glob', 'fs_grep'])

/** Recommendations specific to the code and to the tool that failed. */
function recommend(
  toolName: string,
  code: ToolErrorCode,
  detail: Record<string, unknown> | undefined,
  input: unknown,
  options: ClassifyOptions
): string[] {
  const path = pathOf(detail, input)
  const reason = detail?.['reason']
  switch (code) {
    case 'NOT_FOUND': {
      if (toolName === 'fs_edit' && reason === 'no_match') {
        return [
          `oldText does not occur in "${path}". Read the file with fs_read and copy the exact text to replace, including whitespace and line breaks.`,
          'Keep oldText short but unique: a few whole lines around the change.'
        ]
      }
      if (toolName === 'fs_read' && reason === 'offset_past_end') {
        return [`"${path}" has ${String(detail?.['lines'])} lines; read it with an offset within that range, or without offset from the start.`]
      }
      if (path !== undefined && (fsTools.has(toolName) || toolName === 'bash_run')) {
        const base = path.split('/').filter(Boolean).pop() ?? path
        const dir = path.includes('/') ? path.slice(0, path.lastIndexOf('/')) || '.' : '.'
        return [
          `"${path}" does not exist in the workspace.`,
          `Use fs_glob with a pattern such as "**/${base}" to find it, or fs_list on "${dir}" to see what is there.`
        ]
      }
      return [`${toolName} could not find what it was asked for; check the arguments against what exists.`]
    }
    case 'VALIDATION_ERROR':
      if (toolName === 'fs_edit' && reason === 'ambiguous') {
        return [
          `oldText occurs ${String(detail?.['occurrences'] ?? 'several')} times in "${path}". Include more surrounding lines so it matches once,`,
          'or set replaceAll: true to replace every occurrence.'
        ]
      }
      if (toolName === 'fs_grep' && reason === 'invalid_regex') {
        return ['The pattern is not a valid JavaScript regular expression; escape special characters such as ( [ { . * + ? with a backslash.']
      }
      return [`Call ${toolName} again with arguments that match its parameters schema.`]
    case 'TOOL_NOT_FOUND': {
      const available = options.availableTools ?? []
      return available.length > 0
        ? [`Use one of the available tools: ${available.join(', ')}.`, 'Tool names are case-sensitive.']
        : ['This session has no tools; answer without calling one.']
    }
    case 'PATH_TRAVERSAL':
      return [
        'Paths are relative to the session workspace root, e.g. "src/index.ts"; "..", absolute paths outside the workspace and symbolic links leading out of it are refused.',
        'Use fs_list on "." to see the workspace.'
      ]
    case 'TIMEOUT':
      if (toolName === 'bash_run') {
        return [
          'Narrow the command (limit it to a folder, fewer files, fewer iterations) or run long jobs in smaller steps.',
          'Pass a larger timeoutMs if the command needs it, up to the session limit.'
        ]
      }
      if (toolName === 'fs_grep') {
        return ['Search a narrower path or glob, and simplify the pattern (avoid nested quantifiers such as (a+)+).']
      }
      if (toolName === 'http_fetch') {
        return ['The server did not answer in time; retry later or fetch a smaller resource.']
      }
      return ['Call the tool with a smaller input or a narrower request so it finishes in time.']
    case 'OUTPUT_TOO_LARGE':
      if (toolName === 'fs_read') return ['Read the file in parts with offset and limit (line numbers).']
      if (toolName === 'fs_edit') return ['The file is too large for fs_edit; write the changed content in smaller files, or edit it with a command if bash_run is available.']
      if (toolName === 'bash_run') {
        return ['The command printed too much; filter its output (grep, head -n, tail -n, wc -l) or write it to a file and read parts of it.']
      }
      if (toolName === 'fs_grep' || toolName === 'fs_glob' || toolName === 'fs_list') {
        return ['Narrow the search: a more specific pattern, a sub-folder as path, or a glob filter.']
      }
      if (toolName === 'http_fetch') return ['Fetch a smaller resource, e.g. an API endpoint with paging or filters.']
      return ['Ask for less output: use ranges, filters or paging.']
    case 'DENIED_BY_USER': {
      const recs = ['Do not retry the same call. Ask the user what they want instead, or continue without it.']
      if (typeof detail?.['note'] === 'string') recs.push(`The user's note: ${detail['note']}`)
      return recs
    }
    case 'PERMISSION_DENIED':
      if (toolName === 'http_fetch') {
        return ['Loopback, private, link-local and metadata addresses are refused; fetch a public http(s) URL instead.']
      }
      return [`Access to ${path ? `"${path}"` : 'this resource'} is not permitted; do not retry it, choose another target.`]
    case 'IO_ERROR':
      if (reason === 'too_many_redirects') return ['The URL redirects too often; fetch the final URL directly.']
      if (toolName === 'http_fetch') return ['Check the URL and that the host is reachable; retry once if the failure looks transient.']
      if (reason === 'is_directory' || detail?.['errno'] === 'EISDIR') {
        return [`"${path}" is a directory; use fs_list to see its entries, or name a file inside it.`]
      }
      if (reason === 'not_directory') return [`"${path}" is a file, not a folder; read it with fs_read, or list its parent folder.`]
      if (reason === 'not_regular_file') return [`"${path}" is a pipe, socket or device; only regular files can be read or written.`]
      return ['An input/output operation failed; retry once, and if it fails again try another approach.']
    case 'RATE_LIMITED':
      return ['The target is rate limited; wait before calling it again, and make fewer calls.']
    case 'CONFIG_ERROR':
      return ['The tool is not configured on this server; do not retry it, tell the user it is unavailable.']
    case 'UNKNOWN':
      if (toolName === 'bash_run' && typeof detail?.['exitCode'] === 'number') {
        return [
          `The command exited with code ${detail['exitCode']}; read stderr and stdout in detail, fix the command and run it again.`
        ]
      }
      if (reason === 'memory_limit') {
        return ['The tool ran out of its memory budget; call it on a smaller input (narrower path, fewer files, simpler pattern).']
      }
      return [`${toolName} failed; check the arguments and the message, then retry or try another approach.`]
  }
}
