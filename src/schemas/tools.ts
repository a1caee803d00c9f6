import { Type, type Static } from '@sinclair/typebox'
import { StringEnum } from './common.ts'

const ToolName = Type.String({ pattern: '^[A-Za-z0-9_-]{1,64}$', description: 'the name the model calls the tool by' })
const JsonSchemaObject = Type.Record(Type.String(), Type.Unknown(), {
  description: 'JSON Schema of the tool arguments (an object schema)'
})

/** SPEC 7: a tool the service calls over HTTP; the URL's host must be allowed by AGENTD_WEBHOOK_HOSTS. */
export const WebhookToolSpecSchema = Type.Object(
  {
    type: Type.Literal('webhook'),
    name: ToolName,
    description: Type.String({ maxLength: 4096 }),
    parameters: JsonSchemaObject,
    url: Type.String({ pattern: '^https?://', maxLength: 2048 }),
    timeoutMs: Type.Optional(Type.Integer({ minimum: 100, maximum: 600_000 }))
  },
  { $id: 'WebhookToolSpec', additionalProperties: false }
)
export type WebhookToolSpec = Static<typeof WebhookToolSpecSchema>

/** SPEC 7: a tool the client runs itself; the run pauses until POST .../tool-results/{callId}. */
export const ClientToolSpecSchema = Type.Object(
  {
    type: Type.Literal('client'),
    name: ToolName,
    description: Type.String({ maxLength: 4096 }),
    parameters: JsonSchemaObject
  },
  { $id: 'ClientToolSpec', additionalProperties: false }
)
export type ClientToolSpec = Static<typeof ClientToolSpecSchema>

export type ToolSpec = WebhookToolSpec | ClientToolSpec

/** GET /v1/tools: what the server offers. */
export const ToolSchema = Type.Object(
  {
    name: Type.String(),
    description: Type.String(),
    parameters: Type.Record(Type.String(), Type.Unknown()),
    server: Type.Optional(Type.String({ description: 'the MCP server that offers this tool (its name is <server>__<tool>)' }))
  },
  { $id: 'Tool' }
)

/** An MCP server of AGENTD_MCP_CONFIG and how its connection is doing. */
export const McpServerStatusSchema = Type.Object(
  {
    name: Type.String(),
    transport: StringEnum(['stdio', 'http']),
    state: StringEnum(['starting', 'up', 'down', 'stopped'], {
      description: 'down: not connected, retried with backoff at nextAttemptAt'
    }),
    tools: Type.Integer({ description: 'tools from its last listing' }),
    lastError: Type.Union([Type.String(), Type.Null()], { description: 'why it last failed to start or went down' }),
    restarts: Type.Integer({ description: 'connection attempts after the first' }),
    nextAttemptAt: Type.Union([Type.String({ format: 'date-time' }), Type.Null()])
  },
  { title: 'McpServerStatus' }
)
