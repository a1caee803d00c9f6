import { createHmac } from 'node:crypto'
import { writeFileSync } from 'node:fs'
import { createServer, type IncomingHttpHeaders } from 'node:http'
import { createServer as createNetServer } from 'node:net'
import { join } from 'node:path'
import { tempDir } from './app.ts'

type Tap = { teardown(fn: () => unknown): void }

/** What a test hook server answers to one delivery. */
export type HookAnswer =
  | { status?: number; json: unknown }
  | { status?: number; text: string }
  /** Never answers (until the server closes). */
  | { hang: true }

export interface HookDeliveryReceived {
  headers: IncomingHttpHeaders
  /** The body exactly as sent (what the signature covers). */
  raw: string
  body: any
}

export interface HookServer {
  url: string
  received: HookDeliveryReceived[]
}

/** A real HTTP hook receiver on loopback that answers each delivery with `answer`; closed when the test ends. */
export async function startHookServer(t: Tap, answer: (body: any, index: number) => HookAnswer | Promise<HookAnswer>): Promise<HookServer> {
  const received: HookDeliveryReceived[] = []
  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', async () => {
      const raw = Buffer.concat(chunks).toString('utf8')
      const body = JSON.parse(raw)
      received.push({ headers: req.headers, raw, body })
      const reply = await answer(body, received.length - 1)
      if ('hang' in reply) return
      const text = 'json' in reply ? JSON.stringify(reply.json) : reply.text
      res.writeHead(reply.status ?? 200, { 'content-type': 'json' in reply ? 'application/json' : 'text/plain' })
      res.end(text)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    server.closeAllConnections()
    server.close()
  })
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}/hook`, received }
}

/** A loopback URL where nothing listens (a port taken and released). */
export async function deadUrl(): Promise<string> {
  const probe = createNetServer()
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve))
  const { port } = probe.address() as { port: number }
  await new Promise<void>((resolve) => probe.close(() => resolve()))
  return `http://127.0.0.1:${port}/hook`
}

/** Writes a hooks file and returns the environment that points agentd at it. */
export function hooksEnv(t: Tap, hooks: object[]): { AGENTD_HOOKS_CONFIG: string } {
  const path = join(tempDir(t, 'agentd-hooks-'), 'hooks.json')
  writeFileSync(path, JSON.stringify({ hooks }))
  return { AGENTD_HOOKS_CONFIG: path }
}

/** What a receiver computes to check X-Agentd-Signature. */
export function expectedSignature(secret: string, raw: string): string {
  return `sha256=${createHmac('sha256', secret).update(raw).digest('hex')}`
}
