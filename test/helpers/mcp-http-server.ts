import { randomUUID } from 'node:crypto'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { z } from 'zod'

export interface McpHttpServer {
  /** The MCP endpoint, http://127.0.0.1:<port>/mcp. */
  url: string
  /** Request headers of every POST it got, in order. */
  headers: IncomingMessage['headers'][]
  /** Ids of the `hang` calls that started. */
  hanging: string[]
  /** Ids of the requests a client cancelled (notifications/cancelled reached the tool). */
  cancelled: string[]
  /** The Mcp-Session-Id of each session it handed out, in order. */
  sessions: string[]
  /** The Mcp-Session-Id of each DELETE it got (a client ending its session), in order. */
  deletes: Array<string | undefined>
  /**
   * Forgets every session, as a server that expires idle ones does: a request with one of their
   * IDs is answered 404, as MCP has it. `closeStreams`: their open event streams end too.
   */
  forgetSessions(options?: { closeStreams?: boolean }): Promise<void>
  close(): Promise<void>
}

export interface McpHttpServerOptions {
  /** Never answer a DELETE: a server that does not end sessions and does not say so. */
  holdDeletes?: boolean
  /** Tools whose calls are answered with an event stream that ends without a result (a worker that died behind a proxy). */
  endWithoutAnswer?: string[]
}

function buildServer(hanging: string[], cancelled: string[]): McpServer {
  const server = new McpServer({ name: 'test-http', version: '1.0.0' })
  server.registerTool('echo', { description: 'Echoes the text', inputSchema: { text: z.string() } }, async ({ text }) => ({
    content: [{ type: 'text', text }]
  }))
  server.registerTool('fail', { description: 'Reports an error result', inputSchema: {} }, async () => ({
    isError: true,
    content: [{ type: 'text', text: 'the upstream system said no' }]
  }))
  server.registerTool('countdown', { description: 'Reports progress, then answers', inputSchema: { steps: z.number() } }, async ({ steps }, extra) => {
    const token = extra._meta?.progressToken
    for (let i = 1; i <= steps; i++) {
      if (token !== undefined) {
        await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: i, total: steps, message: `step ${i}` } })
      }
      await new Promise((resolve) => setTimeout(resolve, 10))
    }
    return { content: [{ type: 'text', text: `counted ${steps}` }] }
  })
  server.registerTool('hang', { description: 'Never answers', inputSchema: {} }, async (_args, extra) => {
    hanging.push(String(extra.requestId))
    await new Promise<void>((resolve) => extra.signal.addEventListener('abort', () => resolve()))
    cancelled.push(String(extra.requestId))
    return { content: [] }
  })
  return server
}

/** A Streamable HTTP MCP server built from the SDK's McpServer and StreamableHTTPServerTransport, on a loopback port. */
export async function startMcpHttpServer(options: McpHttpServerOptions = {}): Promise<McpHttpServer> {
  const transports = new Map<string, StreamableHTTPServerTransport>()
  const headers: IncomingMessage['headers'][] = []
  const hanging: string[] = []
  const cancelled: string[] = []
  const sessions: string[] = []
  const deletes: Array<string | undefined> = []

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    if (req.method === 'POST') headers.push(req.headers)
    const sessionId = req.headers['mcp-session-id']
    if (req.method === 'DELETE') {
      deletes.push(typeof sessionId === 'string' ? sessionId : undefined)
      if (options.holdDeletes) return
    }
    let transport = typeof sessionId === 'string' ? transports.get(sessionId) : undefined
    if (!transport && typeof sessionId === 'string') {
      res.writeHead(404, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32001, message: 'Session not found' }, id: null }))
      return
    }
    if (!transport) {
      if (req.method !== 'POST') {
        res.writeHead(400).end()
        return
      }
      const created: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => {
          sessions.push(id)
          transports.set(id, created)
        }
      })
      created.onclose = () => {
        if (created.sessionId) transports.delete(created.sessionId)
      }
      await buildServer(hanging, cancelled).connect(created)
      transport = created
    }
    if (req.method === 'POST' && options.endWithoutAnswer) {
      const parts: Buffer[] = []
      for await (const part of req) parts.push(part as Buffer)
      const body = JSON.parse(Buffer.concat(parts).toString('utf8')) as { method?: string; params?: { name?: string } }
      if (body.method === 'tools/call' && options.endWithoutAnswer.includes(body.params?.name ?? '')) {
        res.writeHead(200, { 'content-type': 'text/event-stream' }).end()
        return
      }
      await transport.handleRequest(req, res, body)
      return
    }
    await transport.handleRequest(req, res)
  }

  const http = createServer((req, res) => {
    handle(req, res).catch(() => {
      if (!res.headersSent) res.writeHead(500)
      res.end()
    })
  })
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve))
  const { port } = http.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}/mcp`,
    headers,
    hanging,
    cancelled,
    sessions,
    deletes,
    async forgetSessions({ closeStreams = false } = {}) {
      const forgotten = [...transports.values()]
      transports.clear()
      if (closeStreams) for (const transport of forgotten) await transport.close().catch(() => undefined)
    },
    async close() {
      for (const transport of transports.values()) await transport.close().catch(() => undefined)
      http.closeAllConnections()
      await new Promise<void>((resolve) => http.close(() => resolve()))
    }
  }
}
