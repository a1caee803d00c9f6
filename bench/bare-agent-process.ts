/**
 * Child process entry: the least a Node agent service does for the e2e workload, as a yardstick
 * for what agentd's own machinery costs. It serves the two routes the bench client calls, with
 * node:http and no framework, and keeps nothing: POST /v1/sessions answers an id; POST
 * /v1/sessions/{id}/messages streams SSE frames (`state_changed`, `text_chunk`,
 * `tool_executed`, `done`) as it goes. Each step calls the model through agentd's own provider
 * (src/model/provider.ts) with agentd's default tools, and runs the tool calls with agentd's own
 * runtime and built-in tools, in a workspace made per session. No store, no event log, no
 * coordination, no limits, no auth: the difference between its figures and agentd's is what
 * persistence and the service around the loop cost. It answers the bench's 'heap' question (what it
 * allocated and its GC pauses since the last one: bench/heap-watch.ts).
 * `node bench/bare-agent-process.ts <model base URL> <workspaces folder>`; the bench removes the folder.
 */
import { mkdirSync } from 'node:fs'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { join } from 'node:path'
import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions'
import pino from 'pino'
import { loadConfig } from '../src/config.ts'
import { createOpenAIProvider } from '../src/model/provider.ts'
import { ToolCatalog } from '../src/tools/catalog.ts'
import { runTool } from '../src/tools/runtime.ts'
import type { SessionRecord } from '../src/store/store.ts'
import { serveChild } from './child.ts'
import { watchHeap } from './heap-watch.ts'

const [modelUrl, workspaces] = process.argv.slice(2)
if (!modelUrl || !workspaces) throw new Error('usage: bare-agent-process.ts <model base URL> <workspaces folder>')
const model = createOpenAIProvider({ kind: 'dev', apiKey: 'bench', baseURL: modelUrl })
// The default tool set, as a session without `tools` gets it.
const tools = await new ToolCatalog(loadConfig({ AGENTD_WORKSPACES: workspaces })).resolve({ tools: null } as SessionRecord)
const MAX_STEPS = 5
let sessions = 0
/** Sessions created with `tools: []`. */
const toolless = new Set<string>()

const server = createServer((req, res) => {
  answer(req, res).catch(() => res.destroy())
})

async function answer(req: IncomingMessage, res: ServerResponse): Promise<void> {
  const parts: Buffer[] = []
  for await (const part of req) parts.push(part as Buffer)
  if (req.method === 'POST' && req.url === '/v1/sessions') {
    const id = `ses_bare${++sessions}`
    mkdirSync(join(workspaces as string, id))
    // `tools: []`, as agentd takes it: the session's model calls offer no tool (the latency bench's text-only runs).
    const body = parts.length > 0 ? (JSON.parse(Buffer.concat(parts).toString('utf8')) as { tools?: unknown[] }) : {}
    if (Array.isArray(body.tools) && body.tools.length === 0) toolless.add(id)
    res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({ id }))
    return
  }
  const session = /^\/v1\/sessions\/([^/]+)\/messages$/.exec(req.url ?? '')?.[1]
  if (req.method !== 'POST' || !session) {
    res.writeHead(404).end()
    return
  }
  const { content } = JSON.parse(Buffer.concat(parts).toString('utf8')) as { content: string }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
  let seq = 0
  const frame = (type: string, data: Record<string, unknown>) => {
    seq++
    res.write(`id: ${seq}\nevent: ${type}\ndata: ${JSON.stringify({ seq, type, data })}\n\n`)
  }
  const signal = new AbortController().signal
  const logger = pino({ enabled: false })
  const workspace = join(workspaces as string, session)
  const messages: ChatCompletionMessageParam[] = [{ role: 'user', content }]
  frame('state_changed', { from: 'queued', to: 'running' })
  for (let step = 1; step <= MAX_STEPS; step++) {
    const calls: Array<{ id: string; name: string; arguments: string }> = []
    const offered = toolless.has(session) ? {} : { tools: tools.definitions }
    for await (const part of model.stream({ model: 'bench', messages, ...offered }, { signal, requestId: 'req_bare' })) {
      if (part.type === 'text') frame('text_chunk', { step, delta: part.delta })
      else if (part.type === 'tool_call') calls.push(part)
    }
    if (calls.length === 0) break
    messages.push({ role: 'assistant', content: null, tool_calls: calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })) })
    for (const call of calls) {
      const entry = tools.get(call.name)
      if (entry?.kind !== 'server') throw new Error(`${call.name} is not a server tool`)
      const outcome = await runTool(entry.tool, JSON.parse(call.arguments || '{}'), {
        signal, sessionId: session, callId: call.id, workspace, logger, emit: () => undefined
      }, { timeoutMs: 30_000, maxOutputBytes: 100_000 })
      frame('tool_executed', { ok: outcome.ok })
      messages.push({ role: 'tool', tool_call_id: call.id, content: JSON.stringify(outcome.ok ? outcome.result : outcome.error) })
    }
  }
  frame('done', { reason: 'completed' })
  res.end()
}

server.listen(0, '127.0.0.1', () => {
  const address = server.address()
  if (!address || typeof address === 'string') throw new Error('no address')
  // 'heap': what it allocated and its GCs since the last question (the latency bench asks at each phase).
  const heap = watchHeap()
  serveChild(`http://127.0.0.1:${address.port}`, async () => {
    server.close()
    await model.close()
  }, { heap: () => heap.sample() })
})
