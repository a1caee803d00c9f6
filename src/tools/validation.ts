import type { TSchema } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import { classified } from '../errors/classified.ts'
import type { ClassifiedError } from '../schemas/common.ts'

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
