import { Kind, Type, TypeRegistry, type TSchema } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import { fieldErrors, validationFailure } from './validation.ts'
import type { ClassifiedError } from '../schemas/common.ts'

/** A client's tool spec that cannot be used; `field` says where (e.g. `parameters.properties.n`). The route layer answers 400. */
export class ToolSpecError extends Error {
  readonly field: string
  /** The message without the field. */
  readonly reason: string

  constructor(field: string, reason: string) {
    super(`${field}: ${reason}`)
    this.name = 'ToolSpecError'
    this.field = field
    this.reason = reason
  }
}

/**
 * Client tools bring plain JSON Schema, which TypeBox's Value cannot check (no Kind). The
 * parameters keep the client's JSON exactly (what the model and GET /v1/tools show) and carry
 * this Kind; the checker is a TypeBox translation made once, at creation, without `pattern`.
 */
const JsonSchemaKind = 'AgentdJsonSchema'
const translations = new WeakMap<object, TSchema>()

TypeRegistry.Set(JsonSchemaKind, (schema: object, value: unknown) => {
  const translated = translations.get(schema)
  return translated !== undefined && Value.Check(translated, ownPropertiesOnly(value))
})

/**
 * Turns a client's JSON Schema (an object schema) into tool parameters usable by the runtime.
 * Throws ToolSpecError for anything it cannot check faithfully, naming the keyword and where it is.
 */
export function parametersFromJsonSchema(json: unknown, field = 'parameters'): TSchema {
  if (!isPlainObject(json)) throw new ToolSpecError(field, 'must be a JSON Schema object')
  if (json['type'] !== 'object') throw new ToolSpecError(field, 'must be an object schema ("type": "object"), as tool arguments are a JSON object')
  const translated = translate(json, field, 0)
  const parameters = Type.Unsafe({ ...structuredClone(json), [Kind]: JsonSchemaKind })
  translations.set(parameters, translated)
  return parameters
}

/** Checks a call's arguments against a tool's parameters; null when they fit, else the classified validation error. */
export function checkToolInput(toolName: string, schema: TSchema, input: unknown): ClassifiedError | null {
  const checked = translations.get(schema) ?? schema
  const own = ownPropertiesOnly(input)
  if (Value.Check(checked, own)) return null
  return validationFailure(toolName, checked, own, fieldErrors(checked, own))
}

/**
 * The input with null-prototype objects: TypeBox looks fields up with `in` and `value[key]`, which
 * find Object.prototype's `toString` or `constructor` in arguments that lack them.
 */
function ownPropertiesOnly(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(ownPropertiesOnly)
  if (typeof value !== 'object' || value === null) return value
  const copy: Record<string, unknown> = Object.create(null)
  // Without a prototype, `__proto__` is a plain key here.
  for (const [key, item] of Object.entries(value)) copy[key] = ownPropertiesOnly(item)
  return copy
}

/** The tool's parameters as a plain JSON Schema object (TypeBox's symbols dropped). */
export function plainJsonSchema(schema: TSchema): Record<string, unknown> {
  return JSON.parse(JSON.stringify(schema)) as Record<string, unknown>
}

const annotations = new Set(['title', 'description', 'default', 'examples', '$schema', '$id', '$comment', 'deprecated', 'readOnly', 'writeOnly'])
const keywordsByType: Record<string, readonly string[]> = {
  string: ['minLength', 'maxLength', 'pattern', 'format'],
  number: ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum', 'multipleOf'],
  integer: ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum', 'multipleOf'],
  boolean: [],
  null: [],
  object: ['properties', 'required', 'additionalProperties', 'minProperties', 'maxProperties'],
  array: ['items', 'minItems', 'maxItems', 'uniqueItems']
}
const allTypeKeywords = new Set(Object.values(keywordsByType).flat())
const maxDepth = 32

function translate(node: unknown, field: string, depth: number): TSchema {
  if (depth > maxDepth) throw new ToolSpecError(field, `is nested deeper than ${maxDepth} levels`)
  if (node === true) return Type.Unknown()
  if (!isPlainObject(node)) throw new ToolSpecError(field, 'must be a JSON Schema object')
  for (const key of Object.keys(node)) {
    if (annotations.has(key) || allTypeKeywords.has(key) || key === 'type' || key === 'enum' || key === 'const' || key === 'anyOf' || key === 'oneOf') continue
    throw new ToolSpecError(field, `the JSON Schema keyword "${key}" is not supported`)
  }
  if ('const' in node) return literal(node['const'], `${field}.const`)
  if ('enum' in node) {
    const values = node['enum']
    if (!Array.isArray(values) || values.length === 0) throw new ToolSpecError(`${field}.enum`, 'must be a non-empty array')
    return Type.Union(values.map((v, i) => literal(v, `${field}.enum[${i}]`)))
  }
  const alternatives = node['anyOf'] ?? node['oneOf']
  if (alternatives !== undefined) {
    // oneOf is checked as anyOf: a value matching two alternatives is accepted, which only loosens the check.
    const key = 'anyOf' in node ? 'anyOf' : 'oneOf'
    if (!Array.isArray(alternatives) || alternatives.length === 0) throw new ToolSpecError(`${field}.${key}`, 'must be a non-empty array')
    if ('type' in node) throw new ToolSpecError(field, `"type" next to "${key}" is not supported; put the type inside each alternative`)
    return Type.Union(alternatives.map((a, i) => translate(a, `${field}.${key}[${i}]`, depth + 1)))
  }
  const type = node['type']
  if (type === undefined) {
    const stray = Object.keys(node).find((k) => allTypeKeywords.has(k))
    if (stray) throw new ToolSpecError(field, `"${stray}" needs a "type"`)
    return Type.Unknown()
  }
  if (Array.isArray(type)) {
    if (type.length === 0) throw new ToolSpecError(`${field}.type`, 'must not be empty')
    return Type.Union(type.map((t, i) => typed(node, t, `${field}.type[${i}]`, field, depth)))
  }
  return typed(node, type, `${field}.type`, field, depth)
}

function typed(node: Record<string, unknown>, type: unknown, typeField: string, field: string, depth: number): TSchema {
  if (typeof type !== 'string' || !Object.hasOwn(keywordsByType, type)) {
    throw new ToolSpecError(typeField, `must be one of ${Object.keys(keywordsByType).join(', ')}`)
  }
  const allowed = keywordsByType[type] ?? []
  const own = (key: string) => (allowed.includes(key) ? node[key] : undefined)
  switch (type) {
    case 'string': {
      const pattern = own('pattern')
      if (pattern !== undefined) {
        try {
          new RegExp(String(pattern))
        } catch {
          throw new ToolSpecError(`${field}.pattern`, 'is not a valid regular expression')
        }
      }
      // The pattern is shown to the model but left to the client or webhook to enforce: run on the
      // model's arguments in agentd's main thread, one like ^(a+)+$ backtracks for minutes and
      // stalls every session of every tenant (as for MCP tools, see mcp/schema.ts).
      // format is an annotation in JSON Schema 2020-12 unless a vocabulary asserts it; it is shown, not checked.
      return Type.String(numbers(node, ['minLength', 'maxLength'], field))
    }
    case 'number':
      return Type.Number(numbers(node, keywordsByType['number'] ?? [], field))
    case 'integer':
      return Type.Integer(numbers(node, keywordsByType['integer'] ?? [], field))
    case 'boolean':
      return Type.Boolean()
    case 'null':
      return Type.Null()
    case 'array': {
      const items = own('items')
      if (Array.isArray(items)) throw new ToolSpecError(`${field}.items`, 'tuple arrays are not supported; give one schema for every item')
      const itemSchema = items === undefined ? Type.Unknown() : translate(items, `${field}.items`, depth + 1)
      const uniqueItems = own('uniqueItems')
      return Type.Array(itemSchema, numbers(node, ['minItems', 'maxItems'], field, { uniqueItems: uniqueItems === true ? true : undefined }))
    }
    default:
      return objectSchema(node, field, depth)
  }
}

function objectSchema(node: Record<string, unknown>, field: string, depth: number): TSchema {
  const properties = node['properties'] ?? {}
  if (!isPlainObject(properties)) throw new ToolSpecError(`${field}.properties`, 'must be an object')
  const required = node['required'] ?? []
  if (!Array.isArray(required) || !required.every((r) => typeof r === 'string')) {
    throw new ToolSpecError(`${field}.required`, 'must be an array of property names')
  }
  // No prototype: a property named __proto__ is kept, and a required `toString` is not found on Object.prototype.
  const props: Record<string, TSchema> = Object.create(null)
  for (const [name, sub] of Object.entries(properties)) {
    const schema = translate(sub, `${field}.properties.${name}`, depth + 1)
    props[name] = required.includes(name) ? schema : Type.Optional(schema)
  }
  for (const name of required) {
    // A required property without a schema may hold anything, but must be present.
    if (!Object.hasOwn(props, name)) props[name] = Type.Unknown()
  }
  const extra = node['additionalProperties']
  const additionalProperties =
    extra === undefined || extra === true ? undefined : extra === false ? false : translate(extra, `${field}.additionalProperties`, depth + 1)
  return Type.Object(props, {
    ...numbers(node, ['minProperties', 'maxProperties'], field),
    ...(additionalProperties === undefined ? {} : { additionalProperties })
  })
}

function numbers(node: Record<string, unknown>, keys: readonly string[], field: string, extra: Record<string, unknown> = {}) {
  const options: Record<string, unknown> = {}
  for (const key of keys) {
    const value = node[key]
    if (value === undefined) continue
    if (typeof value !== 'number' || !Number.isFinite(value)) throw new ToolSpecError(`${field}.${key}`, 'must be a number')
    options[key] = value
  }
  for (const [key, value] of Object.entries(extra)) if (value !== undefined) options[key] = value
  return options
}

function literal(value: unknown, field: string): TSchema {
  if (value === null) return Type.Null()
  if (typeof value === 'string' || typeof value === 'boolean' || (typeof value === 'number' && Number.isFinite(value))) return Type.Literal(value)
  throw new ToolSpecError(field, 'only strings, numbers, booleans and null are supported as constant values')
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}
