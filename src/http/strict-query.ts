import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { validationError } from './errors.ts'

/** What an integer in a query string may look like: decimal digits, as Last-Event-ID. */
const DECIMAL = /^-?[0-9]{1,15}$/

/** The integer-typed properties of each route's querystring schema, found once per schema. */
const integerNames = new WeakMap<object, string[]>()
function integersOf(schema: unknown): string[] {
  if (!schema || typeof schema !== 'object') return []
  let names = integerNames.get(schema)
  if (!names) {
    const properties = (schema as { properties?: Record<string, { type?: unknown }> }).properties ?? {}
    names = Object.entries(properties).filter(([, property]) => property.type === 'integer').map(([name]) => name)
    integerNames.set(schema, names)
  }
  return names
}

/**
 * Query integers are decimal digits and nothing else. The validator coerces query text with
 * JavaScript's number rules, under which `1e309` is Infinity, `0x10` is 16 and twenty nines are
 * 1e20; this check runs before it, so those are a 400 naming the parameter instead.
 */
export const strictQueryPlugin = fp(
  async (app: FastifyInstance) => {
    app.addHook('preValidation', async (request: FastifyRequest) => {
      const names = integersOf(request.routeOptions.schema?.querystring)
      if (names.length === 0) return
      const query = request.query as Record<string, unknown>
      const bad = names.filter((name) => typeof query[name] === 'string' && !DECIMAL.test(query[name]))
      if (bad.length === 0) return
      throw validationError(bad.map((name) => ({
        field: `querystring.${name}`, message: 'must be a decimal integer of at most 15 digits', keyword: 'type'
      })))
    })
  },
  { name: 'agentd-strict-query' }
)
