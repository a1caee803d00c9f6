import t from 'tap'
import { RETRYABLE_BY_ERROR_TYPE, classifyException } from '../../src/errors/classified.ts'
import {
  TOOL_ERROR_CODES,
  ToolFailure,
  classifyToolError,
  deniedByUser,
  toModelToolResult,
  toolErrorCatalogue,
  toolInterrupted,
  toolNotFound,
  toolTimeout,
  type ToolFailureFacts
} from '../../src/tools/tool-errors.ts'

/** A tool with no advice of its own: every failure gets its code's general advice. */
const plain = { name: 'probe' }

t.test('the tool code catalogue is exactly the SPEC list', async (t) => {
  t.same(
    [...TOOL_ERROR_CODES],
    ['VALIDATION_ERROR', 'TOOL_NOT_FOUND', 'NOT_FOUND', 'IO_ERROR', 'PERMISSION_DENIED', 'PATH_TRAVERSAL', 'TIMEOUT', 'RATE_LIMITED', 'CONFIG_ERROR', 'DENIED_BY_USER', 'OUTPUT_TOO_LARGE', 'UNKNOWN']
  )
  t.same(Object.keys(toolErrorCatalogue), [...TOOL_ERROR_CODES], 'one catalogue entry per code')
})

t.test('every tool code, thrown as a ToolFailure, classifies with its catalogue entry and non-empty advice', async (t) => {
  for (const code of TOOL_ERROR_CODES) {
    const entry = toolErrorCatalogue[code]
    const error = classifyToolError(plain, new ToolFailure(code, `failure ${code}`, { path: 'a/b.txt' }), { path: 'a/b.txt' })
    t.equal(error.code, code)
    t.equal(error.errorType, entry.errorType, `${code} errorType`)
    t.equal(error.retryable, entry.retryable ?? RETRYABLE_BY_ERROR_TYPE[entry.errorType], `${code} retryable`)
    t.equal(error.fatal, false, `${code} is not fatal`)
    t.equal(error.message, `failure ${code}`)
    t.ok(error.recommendations.length > 0, `${code} has recommendations`)
  }
})

t.test('each errorType reaches the model as the exact SPEC payload', async (t) => {
  const cases = [
    { error: classifyToolError(plain, new ToolFailure('PATH_TRAVERSAL', 'outside', { path: '../x' })), errorType: 'validation', code: 'PATH_TRAVERSAL', retryable: false },
    { error: classifyToolError(plain, new Error('disk on fire')), errorType: 'runtime', code: 'UNKNOWN', retryable: true },
    { error: classifyToolError(plain, { ok: false, error: 'The record is gone.', id: 7 }), errorType: 'logical', code: 'UNKNOWN', retryable: true },
    { error: toolTimeout(plain, 500), errorType: 'aborted', code: 'TIMEOUT', retryable: false },
    { error: classifyException(new Error('store down'), 'tool'), errorType: 'exception', code: 'UNKNOWN', retryable: true }
  ] as const
  for (const c of cases) {
    const payload = toModelToolResult(c.error)
    t.same(Object.keys(payload).filter((k) => k !== 'detail'), ['ok', 'error', 'errorType', 'code', 'retryable', 'recommendations'])
    t.equal(payload.ok, false)
    t.equal(payload.error, c.error.message)
    t.equal(payload.errorType, c.errorType)
    t.equal(payload.code, c.code)
    t.equal(payload.retryable, c.retryable)
    t.same(payload.recommendations, c.error.recommendations)
  }
  t.same(toModelToolResult(cases[2].error).detail, { id: 7 }, 'the logical failure’s other fields are passed on as detail')
  t.notOk('detail' in toModelToolResult(classifyToolError(plain, new ToolFailure('RATE_LIMITED', 'slow down'))), 'no detail, no detail key')
})

t.test('a logical result picks its code and keeps the rest as detail', async (t) => {
  const error = classifyToolError(plain, { ok: false, code: 'NOT_FOUND', error: 'no match', path: 'a.txt', reason: 'no_match' })
  t.equal(error.errorType, 'logical')
  t.equal(error.code, 'NOT_FOUND')
  t.same(error.detail, { path: 'a.txt', reason: 'no_match' })
  t.match(error.recommendations[0], /probe could not find what it was asked for/)
  const given = classifyToolError(plain, { ok: false, error: 'busy', recommendations: ['Try at night.', 42] })
  t.same(given.recommendations, ['Try at night.'], 'a result’s own recommendations are kept, strings only')
  const unknownCode = classifyToolError({ name: 'x' }, { ok: false, code: 'NOPE' })
  t.equal(unknownCode.code, 'UNKNOWN', 'a code outside the catalogue is not passed on')
  t.equal(unknownCode.message, 'x reported a failure.')
})

t.test("a tool's own advice comes first; the code's general advice covers what it leaves out", async (t) => {
  const asked: ToolFailureFacts[] = []
  const advised = {
    name: 'notes',
    recommend(failure: ToolFailureFacts) {
      asked.push(failure)
      return failure.reason === 'locked' ? [`"${failure.path}" is locked; wait for it.`] : undefined
    }
  }
  const locked = classifyToolError(advised, new ToolFailure('IO_ERROR', 'locked', { reason: 'locked' }), { path: 'todo.md' })
  t.same(locked.recommendations, ['"todo.md" is locked; wait for it.'])
  t.match(asked[0], { tool: 'notes', code: 'IO_ERROR', reason: 'locked', path: 'todo.md', detail: { reason: 'locked' }, input: { path: 'todo.md' } })

  const other = classifyToolError(advised, new ToolFailure('IO_ERROR', 'disk'))
  t.same(other.recommendations, toolErrorCatalogue.IO_ERROR.advice({ tool: 'notes', code: 'IO_ERROR', detail: undefined, reason: undefined, path: undefined, input: undefined }))

  const timeout = toolTimeout(advised, 100, { path: 'big.md' })
  t.match(asked.at(-1), { code: 'TIMEOUT', detail: { timeoutMs: 100 }, path: 'big.md' }, 'the tool is asked about a timeout the runtime reports for it')
  t.same(timeout.recommendations, ['Call the tool with a smaller input or a narrower request so it finishes in time.'])

  const explicit = classifyToolError(advised, new ToolFailure('IO_ERROR', 'locked', { reason: 'locked' }, { recommendations: ['Ask the owner.'] }))
  t.same(explicit.recommendations, ['Ask the owner.'], 'a ToolFailure that brings recommendations keeps them')
})

t.test('PATH_TRAVERSAL says paths are relative to the workspace', async (t) => {
  const error = classifyToolError(plain, new ToolFailure('PATH_TRAVERSAL', 'outside', { path: '../x' }))
  t.equal(error.errorType, 'validation')
  t.equal(error.retryable, false)
  t.match(error.recommendations[0], /relative to the session workspace root/)
})

t.test('PERMISSION_DENIED names the path and says not to retry', async (t) => {
  const error = classifyToolError(plain, new ToolFailure('PERMISSION_DENIED', 'no', { path: 'secret.txt' }))
  t.equal(error.retryable, false)
  t.match(error.recommendations[0], /Access to "secret.txt" is not permitted; do not retry/)
})

t.test('a timeout is aborted, not retryable, and keeps its limit as detail', async (t) => {
  const error = toolTimeout(plain, 1000)
  t.match(error, { errorType: 'aborted', code: 'TIMEOUT', retryable: false, message: 'probe did not finish within 1000 ms and was stopped.' })
  t.same(error.detail, { timeoutMs: 1000 })
  t.match(error.recommendations.join(' '), /smaller input/)
})

t.test('TOOL_NOT_FOUND lists the available tools', async (t) => {
  const error = toolNotFound('fs_delete', ['fs_read', 'fs_write'])
  t.equal(error.errorType, 'validation')
  t.equal(error.retryable, false)
  t.match(error.recommendations[0], 'Use one of the available tools: fs_read, fs_write.')
  t.same(error.detail, { name: 'fs_delete', availableTools: ['fs_read', 'fs_write'] })
  t.match(toolNotFound('x', []).recommendations[0], /no tools/)
})

t.test('DENIED_BY_USER says not to retry the same call and passes the note on', async (t) => {
  const error = deniedByUser('bash_run', 'not on prod')
  t.equal(error.code, 'DENIED_BY_USER')
  t.equal(error.errorType, 'aborted')
  t.equal(error.retryable, false)
  t.equal(error.fatal, false)
  t.match(error.recommendations[0], /Do not retry the same call/)
  t.match(error.recommendations[1], /not on prod/)
  t.match(deniedByUser('bash_run').message, 'The user denied this call to bash_run.')
  t.equal(deniedByUser('bash_run').recommendations.length, 1, 'no note, no note line')
})

t.test('an interrupt is aborted and not retryable', async (t) => {
  const error = toolInterrupted('fs_grep')
  t.equal(error.errorType, 'aborted')
  t.equal(error.retryable, false)
  t.same(error.detail, { reason: 'interrupted' })
})

t.test('raw throws get their code from the errno, not the message', async (t) => {
  const errno = (code: string) => Object.assign(new Error('boom'), { code, syscall: 'open' })
  t.equal(classifyToolError(plain, errno('ENOENT')).code, 'NOT_FOUND')
  t.equal(classifyToolError(plain, errno('EACCES')).code, 'PERMISSION_DENIED')
  t.equal(classifyToolError(plain, errno('EISDIR')).code, 'IO_ERROR')
  t.equal(classifyToolError(plain, errno('ECONNRESET')).code, 'IO_ERROR')
  t.equal(classifyToolError(plain, errno('UND_ERR_HEADERS_TIMEOUT')).code, 'TIMEOUT')
  t.equal(classifyToolError(plain, new Error('ENOENT in the message only')).code, 'UNKNOWN')
  const thrown = classifyToolError(plain, errno('EACCES'))
  t.equal(thrown.errorType, 'runtime', 'a throw is runtime whatever its code')
  t.same(thrown.detail, { name: 'Error', errno: 'EACCES', syscall: 'open' })
  t.match(classifyToolError({ name: 't' }, 'a string').message, 't threw "a string"')
})

t.test('the workspace root never reaches the model', async (t) => {
  const error = classifyToolError(plain, Object.assign(new Error("ENOENT: no such file, open '/srv/ws/ses_1/a/b.txt'"), { code: 'ENOENT' }), undefined, {
    workspace: '/srv/ws/ses_1'
  })
  t.equal(error.message, "ENOENT: no such file, open 'a/b.txt'")
  const detail = classifyToolError(plain, new ToolFailure('IO_ERROR', 'x', { file: '/srv/ws/ses_1', other: '/srv/ws/ses_1/c' }), undefined, { workspace: '/srv/ws/ses_1/' })
  t.same(detail.detail, { file: '.', other: 'c' })
})
