import t from 'tap'
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js'
import { ProcessGroupStdioTransport } from '../../src/tools/mcp/stdio-transport.ts'

/** A server that writes one JSON-RPC notification of about `bytes` bytes, then waits. */
function writer(bytes: number) {
  const script = `process.stdout.write(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'x'.repeat(${bytes}) } }) + '\\n'); setInterval(() => {}, 1000)`
  return { name: 'writer', transport: 'stdio' as const, command: process.execPath, args: ['-e', script], env: {}, cwd: undefined }
}

t.test('a message near the size limit is read in linear time, not re-joined on every chunk', async (t) => {
  const transport = new ProcessGroupStdioTransport(writer(15 * 1024 * 1024), { maxMessageBytes: 16 * 1024 * 1024, killGraceMs: 500, onStderr: () => undefined })
  t.teardown(() => transport.close())
  const received = new Promise<JSONRPCMessage>((resolve) => {
    transport.onmessage = resolve
  })
  const cpu = process.cpuUsage()
  await transport.start()
  const message = await received
  const { user, system } = process.cpuUsage(cpu)
  t.match(message, { method: 'notifications/message' })
  // Re-joining 15 MiB on each 64 KiB chunk costs seconds of CPU; reading it once, a fraction of one.
  t.ok(user + system < 1_500_000, `CPU time to read it: ${Math.round((user + system) / 1000)} ms`)
})

t.test('a line over the limit stops the server and is not delivered', async (t) => {
  const transport = new ProcessGroupStdioTransport(writer(300_000), { maxMessageBytes: 100_000, killGraceMs: 500, onStderr: () => undefined })
  const closed = new Promise<void>((resolve) => {
    transport.onclose = resolve
  })
  const messages: JSONRPCMessage[] = []
  transport.onmessage = (message) => messages.push(message)
  await transport.start()
  await closed
  t.equal(transport.closeReason, 'message_too_large')
  t.same(messages, [])
})

t.test('a line that is not JSON-RPC is reported and skipped; the next one is delivered', async (t) => {
  const script = `process.stdout.write('starting up...\\r\\n{"jsonrpc": "2.0", "method": "notifications/initialized"}\\r\\n'); setInterval(() => {}, 1000)`
  const transport = new ProcessGroupStdioTransport({ name: 'chatty', transport: 'stdio', command: process.execPath, args: ['-e', script], env: {}, cwd: undefined }, { maxMessageBytes: 1000, killGraceMs: 500, onStderr: () => undefined })
  t.teardown(() => transport.close())
  const errors: Error[] = []
  transport.onerror = (err) => errors.push(err)
  const received = new Promise<JSONRPCMessage>((resolve) => {
    transport.onmessage = resolve
  })
  await transport.start()
  t.same(await received, { jsonrpc: '2.0', method: 'notifications/initialized' })
  t.equal(errors.length, 1, 'the stray line is reported')
})

t.test('a malformed answer to a request is delivered as an error answer to it, so the call ends at once', async (t) => {
  const answer = JSON.stringify({ jsonrpc: '2.0', id: 7, error: { code: 'bad', message: 42 } })
  const script = `process.stdout.write(${JSON.stringify(`${answer}\n`)}); setInterval(() => {}, 1000)`
  const transport = new ProcessGroupStdioTransport({ name: 'sloppy', transport: 'stdio', command: process.execPath, args: ['-e', script], env: {}, cwd: undefined }, { maxMessageBytes: 1000, killGraceMs: 500, onStderr: () => undefined })
  t.teardown(() => transport.close())
  transport.onerror = () => undefined
  const received = new Promise<JSONRPCMessage>((resolve) => {
    transport.onmessage = resolve
  })
  await transport.start()
  // Without it, the request would wait for its timeout: a safety net, far above the few ms it takes.
  const never = new Promise<string>((resolve) => setTimeout(() => resolve('nothing delivered'), 10_000).unref())
  t.match(await Promise.race([received, never]), { jsonrpc: '2.0', id: 7, error: { code: -32603, message: /not valid JSON-RPC/ } })
})
