import { once } from 'node:events'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions'
import { createOpenAIProvider } from '../../src/model/provider.ts'
import type { ModelProvider } from '../../src/model/types.ts'

/** A chat completion request as a model server received it. */
export interface ReceivedRequest {
  model: string
  messages: ChatCompletionMessageParam[]
  max_tokens?: number
  max_completion_tokens?: number
  [key: string]: unknown
}

/** How the server answers one request; `raw` is the body's text as it came. */
export type ModelAnswer = (res: ServerResponse, request: ReceivedRequest, raw: string) => void | Promise<void>

interface Teardown {
  teardown(fn: () => unknown): void
}

/**
 * A model server that is not agentd's dev model: every request is answered by `answer`, written
 * by the test as some provider answers. The provider pointed at it has short timeouts.
 */
export async function startModelServer(t: Teardown, answer: ModelAnswer): Promise<{ provider: ModelProvider; requests: ReceivedRequest[] }> {
  const requests: ReceivedRequest[] = []
  const server = createServer((req, res) => {
    void (async () => {
      const parts: Buffer[] = []
      for await (const part of req) parts.push(part as Buffer)
      const raw = Buffer.concat(parts).toString('utf8')
      const request = JSON.parse(raw) as ReceivedRequest
      requests.push(request)
      await answer(res, request, raw)
    })().catch(() => res.destroy())
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const provider = createOpenAIProvider({
    apiKey: 'test-key',
    baseURL: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    headersTimeoutMs: 2000,
    bodyTimeoutMs: 2000
  })
  t.teardown(async () => {
    server.closeAllConnections()
    server.close()
    await provider.close()
  })
  return { provider, requests }
}

/** A Chat Completions stream chunk with one choice. */
export const chunk = (delta: object, finishReason: string | null = null): string =>
  JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 0, model: 'm', choices: [{ index: 0, delta, finish_reason: finishReason }] })

/** Answers with these SSE data lines, then ends the body. */
export function streamOf(res: ServerResponse, ...data: string[]): void {
  res.writeHead(200, { 'content-type': 'text/event-stream' })
  res.end(data.map((d) => `data: ${d}\n\n`).join(''))
}

/** Answers with a whole text answer, streamed. */
export function textAnswer(res: ServerResponse, text: string): void {
  streamOf(res, chunk({ role: 'assistant', content: text }), chunk({}, 'stop'), '[DONE]')
}

/** Answers with an error status and a JSON body. */
export function errorAnswer(res: ServerResponse, status: number, body: object): void {
  res.writeHead(status, { 'content-type': 'application/json' })
  res.end(JSON.stringify(body))
}
