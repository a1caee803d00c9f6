import t from 'tap'
import { RETRYABLE_BY_ERROR_TYPE, classified, classifyException, describeThrown } from '../../src/errors/classified.ts'

t.test('retryable defaults per errorType follow the SPEC 5.1 table', async (t) => {
  t.same(RETRYABLE_BY_ERROR_TYPE, { validation: false, runtime: true, logical: true, aborted: false, exception: true })
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
  t.same(classified({ errorType: 'runtime', code: 'X', message: 'm', detail: { a: 1 } }).detail, { a: 1 })
})

t.test('an exception is retryable; fatal outside tool and sandbox phases', async (t) => {
  const tool = classifyException(new Error('x'), 'tool')
  t.equal(tool.errorType, 'exception')
  t.equal(tool.retryable, true)
  t.equal(tool.fatal, false)
  t.equal(tool.message, 'Unexpected tool failure in the service: x')
  t.equal(classifyException(new Error('x'), 'system').fatal, true)
  t.equal(classifyException('weird', 'model', { fatal: false }).fatal, false)
  t.same(classifyException(new TypeError('x'), 'sandbox').detail, { phase: 'sandbox', name: 'TypeError' })
})

t.test('a thrown value that is not an Error is described by its text or its type', async (t) => {
  t.equal(describeThrown('a string'), '"a string"')
  t.equal(describeThrown('x'.repeat(300)).length, 202, 'a long string is cut at 200 characters')
  t.equal(describeThrown(null), 'null')
  t.equal(describeThrown(42), 'number')
  t.equal(classifyException(undefined, 'system').message, 'Unexpected system failure in the service: undefined')
})
