/**
 * Child process entry: the floor of what an idle SSE stream costs in Node, for idle-streams.ts to
 * compare agentd with. A bare node:http server that answers GET /healthz and holds every other
 * GET open as an SSE response: the head agentd sends, the `retry: 2000` frame, then `: ping`
 * every 15 s from one timer shared by all streams. Nothing else: no framework, no store, no events.
 * `node bench/bare-sse-process.ts`
 */
import { createServer, type ServerResponse } from 'node:http'
import { serveChild } from './child.ts'

const PING_INTERVAL_MS = 15_000

const streams = new Set<ServerResponse>()
const server = createServer((req, res) => {
  if (req.url === '/healthz') {
    res.writeHead(200, { 'content-type': 'application/json; charset=utf-8' })
    res.end('{"status":"ok"}')
    return
  }
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache, no-transform',
    'x-accel-buffering': 'no',
    connection: 'keep-alive'
  })
  res.write('retry: 2000\n\n')
  streams.add(res)
  res.on('close', () => streams.delete(res))
})
const ping = setInterval(() => {
  for (const res of streams) res.write(': ping\n\n')
}, PING_INTERVAL_MS)

server.listen(0, '127.0.0.1', () => {
  const address = server.address()
  if (!address || typeof address === 'string') throw new Error('no address')
  serveChild(`http://127.0.0.1:${address.port}`, async () => {
    clearInterval(ping)
    for (const res of streams) res.destroy()
    await new Promise<void>((resolve) => server.close(() => resolve()))
  })
})
