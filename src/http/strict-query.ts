import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { validationError } from './errors.ts'

/** What an integer in a query string may look like: decimal digits, as Last-Event-ID. */
const DECIMAL = /^-?[0-9]{1,15}$/

/** The integer-typed and the single-valued properties of each route's querystring schema, found once per schema. */
const namesOf = new WeakMap<object, { integers: string[]; single: string[] }>()
function queryNames(schema: unknown): { integers: string[]; single: string[] } {
  if (!schema || typeof schema !== 'object') return { integers: [], single: [] }
  let names = namesOf.get(schema)
  if (!names) {
    const properties = Object.entries((schema as { properties?: Record<string, { type?: unknown }> }).properties ?? {})
    names = {
      integers: properties.filter(([, property]) => property.type === 'integer').map(([name]) => name),
      single: properties.filter(([, property]) => property.type !== 'array').map(([name]) => name)
    }
    namesOf.set(schema, names)
  }
  return names
}

/**
 * A query parameter is given once, and query integers are decimal digits and nothing else. The
 * validator coerces query text with JavaScript's number rules, under which `1e309` is Infinity,
 * `0x10` is 16 and twenty nines are 1e20; this check runs before it, so those are a 400 naming
 * the parameter instead.
 */
export const strictQueryPlugin = fp(
  async (app: FastifyInstance) => {
    app.addHook('preValidation', async (request: FastifyRequest) => {
      const { integers, single } = queryNames(request.routeOptions.schema?.querystring)
      const query = request.query as Record<string, unknown>
      // ?limit=1&limit=2 arrives as an array: "must be integer" would not say what is wrong.
      const repeated = single.filter((name) => Array.isArray(query[name]))
      const bad = integers.filter((name) => typeof query[name] === 'string' && !DECIMAL.test(query[name]))
      if (repeated.length === 0 && bad.length === 0) return
      throw validationError([
        ...repeated.map((name) => ({ field: `querystring.${name}`, message: 'is given more than once; give it once', keyword: 'repeated' })),
        ...bad.map((name) => ({ field: `querystring.${name}`, message: 'must be a decimal integer of at most 15 digits', keyword: 'type' }))
      ])
    })
  },
  { name: 'agentd-strict-query' }
)
