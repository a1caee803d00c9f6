import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js'
import { AjvJsonSchemaValidator } from '@modelcontextprotocol/sdk/validation/ajv'
import { ResultSchema, ToolListChangedNotificationSchema, ToolSchema, type Tool as McpToolInfo } from '@modelcontextprotocol/sdk/types.js'
import type { Logger } from 'pino'
import { Agent, fetch as undiciFetch } from 'undici'
import { version } from '../../version.ts'
import type { Tool } from '../types.ts'
import type { McpServerConfig } from './config.ts'
import { queuedLookup } from '../net-guard.ts'
import { resultText } from './content.ts'
import { answerEnded, withMissingAnswer } from './http-answers.ts'
import { classifyCallFailure, messageTooLarge, serverUnavailable, toolReportedError, toolWithdrawn, unreadableResult } from './errors.ts'
import { mcpToolSchema, type McpToolSchema } from './schema.ts'
import { ProcessGroupStdioTransport } from './stdio-transport.ts'

export type McpServerState = 'starting' | 'up' | 'down' | 'stopped'

/** A server as GET /v1/tools and /readyz report it. */
export interface McpServerStatus {
  name: string
  transport: 'stdio' | 'http'
  state: McpServerState
  /** Tools from its last listing (kept while it is down: a call then fails as retryable). */
  tools: number
  lastError: string | null
  /** Connection attempts after the first. */
  restarts: number
  /** When the next connection attempt is due, while down. */
  nextAttemptAt: string | null
}

export interface McpConnectionOptions {
  logger: Logger
  /** Limit of the initialize handshake and of tools/list. */
  connectTimeoutMs: number
  /** Reconnect delay: base × 2^(failures − 1), capped, with jitter. */
  backoffBaseMs: number
  backoffCapMs: number
  /** Largest JSON-RPC line a stdio server may send. */
  maxMessageBytes: number
  /** After SIGTERM to a stdio server's group, how long before SIGKILL. */
  killGraceMs: number
}

/** The request timeout the SDK applies is turned off: the tools runtime owns the deadline and aborts the signal. */
const NO_SDK_TIMEOUT = 2 ** 31 - 1
/**
 * Every page of a paginated tools/list, up to 10 000 tools. A server whose pages never end (a
 * nextCursor on every page, tools or not) fails the attempt: agentd's start waits for it.
 */
async function listPages(page: (params: { cursor?: string }) => Promise<{ tools: unknown[]; nextCursor?: string | undefined }>): Promise<unknown[]> {
  const listed: unknown[] = []
  let cursor: string | undefined
  for (let pages = 0; ; pages++) {
    if (pages === MAX_TOOL_PAGES) throw new Error(`tools/list still had a next page after ${MAX_TOOL_PAGES} pages`)
    const answer = await page(cursor === undefined ? {} : { cursor })
    listed.push(...answer.tools)
    cursor = answer.nextCursor
    if (cursor === undefined || listed.length >= 10_000) return listed
  }
}
const MAX_TOOL_PAGES = 100

/**
 * Whether a call's next progress notification becomes a tool:progress event: bursts of
 * PROGRESS_BURST, then PROGRESS_PER_SECOND. Each event is stored in the session's log and sent
 * to every stream, so a server that floods notifications must not flood those.
 */
function progressGate(): () => boolean {
  let tokens = PROGRESS_BURST
  let last = performance.now()
  return () => {
    const now = performance.now()
    tokens = Math.min(PROGRESS_BURST, tokens + ((now - last) * PROGRESS_PER_SECOND) / 1000)
    last = now
    if (tokens < 1) return false
    tokens--
    return true
  }
}
const PROGRESS_BURST = 10
const PROGRESS_PER_SECOND = 10

/** A Streamable HTTP server's 404 to a request that carried agentd's Mcp-Session-Id: it does not know the session (any more). */
function sessionUnknown(err: unknown, transport: Transport | undefined): boolean {
  return err instanceof StreamableHTTPError && err.code === 404 && transport instanceof StreamableHTTPClientTransport && transport.sessionId !== undefined
}

/** How long stop() waits for an HTTP server to end agentd's session before it closes the connection all the same. */
const END_SESSION_TIMEOUT_MS = 2000

/** Tool names the model may call: OpenAI's function-name rule. */
const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/

/**
 * One configured MCP server: connects, lists its tools as agentd tools named `<server>__<tool>`,
 * follows tools/list_changed, and reconnects with backoff whenever the connection ends (a stdio
 * process that died, an HTTP server that went away) until stop().
 */
export class McpConnection {
  readonly config: McpServerConfig
  readonly #options: McpConnectionOptions
  readonly #log: Logger
  #state: McpServerState = 'starting'
  #client: Client | undefined
  #transport: Transport | undefined
  /** An HTTP server's connection pool, kept across reconnects, closed by stop(). */
  #http: Agent | undefined
  #tools: Tool[] = []
  #lastError: string | null = null
  #lastStderr: string | null = null
  #failures = 0
  /** When the connection of now came up; null while there is none. */
  #upSince: number | null = null
  #restarts = 0
  #retryTimer: NodeJS.Timeout | undefined
  #nextAttemptAt: number | null = null
  #attempt: Promise<void> | undefined
  /** The client of the attempt under way, so stop() need not wait for a server that never answers. */
  #connecting: Client | undefined
  #probing = false
  /** The client whose tools/list after list_changed is under way; another notification came since it started. */
  #relisting: Client | undefined
  #relistAgain = false

  constructor(config: McpServerConfig, options: McpConnectionOptions) {
    this.config = config
    this.#options = options
    this.#log = options.logger.child({ mcpServer: config.name })
  }

  get state(): McpServerState {
    return this.#state
  }

  /** The server's tools from its last listing; while it is down they stay offered and a call fails as `exception`, retryable. */
  get tools(): readonly Tool[] {
    return this.#tools
  }

  status(): McpServerStatus {
    return {
      name: this.config.name,
      transport: this.config.transport,
      state: this.#state,
      tools: this.#tools.length,
      lastError: this.#lastError,
      restarts: this.#restarts,
      nextAttemptAt: this.#nextAttemptAt === null ? null : new Date(this.#nextAttemptAt).toISOString()
    }
  }

  /** Makes the first connection attempt; resolves when it has succeeded or failed (a failure schedules a retry, it never throws). */
  start(): Promise<void> {
    this.#attempt ??= this.#connect()
    return this.#attempt
  }

  /** Ends the connection (a stdio server's whole process group) and stops reconnecting. */
  async stop(): Promise<void> {
    this.#state = 'stopped'
    clearTimeout(this.#retryTimer)
    this.#nextAttemptAt = null
    this.#setTools([])
    const client = this.#client
    const transport = this.#transport
    this.#client = undefined
    await this.#connecting?.close().catch(() => undefined)
    await this.#attempt?.catch(() => undefined)
    if (transport instanceof StreamableHTTPClientTransport && client) await this.#endSession(transport)
    await client?.close().catch(() => undefined)
    await this.#http?.destroy().catch(() => undefined)
    this.#http = undefined
  }

  /**
   * Asks a Streamable HTTP server to end agentd's MCP session (DELETE with its Mcp-Session-Id),
   * which it would otherwise keep until it expires: one per restart of agentd. A 405 means the
   * server does not end sessions, which is fine. A server that does not answer within
   * END_SESSION_TIMEOUT_MS does not hold the shutdown: the client's close() aborts the request.
   */
  async #endSession(transport: StreamableHTTPClientTransport): Promise<void> {
    const ending = transport.terminateSession().then(
      () => 'ended' as const,
      (err: unknown) => {
        this.#log.warn({ err }, 'MCP session not ended: the server may keep it until it expires')
        return 'failed' as const
      }
    )
    let timer: NodeJS.Timeout | undefined
    const late = new Promise<'late'>((resolve) => {
      timer = setTimeout(resolve, END_SESSION_TIMEOUT_MS, 'late')
    })
    const outcome = await Promise.race([ending, late])
    clearTimeout(timer)
    if (outcome === 'late') this.#log.warn({ timeoutMs: END_SESSION_TIMEOUT_MS }, 'MCP session not ended: the server did not answer in time')
  }

  async #connect(): Promise<void> {
    if (this.#state === 'stopped') return
    this.#state = 'starting'
    this.#nextAttemptAt = null
    this.#lastStderr = null
    const transport = this.#makeTransport()
    const client = new Client({ name: 'agentd', version }, { capabilities: {} })
    client.onerror = (err) => {
      this.#log.debug({ err }, 'MCP transport error')
      // The HTTP transport reports a broken stream only here, and a call waiting on that stream
      // would wait for its timeout: a ping decides whether the server is still there.
      if (this.config.transport === 'http' && this.#client === client) this.#probe(client)
    }
    client.onclose = () => this.#closed(client)
    client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
      if (this.#client === client) this.#listChanged(client)
    })
    this.#connecting = client
    try {
      await client.connect(transport, { timeout: this.#options.connectTimeoutMs })
      if (this.#stopped()) {
        await client.close()
        return
      }
      this.#client = client
      this.#transport = transport
      await this.#refreshTools(client)
      this.#state = 'up'
      this.#upSince = Date.now()
      this.#lastError = null
      this.#log.info({ tools: this.#tools.length }, 'MCP server up')
    } catch (err) {
      // Described before close(): how the process ended by itself, not the kill that follows.
      // The SDK's message for an HTTP error is the answer's body, which may be empty; the status says more.
      const status = err instanceof StreamableHTTPError && typeof err.code === 'number' && err.code > 0 ? `HTTP ${err.code}: ` : ''
      const why = `${this.#describe(transport)}${status}${(err as Error).message ?? String(err)}`
      this.#client = undefined
      await client.close().catch(() => undefined)
      if (this.#stopped()) return
      this.#down(why)
    } finally {
      this.#connecting = undefined
      this.#attempt = undefined
    }
  }

  /** stop() may run while an attempt awaits; a method, so the check is not narrowed away. */
  #stopped(): boolean {
    return this.#state === 'stopped'
  }

  #makeTransport(): Transport {
    const config = this.config
    if (config.transport === 'http') {
      // Its host lookups take the tools' lookup slots (net-guard.ts): a server whose DNS never
      // answers, retried at every reconnect, holds no more of libuv's thread pool than a tool's would.
      const dispatcher = (this.#http ??= new Agent({
        connect: { timeout: this.#options.connectTimeoutMs, lookup: queuedLookup(this.#options.connectTimeoutMs) }
      }))
      // An answer's event stream that ends without the answer fails its request at once (http-answers.ts).
      const fetch = (async (url: string | URL, init?: RequestInit) =>
        withMissingAnswer(init, await undiciFetch(url, { ...(init as Parameters<typeof undiciFetch>[1]), dispatcher }) as unknown as Response)) as typeof globalThis.fetch
      return new StreamableHTTPClientTransport(new URL(config.url), { requestInit: { headers: config.headers }, fetch })
    }
    return new ProcessGroupStdioTransport(config, {
      maxMessageBytes: this.#options.maxMessageBytes,
      killGraceMs: this.#options.killGraceMs,
      onStderr: (line) => {
        this.#lastStderr = line
        this.#log.debug({ stderr: line }, 'MCP server stderr')
      }
    })
  }

  /** What the process's end says, for lastError (`exited with code 1: <last stderr line>: `). */
  #describe(transport: Transport): string {
    if (!(transport instanceof ProcessGroupStdioTransport) || !transport.exit) return ''
    const { code, signal } = transport.exit
    const how = signal ? `killed by ${signal}` : `exited with code ${code}`
    return `${how}${this.#lastStderr ? ` (stderr: ${this.#lastStderr.slice(0, 300)})` : ''}: `
  }

  /** The live connection ended by itself: calls in flight were already rejected by the SDK; reconnect. */
  #closed(client: Client): void {
    if (this.#client !== client || this.#state === 'stopped') return
    this.#client = undefined
    const transport = this.#transport
    const reason = transport instanceof ProcessGroupStdioTransport && transport.closeReason === 'message_too_large'
      ? 'it sent a message over the size limit and was stopped'
      : 'the connection closed'
    this.#down(`${transport ? this.#describe(transport) : ''}${reason}`)
  }

  #probe(client: Client): void {
    if (this.#probing) return
    this.#probing = true
    client.ping({ timeout: Math.min(this.#options.connectTimeoutMs, 10_000) }).then(
      () => undefined,
      (err: unknown) => {
        if (this.#client !== client) return
        // A 404: the server is there but expired the session (its stream ended, and reopening
        // it was refused too); a new one is made at once, as for a call (#renewSession).
        if (sessionUnknown(err, this.#transport)) void this.#renewSession(client)
        else this.#abandon(`it stopped answering: ${(err as Error).message}`)
      }
    ).finally(() => {
      this.#probing = false
    })
  }

  /**
   * A new MCP session in place of `stale`, whose Streamable HTTP server answered 404 to its
   * Mcp-Session-Id: the server expired or lost the session (a restart) and, as MCP has it, the
   * client starts a new one with a new initialize, at once rather than after a backoff, since
   * the server is there. Calls that got the 404 together share the one new connection. Undefined
   * when it could not be made (the server is then down, and reconnects with backoff as usual).
   */
  async #renewSession(stale: Client): Promise<Client | undefined> {
    if (this.#client === stale && this.#state === 'up') {
      this.#log.info('MCP server no longer knows the session (HTTP 404); starting a new one')
      this.#client = undefined
      void stale.close().catch(() => undefined)
      this.#attempt ??= this.#connect()
    }
    await this.#attempt
    return this.#state === 'up' ? this.#client : undefined
  }

  /** Ends a live connection that failed a call at the network level (HTTP): the next attempt reconnects. */
  #abandon(reason: string): void {
    const client = this.#client
    if (!client || this.#state === 'stopped') return
    this.#client = undefined
    void client.close().catch(() => undefined)
    this.#down(reason)
  }

  #down(reason: string): void {
    // The delay starts over only after the server stayed up as long as the longest delay: one
    // that crashes soon after each start is a crash loop, not a new failure.
    if (this.#upSince !== null && Date.now() - this.#upSince >= this.#options.backoffCapMs) this.#failures = 0
    this.#upSince = null
    this.#state = 'down'
    this.#lastError = reason.slice(0, 1000)
    this.#failures++
    const exp = Math.min(this.#options.backoffCapMs, this.#options.backoffBaseMs * 2 ** Math.min(this.#failures - 1, 20))
    // Half fixed, half random: servers that died together do not all come back in the same instant.
    const delay = Math.round(exp / 2 + Math.random() * (exp / 2))
    this.#nextAttemptAt = Date.now() + delay
    this.#log.warn({ reason: this.#lastError, retryInMs: delay }, 'MCP server down')
    clearTimeout(this.#retryTimer)
    this.#retryTimer = setTimeout(() => {
      this.#restarts++
      this.#attempt ??= this.#connect()
    }, delay)
    this.#retryTimer.unref()
  }

  /**
   * One listing at a time, and one more after it for every notification that came meanwhile: a
   * burst of list_changed is a few tools/list, not one each, and a slow listing never lands
   * after a newer one.
   */
  #listChanged(client: Client): void {
    if (this.#relisting === client) {
      this.#relistAgain = true
      return
    }
    this.#relisting = client
    this.#relistAgain = false
    void (async () => {
      do {
        this.#relistAgain = false
        await this.#refreshTools(client)
      } while (this.#relistAgain && this.#client === client)
    })().catch((err: unknown) => this.#log.warn({ err }, 'MCP tools/list after list_changed failed')).finally(() => {
      if (this.#relisting === client) this.#relisting = undefined
    })
  }

  async #refreshTools(client: Client): Promise<void> {
    const listed = await this.#listTools(client)
    if (this.#client !== client) return
    const tools: Tool[] = []
    const names = new Set<string>()
    let ajv: AjvJsonSchemaValidator | undefined
    const validator = () => (ajv ??= new AjvJsonSchemaValidator())
    for (const raw of listed) {
      const parsed = ToolSchema.safeParse(raw)
      if (!parsed.success) {
        const issue = parsed.error.issues[0]
        const name = (raw as { name?: unknown } | null)?.name
        this.#log.warn({ tool: typeof name === 'string' ? name.slice(0, 200) : null, problem: issue ? `${issue.path.join('.')}: ${issue.message}` : 'invalid' }, 'MCP tool skipped: its definition is not a valid MCP tool')
        continue
      }
      const tool = this.#adapt(parsed.data, validator)
      if (!tool) continue
      // Two tools whose names differ only in characters replaced by "_" (or a name listed twice):
      // the first keeps the name, so that <server>__* and the calls stay unambiguous.
      if (names.has(tool.name)) {
        this.#log.warn({ tool: parsed.data.name }, `MCP tool skipped: another tool of the server is already named ${tool.name}`)
        continue
      }
      names.add(tool.name)
      tools.push(tool)
    }
    this.#setTools(tools)
  }

  /**
   * Every page of tools/list, each tool as the server wrote it. Not listTools(): the SDK refuses
   * a whole listing when one tool in it is malformed (a schema that is not an object, an output
   * schema Ajv cannot compile), which would keep every tool of the server down; #refreshTools
   * checks each tool on its own.
   */
  async #listTools(client: Client): Promise<unknown[]> {
    return await listPages(async (params) => {
      const page = await client.request({ method: 'tools/list', params }, ResultSchema, { timeout: this.#options.connectTimeoutMs })
      if (!Array.isArray(page['tools'])) throw new Error('tools/list answered without a tools array')
      return { tools: page['tools'] as unknown[], nextCursor: typeof page['nextCursor'] === 'string' ? page['nextCursor'] : undefined }
    })
  }

  #setTools(tools: Tool[]): void {
    if (tools.length > 0 || this.#tools.length > 0) this.#log.info({ tools: tools.map((tool) => tool.name) }, 'MCP tools changed')
    this.#tools = tools
  }

  /** An MCP tool as an agentd tool; null (with a warning) when its name or schema cannot be offered to a model. */
  #adapt(info: McpToolInfo, validator: () => AjvJsonSchemaValidator): Tool | null {
    const server = this.config.name
    const name = `${server}__${info.name.replace(/[^A-Za-z0-9_-]/g, '_')}`
    if (!TOOL_NAME.test(name)) {
      this.#log.warn({ tool: info.name }, `MCP tool skipped: ${name} is longer than 64 characters`)
      return null
    }
    let schema: McpToolSchema
    try {
      schema = mcpToolSchema(name, info.inputSchema as Record<string, unknown>, validator)
    } catch (err) {
      this.#log.warn({ tool: info.name, err }, 'MCP tool skipped: its inputSchema cannot be used')
      return null
    }
    return {
      name,
      description: info.description ?? info.title ?? `${info.name} from the MCP server ${server}`,
      parameters: schema.parameters,
      ...(schema.check ? { checkInput: schema.check } : {}),
      execute: async (input, ctx) => {
        const invalid = schema.check?.(input)
        if (invalid) throw invalid
        // The connection of now, not the one that listed the tool: a run may span a restart.
        const client = this.#client
        if (!client || this.#state !== 'up') {
          throw serverUnavailable(server, name, this.#state, this.#lastError, this.#nextAttemptAt === null ? null : this.#nextAttemptAt - Date.now())
        }
        // A run keeps the tools it started with; the server may have withdrawn one since.
        if (!this.#tools.some((tool) => tool.name === name)) throw toolWithdrawn(server, name)
        const reportProgress = progressGate()
        // A plain request with a loose result schema, not callTool(): its strict schema refuses a
        // whole result for one content block of a type it does not know (a newer protocol's),
        // which content.ts describes instead. Its check of structuredContent against an
        // outputSchema is given up with it: the model gets the content blocks.
        const call = (on: Client) => on.request({ method: 'tools/call', params: { name: info.name, arguments: input as Record<string, unknown> } }, ResultSchema, {
          signal: ctx.signal,
          timeout: NO_SDK_TIMEOUT,
          onprogress: ({ progress, total, message }) => {
            // The documented fields only: the notification's _meta (the server's own, any size) is not an event's.
            if (reportProgress()) {
              ctx.emit('progress', { progress, ...(total === undefined ? {} : { total }), ...(message === undefined ? {} : { message: message.slice(0, 1000) }) })
            }
          }
        })
        try {
          let result: Awaited<ReturnType<typeof call>>
          try {
            result = await call(client)
          } catch (err) {
            // The server no longer knows agentd's session and did not run the call: sent again, once, on a new one.
            const renewed = sessionUnknown(err, this.#transport) && !ctx.signal.aborted ? await this.#renewSession(client) : undefined
            if (!renewed) throw err
            result = await call(renewed)
          }
          const text = resultText(result)
          if (text === null) throw unreadableResult(server, name, result['content'])
          return result.isError === true ? toolReportedError(name, text) : text
        } catch (err) {
          // The runtime reports a timeout or interrupt itself; the SDK has sent notifications/cancelled.
          if (ctx.signal.aborted) throw err
          const transport = this.#transport
          if (transport instanceof ProcessGroupStdioTransport && transport.closeReason === 'message_too_large') {
            throw messageTooLarge(server, name, this.#options.maxMessageBytes)
          }
          const failure = classifyCallFailure(server, name, err)
          if (this.config.transport === 'http' && failure.errorType === 'exception') {
            // An answer that ended without its result says nothing of the server (the next call
            // may well be answered); a ping decides, as for a broken stream.
            if (answerEnded(err)) this.#probe(client)
            else this.#abandon(failure.message)
          }
          throw failure
        }
      }
    }
  }
}
