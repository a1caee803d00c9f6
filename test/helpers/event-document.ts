import { readFileSync } from 'node:fs'
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js'
import addFormats from 'ajv-formats'
import type { StreamedEvent } from './sse.ts'

const doc = JSON.parse(readFileSync(new URL('../../openapi/openapi.json', import.meta.url), 'utf8'))

/** A validator of one component of the committed OpenAPI document, with the document's references resolving. */
export function validatorOf(name: string): ValidateFunction {
  // `discriminator` is OpenAPI's, not JSON Schema's: ajv would refuse it as an unknown keyword.
  const ajv = new Ajv2020({ strict: false, allErrors: true })
  addFormats.default(ajv)
  ajv.addSchema({ $id: 'doc', components: doc.components }, 'doc')
  return ajv.compile({ $ref: `doc#/components/schemas/${name}` })
}

let eventValidator: ((event: unknown) => boolean) & { errors?: ValidateFunction['errors'] } | undefined

/**
 * The events that do not match the document's Event union, each as "seq type on channel: the first errors":
 * what a client generated from the document would refuse. Empty when every event matches.
 */
export function undocumentedEvents(events: StreamedEvent[]): string[] {
  eventValidator ??= validatorOf('Event')
  const problems: string[] = []
  for (const event of events) {
    const matches: boolean = eventValidator(event)
    if (!matches) problems.push(`${event.seq} ${event.type} on ${event.channel}: ${JSON.stringify(eventValidator.errors?.slice(0, 3))}`)
  }
  return problems
}

/**
 * The data fields of events that their type's schema in the document does not declare, each as
 * "type: field": what a client generated from the document cannot read. A tool's own tool:<kind>
 * events are left out (their data is open by design).
 */
export function undeclaredDataFields(events: StreamedEvent[]): string[] {
  const schemas = Object.values(doc.components.schemas as Record<string, { properties?: Record<string, any> }>)
  const found = new Set<string>()
  for (const event of events) {
    const schema = schemas.find((s) => s.properties?.type?.const === event.type)
    if (!schema) continue
    const declared = Object.keys(schema.properties?.data?.properties ?? {})
    for (const field of Object.keys(event.data)) if (!declared.includes(field)) found.add(`${event.type}: ${field}`)
  }
  return [...found]
}
