import { Type, type Static } from '@sinclair/typebox'
import { Value } from '@sinclair/typebox/value'
import { HooksConfigError, loadHooksFile, type HookDefinition } from './hooks/config.ts'
import { McpConfigError, readMcpConfig, type McpServerConfig } from './tools/mcp/config.ts'

const integer = (description: string, fallback: string) =>
  Type.String({ pattern: '^[0-9]+$', default: fallback, description })
const boolean = (description: string, fallback: 'true' | 'false') =>
  Type.Union([Type.Literal('true'), Type.Literal('false'), Type.Literal('1'), Type.Literal('0')], {
    default: fallback,
    description
  })

/**
 * Every environment variable agentd reads, with its default and the form it must have.
 * `.env.example` lists the same variables; a test keeps the two in step.
 */
export const EnvSchema = Type.Object({
  HOST: Type.String({ minLength: 1, default: '127.0.0.1', description: 'an address or host name to listen on' }),
  PORT: integer('an integer from 0 to 65535', '3000'),
  LOG_LEVEL: Type.Union(
    ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].map((level) => Type.Literal(level)),
    { default: 'info', description: 'one of fatal, error, warn, info, debug, trace, silent' }
  ),
  AGENTD_DB: Type.String({ minLength: 1, default: './data/agentd.db', description: 'a SQLite file path, or :memory:' }),
  DATABASE_URL: Type.Optional(
    Type.String({ pattern: '^postgres(ql)?://', description: 'a postgres:// connection URL' })
  ),
  AGENTD_RUN_LEASE_MS: integer('an integer of milliseconds from 500 to 600000', '15000'),
  AGENTD_STORE_TIMEOUT_MS: integer('an integer of milliseconds from 1000 to 600000', '30000'),
  AGENTD_REDIS_URL: Type.Optional(Type.String({ pattern: '^rediss?://', description: 'a redis:// or rediss:// connection URL' })),
  OPENAI_API_KEY: Type.Optional(Type.String({ description: 'the model provider API key' })),
  OPENAI_BASE_URL: Type.Optional(Type.String({ pattern: '^https?://', description: 'an http(s):// base URL of an OpenAI-compatible API' })),
  AGENTD_MODEL: Type.String({ minLength: 1, default: 'gpt-4o-mini', description: 'a model name' }),
  AGENTD_API_KEYS: Type.Optional(
    Type.String({
      pattern: '^[A-Za-z0-9._-]+:[^,:\\s]{16,}(,[A-Za-z0-9._-]+:[^,:\\s]{16,})*$',
      description: 'a comma list of tenant:key pairs; tenant is [A-Za-z0-9._-]+, key is 16+ characters without , : or spaces'
    })
  ),
  AGENTD_WORKSPACES: Type.String({ minLength: 1, default: './data/workspaces', description: 'a folder path' }),
  AGENTD_MAX_STEPS: integer('an integer from 1 to 1000', '25'),
  AGENTD_TOOL_TIMEOUT_MS: integer('an integer of milliseconds from 100 to 3600000', '60000'),
  AGENTD_CONTEXT_TOKENS: integer('an integer of tokens from 256 to 10000000', '100000'),
  AGENTD_MODEL_TIMEOUT_MS: integer('an integer of milliseconds from 100 to 3600000', '120000'),
  AGENTD_MODEL_MAX_RETRIES: integer('an integer from 0 to 10', '3'),
  AGENTD_BODY_LIMIT: integer('an integer of bytes from 1024 to 104857600', '1048576'),
  AGENTD_SHUTDOWN_GRACE_MS: integer('an integer of milliseconds from 0 to 3600000', '10000'),
  AGENTD_BASH_ENABLED: boolean('true or false', 'false'),
  AGENTD_METRICS_PUBLIC: boolean('true or false', 'true'),
  AGENTD_DOCS_PUBLIC: boolean('true or false', 'true'),
  AGENTD_WEBHOOK_HOSTS: Type.String({
    default: '',
    pattern: '^[A-Za-z0-9.:\\[\\]-]*(,[A-Za-z0-9.:\\[\\]-]+)*$',
    description: 'a comma list of host or host:port values webhook tools may call'
  }),
  AGENTD_FETCH_ALLOW_HOSTS: Type.String({
    default: '',
    pattern: '^[A-Za-z0-9.:\\[\\]-]*(,[A-Za-z0-9.:\\[\\]-]+)*$',
    description: 'a comma list of private or loopback hosts http_fetch may reach anyway'
  }),
  AGENTD_CORS_ORIGINS: Type.String({
    default: '',
    pattern: '^((\\*|https?://[^,/\\s]+)(,(\\*|https?://[^,/\\s]+))*)?$',
    description: 'a comma list of browser origins (scheme://host[:port]) or *; empty turns CORS off'
  }),
  AGENTD_RATE_LIMIT_MAX: integer('an integer from 0 to 1000000 (0 turns rate limiting off)', '600'),
  AGENTD_RATE_LIMIT_WINDOW_MS: integer('an integer of milliseconds from 1000 to 86400000', '60000'),
  AGENTD_HSTS_MAX_AGE: integer('an integer of seconds from 0 to 63072000 (0 sends no Strict-Transport-Security)', '0'),
  AGENTD_MAX_SESSIONS_PER_TENANT: integer('an integer from 1 to 100000000', '100000'),
  AGENTD_MAX_ACTIVE_RUNS_PER_TENANT: integer('an integer from 1 to 100000', '64'),
  AGENTD_MAX_STREAMS_PER_KEY: integer('an integer from 1 to 100000', '64'),
  AGENTD_MAX_STREAMS: integer('an integer from 1 to 1000000', '10000'),
  AGENTD_MAX_STREAM_BYTES: integer('an integer of bytes from 65536 to 17179869184', '67108864'),
  AGENTD_TOOL_MAX_OUTPUT_BYTES: integer('an integer of bytes from 1024 to 104857600', '100000'),
  AGENTD_HOOKS_CONFIG: Type.Optional(Type.String({ minLength: 1, description: 'a path to a JSON hooks file {"hooks": [...]}' })),
  // OpenTelemetry's own variables: agentd reads these to decide whether to start the SDK and where it sends.
  OTEL_EXPORTER_OTLP_ENDPOINT: Type.Optional(Type.String({ pattern: '^https?://', description: 'an http(s):// OTLP/HTTP base URL (…:4318)' })),
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: Type.Optional(
    Type.String({ pattern: '^https?://', description: 'an http(s):// OTLP/HTTP traces URL (…:4318/v1/traces)' })
  ),
  OTEL_SERVICE_NAME: Type.String({ minLength: 1, default: 'agentd', description: 'a service name' }),
  OTEL_SDK_DISABLED: boolean('true or false', 'false'),
  AGENTD_MCP_CONFIG: Type.Optional(Type.String({ description: 'a path to a JSON file {"mcpServers": {...}}' }))
})
export type Env = Static<typeof EnvSchema>

export interface Config {
  host: string
  port: number
  logLevel: string
  db: string
  databaseUrl: string | undefined
  /** How long a process's claim on a run holds without its heartbeat (PostgreSQL); the failover time. */
  runLeaseMs: number
  /** How long one PostgreSQL statement may wait for its answer before it fails (a database that stopped answering). */
  storeTimeoutMs: number
  /** Redis for shared rate limits, stream caps and wake-ups between processes; unset = per process. */
  redisUrl: string | undefined
  openai: { apiKey: string | undefined; baseURL: string | undefined }
  /** True when no provider is configured and the built-in dev model answers. */
  useDevModel: boolean
  defaultModel: string
  /** Tenant name by API key; empty when auth is off. */
  apiKeys: ReadonlyMap<string, string>
  workspaces: string
  maxSteps: number
  toolTimeoutMs: number
  /** Tokens a model request may hold (history, instructions, tool definitions), unless a session sets its own. */
  contextTokens: number
  modelTimeoutMs: number
  modelMaxRetries: number
  bodyLimit: number
  shutdownGraceMs: number
  bashEnabled: boolean
  /** True when GET /metrics needs no API key. */
  metricsPublic: boolean
  /** True when GET /openapi.json and /docs need no API key. */
  docsPublic: boolean
  webhookHosts: readonly string[]
  fetchAllowHosts: readonly string[]
  /** Browser origins CORS allows ('*' for any); empty when CORS is off. */
  corsOrigins: readonly string[]
  /** Requests per window per tenant (per IP without API keys); max 0 means no limit. */
  rateLimit: { max: number; windowMs: number }
  /** Strict-Transport-Security max-age in seconds; 0 sends no header. */
  hstsMaxAge: number
  /**
   * Per-tenant and per-key ceilings (reaching one is a 429 LIMIT_EXCEEDED), and the process's own:
   * open SSE streams (503 UNAVAILABLE beyond) and the unsent bytes they may hold together.
   */
  limits: { sessionsPerTenant: number; activeRunsPerTenant: number; streamsPerKey: number; streams: number; streamBytes: number }
  /** Bytes of one tool result the model gets; longer results are cut with a note. */
  toolMaxOutputBytes: number
  /** The operator's hooks from AGENTD_HOOKS_CONFIG (SPEC 15); empty without it. */
  hooks: readonly HookDefinition[]
  /** OpenTelemetry traces: the OTLP/HTTP traces URL (null = tracing off) and the service name. */
  tracing: { endpoint: string | null; serviceName: string }
  /** MCP servers whose tools are offered (AGENTD_MCP_CONFIG); empty when it is unset. */
  mcpServers: readonly McpServerConfig[]
}

/** One bad variable: what it is called, what was wrong, what form it must take. */
export class ConfigError extends Error {
  readonly problems: string[]
  constructor(problems: string[]) {
    super(problems.join('\n'))
    this.name = 'ConfigError'
    this.problems = problems
  }
}

const ranges: Partial<Record<keyof Env, [number, number]>> = {
  PORT: [0, 65535],
  AGENTD_RUN_LEASE_MS: [500, 600_000],
  AGENTD_STORE_TIMEOUT_MS: [1000, 600_000],
  AGENTD_MAX_STEPS: [1, 1000],
  AGENTD_TOOL_TIMEOUT_MS: [100, 3_600_000],
  AGENTD_CONTEXT_TOKENS: [256, 10_000_000],
  AGENTD_MODEL_TIMEOUT_MS: [100, 3_600_000],
  AGENTD_MODEL_MAX_RETRIES: [0, 10],
  AGENTD_BODY_LIMIT: [1024, 104_857_600],
  AGENTD_SHUTDOWN_GRACE_MS: [0, 3_600_000],
  AGENTD_RATE_LIMIT_MAX: [0, 1_000_000],
  AGENTD_RATE_LIMIT_WINDOW_MS: [1000, 86_400_000],
  AGENTD_HSTS_MAX_AGE: [0, 63_072_000],
  AGENTD_MAX_SESSIONS_PER_TENANT: [1, 100_000_000],
  AGENTD_MAX_ACTIVE_RUNS_PER_TENANT: [1, 100_000],
  AGENTD_MAX_STREAMS_PER_KEY: [1, 100_000],
  AGENTD_MAX_STREAMS: [1, 1_000_000],
  AGENTD_MAX_STREAM_BYTES: [65_536, 17_179_869_184],
  AGENTD_TOOL_MAX_OUTPUT_BYTES: [1024, 104_857_600]
}

const LOOPBACK = /^(localhost|127(\.\d{1,3}){3}|::1|\[::1\])$/i

function describe(name: string, value: unknown, expected: string): string {
  const shown = ['AGENTD_API_KEYS', 'OPENAI_API_KEY', 'DATABASE_URL', 'AGENTD_REDIS_URL'].includes(name) ? '(value hidden)' : JSON.stringify(value)
  return `${name}=${shown} is invalid: expected ${expected}`
}

const list = (text: string): string[] => text.split(',').map((item) => item.trim()).filter(Boolean)

/** The OTLP traces URL from the standard variables: the signal-specific one as given, else the base one + /v1/traces. */
function tracesEndpoint(env: Env): string | null {
  if (env.OTEL_SDK_DISABLED === 'true' || env.OTEL_SDK_DISABLED === '1') return null
  if (env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
  if (env.OTEL_EXPORTER_OTLP_ENDPOINT) return `${env.OTEL_EXPORTER_OTLP_ENDPOINT.replace(/\/+$/, '')}/v1/traces`
  return null
}

/** Reads and validates the environment; throws ConfigError listing every problem at once. */
export function loadConfig(source: NodeJS.ProcessEnv = process.env): Readonly<Config> {
  const known = Object.keys(EnvSchema.properties) as Array<keyof Env>
  const raw: Record<string, string> = {}
  for (const name of known) {
    const value = source[name]
    if (value !== undefined && value !== '') raw[name] = value
  }
  const env = Value.Default(EnvSchema, raw) as Env

  const problems = new Map<string, string>()
  for (const error of Value.Errors(EnvSchema, env)) {
    const name = error.path.slice(1)
    if (problems.has(name)) continue
    const schema = EnvSchema.properties[name as keyof Env]
    problems.set(name, describe(name, error.value, schema?.description ?? error.message))
  }
  for (const [name, [min, max]] of Object.entries(ranges) as Array<[keyof Env, [number, number]]>) {
    if (problems.has(name)) continue
    const value = Number(env[name])
    if (!(value >= min && value <= max)) problems.set(name, describe(name, env[name], EnvSchema.properties[name].description ?? ''))
  }

  const apiKeys = new Map<string, string>()
  if (env.AGENTD_API_KEYS && !problems.has('AGENTD_API_KEYS')) {
    for (const pair of env.AGENTD_API_KEYS.split(',')) {
      const [tenant, key] = pair.split(':') as [string, string]
      if (apiKeys.has(key)) {
        problems.set('AGENTD_API_KEYS', 'AGENTD_API_KEYS=(value hidden) is invalid: the same key is given twice')
      }
      apiKeys.set(key, tenant)
    }
  }
  if (apiKeys.size === 0 && !problems.has('HOST') && !problems.has('AGENTD_API_KEYS') && !LOOPBACK.test(env.HOST)) {
    problems.set(
      'HOST',
      `HOST=${JSON.stringify(env.HOST)} is invalid: without AGENTD_API_KEYS agentd listens only on a loopback address (127.0.0.1, ::1, localhost); set AGENTD_API_KEYS to listen on ${env.HOST}`
    )
  }
  let hooks: HookDefinition[] = []
  if (env.AGENTD_HOOKS_CONFIG && !problems.has('AGENTD_HOOKS_CONFIG')) {
    try {
      hooks = loadHooksFile(env.AGENTD_HOOKS_CONFIG)
    } catch (err) {
      if (!(err instanceof HooksConfigError)) throw err
      problems.set('AGENTD_HOOKS_CONFIG', `AGENTD_HOOKS_CONFIG=${JSON.stringify(env.AGENTD_HOOKS_CONFIG)} is invalid: ${err.message}`)
    }
  }
  let mcpServers: McpServerConfig[] = []
  if (env.AGENTD_MCP_CONFIG) {
    try {
      mcpServers = readMcpConfig(env.AGENTD_MCP_CONFIG)
    } catch (err) {
      if (!(err instanceof McpConfigError)) throw err
      problems.set('AGENTD_MCP_CONFIG', err.message)
    }
  }
  if (problems.size > 0) throw new ConfigError([...problems.values()])

  const flag = (value: string) => value === 'true' || value === '1'
  return Object.freeze({
    host: env.HOST,
    port: Number(env.PORT),
    logLevel: env.LOG_LEVEL,
    db: env.AGENTD_DB,
    databaseUrl: env.DATABASE_URL,
    runLeaseMs: Number(env.AGENTD_RUN_LEASE_MS),
    storeTimeoutMs: Number(env.AGENTD_STORE_TIMEOUT_MS),
    redisUrl: env.AGENTD_REDIS_URL,
    openai: { apiKey: env.OPENAI_API_KEY, baseURL: env.OPENAI_BASE_URL },
    useDevModel: !env.OPENAI_API_KEY && !env.OPENAI_BASE_URL,
    defaultModel: env.AGENTD_MODEL,
    apiKeys,
    workspaces: env.AGENTD_WORKSPACES,
    maxSteps: Number(env.AGENTD_MAX_STEPS),
    toolTimeoutMs: Number(env.AGENTD_TOOL_TIMEOUT_MS),
    contextTokens: Number(env.AGENTD_CONTEXT_TOKENS),
    modelTimeoutMs: Number(env.AGENTD_MODEL_TIMEOUT_MS),
    modelMaxRetries: Number(env.AGENTD_MODEL_MAX_RETRIES),
    bodyLimit: Number(env.AGENTD_BODY_LIMIT),
    shutdownGraceMs: Number(env.AGENTD_SHUTDOWN_GRACE_MS),
    bashEnabled: flag(env.AGENTD_BASH_ENABLED),
    metricsPublic: flag(env.AGENTD_METRICS_PUBLIC),
    docsPublic: flag(env.AGENTD_DOCS_PUBLIC),
    webhookHosts: list(env.AGENTD_WEBHOOK_HOSTS),
    fetchAllowHosts: list(env.AGENTD_FETCH_ALLOW_HOSTS),
    corsOrigins: list(env.AGENTD_CORS_ORIGINS),
    rateLimit: { max: Number(env.AGENTD_RATE_LIMIT_MAX), windowMs: Number(env.AGENTD_RATE_LIMIT_WINDOW_MS) },
    hstsMaxAge: Number(env.AGENTD_HSTS_MAX_AGE),
    limits: {
      sessionsPerTenant: Number(env.AGENTD_MAX_SESSIONS_PER_TENANT),
      activeRunsPerTenant: Number(env.AGENTD_MAX_ACTIVE_RUNS_PER_TENANT),
      streamsPerKey: Number(env.AGENTD_MAX_STREAMS_PER_KEY),
      streams: Number(env.AGENTD_MAX_STREAMS),
      streamBytes: Number(env.AGENTD_MAX_STREAM_BYTES)
    },
    toolMaxOutputBytes: Number(env.AGENTD_TOOL_MAX_OUTPUT_BYTES),
    hooks: Object.freeze(hooks),
    tracing: {
      endpoint: tracesEndpoint(env),
      serviceName: env.OTEL_SERVICE_NAME
    },
    mcpServers
  })
}
