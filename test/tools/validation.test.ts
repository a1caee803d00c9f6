import t from 'tap'
import { Type } from '@sinclair/typebox'
import { fieldErrors, validationFailure } from '../../src/tools/validation.ts'

const schema = Type.Object(
  {
    path: Type.String(),
    limit: Type.Optional(Type.Integer({ minimum: 1 })),
    method: Type.Optional(Type.Union([Type.Literal('GET'), Type.Literal('POST')]))
  },
  { additionalProperties: false }
)

t.test('a validation error names each failing field with its expected type', async (t) => {
  const error = validationFailure('fs_read', schema, { limit: 0, method: 'PUT', extra: true })
  t.match(error, { errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false, fatal: false })
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
  t.equal(error.recommendations.at(-1), 'Call fs_read again with arguments that match its parameters schema.')
  t.match(error.message, /^Invalid arguments for fs_read: path: missing/)
})

t.test('arguments that are not an object are named as a whole', async (t) => {
  t.equal(validationFailure('t', schema, 'text').recommendations[0], 'Pass the arguments as a JSON object (object).')
})

t.test('nested fields are named by their dotted path, and the count of fields is capped', async (t) => {
  const nested = Type.Object({ items: Type.Array(Type.Object({ n: Type.Integer() })) })
  t.same(fieldErrors(nested, { items: [{ n: 1 }, { n: 'x' }] }).map((f) => f.field), ['items[1].n'])
  const many = Type.Object(Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`f${i}`, Type.String()])))
  t.equal(fieldErrors(many, {}, 5).length, 5)
})
