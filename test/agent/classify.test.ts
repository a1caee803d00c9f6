import t from 'tap'
import { Type } from '@sinclair/typebox'
import {
  MODEL_ERROR_CODES,
  RETRYABLE_BY_ERROR_TYPE,
  TOOL_ERROR_CODES,
  ToolFailure,
  classified,
  classifyException,
  classifyToolError,
  deniedByUser,
  toModelToolResult,
  toolErrorCatalogue,
  toolInterrupted,
  toolNotFound,
  toolTimeout,
  validationFailure
} from '../../src/agent/classify.ts'

t.test('the code catalogues are exactly the SPEC lists', async (t) => {
  t.same(
    [...TOOL_ERROR_CODES],
    ['VALIDATION_ERROR', 'TOOL_NOT_FOUND', 'NOT_FOUND', 'IO_ERROR', 'PERMISSION_DENIED', 'PATH_TRAVERSAL', 'TIMEOUT', 'RATE_LIMITED', 'CONFIG_ERROR', 'DENIED_BY_USER', 'OUTPUT_TOO_LARGE', 'UNKNOWN']
  )
  t.same(
    [...MODEL_ERROR_CODES],
    ['PROVIDER_NOT_CONFIGURED', 'AUTHENTICATION_ERROR', 'PERMISSION_DENIED', 'RATE_LIMITED', 'MODEL_NOT_FOUND', 'CONTEXT_LENGTH_EXCEEDED', 'NETWORK_ERROR', 'TIMEOUT', 'SERVER_ERROR', 'INVALID_RESPONSE', 'UNKNOWN']
  )
  t.same(RETRYABLE_BY_ERROR_TYPE, { validation: false, runtime: true, logical: true, aborted: false, exception: true })
})

t.test('every tool code, thrown as a ToolFailure, classifies with its catalogue entry and non-empty advice', async (t) => {
  for (const code of TOOL_ERROR_CODES) {
    const entry = toolErrorCatalogue[code]
    const error = classifyToolError('fs_read', new ToolFailure(code, `failure ${code}`, { path: 'a/b.txt' }), { path: 'a/b.txt' })
    t.equal(error.code, code)
    t.equal(error.errorType, entry.errorType, `${code} errorType`)
    t.equal(error.retryable, entry.retryable ?? RETRYABLE_BY_ERROR_TYPE[entry.errorType], `${code} retryable`)
    t.equal(error.fatal, false, `${code} is not fatal`)
    t.equal(error.message, `failure ${code}`)
    t.ok(error.recommendations.length > 0, `${code} has recommendations`)
  }
})

t.test('classified() fills retryable from the errorType and fatal as false', async (t) => {
  for (const errorType of ['validation', 'runtime', 'logical', 'aborted', 'exception'] as const) {
    const e = classified({ errorType, code: 'UNKNOWN', message: 'm' })
    t.equal(e.retryable, RETRYABLE_BY_ERROR_TYPE[errorType])
    t.equal(e.fatal, false)
    t.same(e.recommendations, [])
    t.notOk('detail' in e)
  }
  t.equal(classified({ errorType: 'runtime', code: 'X', message: 'm', retryable: false, fatal: true }).fatal, true)
})

t.test('each errorType reaches the model as the exact SPEC payload', async (t) => {
  const cases = [
    { error: validationFailure('fs_read', Type.Object({ path: Type.String() }), {}), errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false },
    { error: classifyToolError('fs_write', new Error('disk on fire')), errorType: 'runtime', code: 'UNKNOWN', retryable: true },
    { error: classifyToolError('bash_run', { ok: false, error: 'The command exited with code 2.', exitCode: 2 }), errorType: 'logical', code: 'UNKNOWN', retryable: true },
    { error: toolTimeout('bash_run', 500), errorType: 'aborted', code: 'TIMEOUT', retryable: false },
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
  const logical = toModelToolResult(cases[2].error)
  t.same(logical.detail, { exitCode: 2 }, 'the failing command’s detail is passed on')
  t.match(logical.recommendations[0], /exited with code 2/)
})

t.test('a missing file names the path and suggests fs_glob and fs_list', async (t) => {
  const error = classifyToolError('fs_read', new ToolFailure('NOT_FOUND', 'gone', { path: 'src/app/main.ts' }))
  t.equal(error.errorType, 'logical')
  t.match(error.recommendations.join(' '), /"src\/app\/main\.ts" does not exist/)
  t.match(error.recommendations.join(' '), /fs_glob with a pattern such as "\*\*\/main\.ts"/)
  t.match(error.recommendations.join(' '), /fs_list on "src\/app"/)
})

t.test('a logical result picks its code and keeps the rest as detail', async (t) => {
  const error = classifyToolError('fs_edit', { ok: false, code: 'NOT_FOUND', error: 'no match', path: 'a.txt', reason: 'no_match' })
  t.equal(error.errorType, 'logical')
  t.equal(error.code, 'NOT_FOUND')
  t.same(error.detail, { path: 'a.txt', reason: 'no_match' })
  t.match(error.recommendations[0], /oldText does not occur in "a.txt".*fs_read/)
  const unknownCode = classifyToolError('x', { ok: false, code: 'NOPE' })
  t.equal(unknownCode.code, 'UNKNOWN', 'a code outside the catalogue is not passed on')
  t.equal(unknownCode.message, 'x reported a failure.')
})

t.test('a validation error names each failing field with its expected type', async (t) => {
  const schema = Type.Object(
    {
      path: Type.String(),
      limit: Type.Optional(Type.Integer({ minimum: 1 })),
      method: Type.Optional(Type.Union([Type.Literal('GET'), Type.Literal('POST')]))
    },
    { additionalProperties: false }
  )
  const error = validationFailure('fs_read', schema, { limit: 0, method: 'PUT', extra: true })
  const fields = (error.detail?.['fields'] as { field: string; expected: string }[]).map((f) => [f.field, f.expected])
  t.same(fields, [
    ['path', 'string'],
    ['extra', 'no such field'],
    ['limit', 'integer >= 1'],
    ['method', '"GET" or "POST"']
  ])
  const advice = error.recommendations.join('\n')
  t.match(advice, /Add the required field "path" \(string\)/)
  t.match(advice, /Field "limit" must be integer >= 1; got 0/)
  t.match(advice, /Field "method" must be "GET" or "POST"; got "PUT"/)
  t.match(advice, /Remove the field "extra"; the allowed fields are path, limit, method/)
  t.match(error.message, /^Invalid arguments for fs_read: path: missing/)
  t.equal(validationFailure('t', schema, 'text').recommendations[0], 'Pass the arguments as a JSON object (object).')
})

t.test('PATH_TRAVERSAL says paths are relative to the workspace', async (t) => {
  const error = classifyToolError('fs_write', new ToolFailure('PATH_TRAVERSAL', 'outside', { path: '../x' }))
  t.equal(error.errorType, 'validation')
  t.equal(error.retryable, false)
  t.match(error.recommendations[0], /relative to the session workspace root/)
})

t.test('TIMEOUT suggests a narrower command for bash_run and a smaller input otherwise', async (t) => {
  t.match(toolTimeout('bash_run', 1000).recommendations.join(' '), /Narrow the command/)
  t.match(toolTimeout('fs_grep', 1000).recommendations.join(' '), /narrower path or glob/)
  t.match(toolTimeout('my_webhook', 1000).recommendations.join(' '), /smaller input/)
  t.same(toolTimeout('bash_run', 1000).detail, { timeoutMs: 1000 })
})

t.test('TOOL_NOT_FOUND lists the available tools', async (t) => {
  const error = toolNotFound('fs_delete', ['fs_read', 'fs_write'])
  t.equal(error.errorType, 'validation')
  t.equal(error.retryable, false)
  t.match(error.recommendations[0], 'Use one of the available tools: fs_read, fs_write.')
  t.match(toolNotFound('x', []).recommendations[0], /no tools/)
})

t.test('OUTPUT_TOO_LARGE suggests ranges for fs_read and filters for bash_run', async (t) => {
  t.match(classifyToolError('fs_read', new ToolFailure('OUTPUT_TOO_LARGE', 'big')).recommendations[0], /offset and limit/)
  t.match(classifyToolError('bash_run', new ToolFailure('OUTPUT_TOO_LARGE', 'big')).recommendations[0], /head -n/)
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
})

t.test('an interrupt is aborted and not retryable', async (t) => {
  const error = toolInterrupted('fs_grep')
  t.equal(error.errorType, 'aborted')
  t.equal(error.retryable, false)
  t.same(error.detail, { reason: 'interrupted' })
})

t.test('raw throws get their code from the errno, not the message', async (t) => {
  const errno = (code: string) => Object.assign(new Error('boom'), { code, syscall: 'open' })
  t.equal(classifyToolError('fs_read', errno('ENOENT')).code, 'NOT_FOUND')
  t.equal(classifyToolError('fs_read', errno('EACCES')).code, 'PERMISSION_DENIED')
  t.equal(classifyToolError('fs_read', errno('EISDIR')).code, 'IO_ERROR')
  t.equal(classifyToolError('http_fetch', errno('UND_ERR_HEADERS_TIMEOUT')).code, 'TIMEOUT')
  t.equal(classifyToolError('fs_read', new Error('ENOENT in the message only')).code, 'UNKNOWN')
  const thrown = classifyToolError('fs_read', errno('EACCES'))
  t.equal(thrown.errorType, 'runtime', 'a throw is runtime whatever its code')
  t.same(thrown.detail, { name: 'Error', errno: 'EACCES', syscall: 'open' })
  t.match(classifyToolError('t', 'a string').message, 't threw "a string"')
})

t.test('the workspace root never reaches the model', async (t) => {
  const error = classifyToolError('fs_read', Object.assign(new Error("ENOENT: no such file, open '/srv/ws/ses_1/a/b.txt'"), { code: 'ENOENT' }), undefined, {
    workspace: '/srv/ws/ses_1'
  })
  t.equal(error.message, "ENOENT: no such file, open 'a/b.txt'")
})

t.test('an exception is retryable; fatal outside tool and sandbox phases', async (t) => {
  const tool = classifyException(new Error('x'), 'tool')
  t.equal(tool.errorType, 'exception')
  t.equal(tool.retryable, true)
  t.equal(tool.fatal, false)
  t.equal(classifyException(new Error('x'), 'system').fatal, true)
  t.equal(classifyException('weird', 'model', { fatal: false }).fatal, false)
  t.same(classifyException(new TypeError('x'), 'sandbox').detail, { phase: 'sandbox', name: 'TypeError' })
})
