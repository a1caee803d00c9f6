import { Kind, Type, TypeRegistry, type TSchema } from '@sinclair/typebox'
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv'
import { ToolSpecError, parametersFromJsonSchema } from '../json-schema.ts'

/**
 * An MCP tool's inputSchema as tool parameters. Most servers send schemas that agentd's own
 * translation checks field by field (with field-level recommendations); a schema it cannot
 * translate ($ref, allOf, …) is checked as a whole by Ajv, the validator the MCP SDK uses.
 */
export function mcpToolParameters(inputSchema: Record<string, unknown>): TSchema {
  try {
    return parametersFromJsonSchema(inputSchema)
  } catch (err) {
    if (!(err instanceof ToolSpecError)) throw err
    return wholeSchema(inputSchema)
  }
}

const AjvCheckedKind = 'AgentdAjvCheckedSchema'
const ajv = new AjvJsonSchemaValidator()
const checkers = new WeakMap<object, (input: unknown) => boolean>()

TypeRegistry.Set(AjvCheckedKind, (schema: object, value: unknown) => checkers.get(schema)?.(value) ?? false)

function wholeSchema(json: Record<string, unknown>): TSchema {
  let check: (input: unknown) => boolean
  try {
    const validate = ajv.getValidator(json)
    check = (input) => validate(input).valid
  } catch {
    // A schema even Ajv cannot compile: the server checks the arguments itself (its InvalidParams answer is `validation`).
    check = () => true
  }
  const parameters = Type.Unsafe({ ...structuredClone(json), [Kind]: AjvCheckedKind })
  checkers.set(parameters, check)
  return parameters
}
