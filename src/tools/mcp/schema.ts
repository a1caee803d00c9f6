import { Kind, Type, TypeRegistry, type TSchema } from '@sinclair/typebox'
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv'
import { ToolFailure } from '../tool-errors.ts'
import { ToolSpecError, parametersFromJsonSchema } from '../json-schema.ts'

export interface McpToolSchema {
  /** What the model and GET /v1/tools see, and what the runtime checks the arguments against. */
  parameters: TSchema
  /** A whole-schema check the tool runs itself before calling the server, when the runtime's check cannot be field by field. */
  check?: (input: unknown) => ToolFailure | null
}

/**
 * An MCP tool's inputSchema as tool parameters. Most servers send schemas that agentd's own
 * translation checks field by field in the runtime (with a recommendation per field); a schema it
 * cannot translate ($ref, allOf, …) passes the runtime's check and is checked whole by Ajv, the
 * validator the MCP SDK uses, whose message names what is wrong; so is a schema with regular
 * expressions, checked without them. `ajv` gives the validator of one listing: the compiled
 * schemas it keeps go with that listing's tools.
 */
export function mcpToolSchema(toolName: string, inputSchema: Record<string, unknown>, ajv: () => AjvJsonSchemaValidator): McpToolSchema {
  // A server's regular expressions are left to the server: run on the model's arguments in
  // agentd's main thread, one like ^(a+)+$ backtracks for minutes and stalls every session.
  const checked = withoutPatterns(inputSchema) as Record<string, unknown>
  if (checked === inputSchema) {
    try {
      return { parameters: parametersFromJsonSchema(inputSchema) }
    } catch (err) {
      if (!(err instanceof ToolSpecError)) throw err
    }
  }
  const parameters = Type.Unsafe({ ...structuredClone(inputSchema), [Kind]: CheckedByToolKind })
  let validate: ReturnType<AjvJsonSchemaValidator['getValidator']>
  // Ajv keeps a schema with an $id under that id and hands it back for any later schema with the
  // same one (another tool, the same tool changed): without it, each tool is checked by its own.
  const { $id: _id, ...own } = checked
  try {
    validate = ajv().getValidator(own)
  } catch {
    // A schema even Ajv cannot compile: the server checks the arguments itself (its InvalidParams answer is `validation`).
    return { parameters }
  }
  return {
    parameters,
    check: (input) => {
      const result = validate(input)
      if (result.valid) return null
      return new ToolFailure('VALIDATION_ERROR', `Invalid arguments for ${toolName}: ${result.errorMessage ?? 'they do not match its schema'}.`, {
        reason: 'schema', errors: result.errorMessage
      }, {
        recommendations: [`Call ${toolName} again with arguments that match its parameters schema; read the schema's allOf/anyOf parts and $defs carefully.`]
      })
    }
  }
}

const CheckedByToolKind = 'AgentdCheckedByTool'

// The runtime's check passes these through; the tool's own Ajv check (above) runs in execute.
TypeRegistry.Set(CheckedByToolKind, () => true)

/** Keywords whose values are data, not schemas: nothing in them is a keyword. */
const DATA_KEYWORDS = new Set(['const', 'enum', 'default', 'examples'])

/**
 * The schema without `pattern` and `patternProperties` (with the `additionalProperties` beside
 * them, which depends on them), or the schema itself when it has none.
 */
function withoutPatterns(node: unknown): unknown {
  if (Array.isArray(node)) {
    const items = node.map(withoutPatterns)
    return items.every((item, i) => item === node[i]) ? node : items
  }
  if (typeof node !== 'object' || node === null) return node
  const record = node as Record<string, unknown>
  const hasPatternProperties = typeof record['patternProperties'] === 'object'
  let changed = hasPatternProperties || typeof record['pattern'] === 'string'
  const entries: Array<[string, unknown]> = []
  for (const [key, value] of Object.entries(record)) {
    if ((key === 'pattern' && typeof value === 'string') || (hasPatternProperties && (key === 'patternProperties' || key === 'additionalProperties'))) continue
    const next = DATA_KEYWORDS.has(key) ? value : withoutPatterns(value)
    if (next !== value) changed = true
    entries.push([key, next])
  }
  // fromEntries keeps a property named __proto__ as a property.
  return changed ? Object.fromEntries(entries) : node
}
