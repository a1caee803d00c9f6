import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { request } from 'undici'
import { encodeEvent } from '../src/events/sse.ts'
import type { EventRecord } from '../src/store/store.ts'
import { fmt, printTable } from './report.ts'

const FRAMES = 20_000

/**
 * frames: what a `text_chunk` frame's size costs, to decide what a frame must carry. Two costs:
 * encoding the event (the full envelope of SPEC 4 against a frame with only seq, type and data),
 * and sending the frame over a loopback socket (writer and reader both in this process, so both
 * ends are counted), one write per frame as a stream gets them when the model's chunks come one per tick — at 60, 291 (today's text_chunk) and 1 000 bytes. The
 * floor is the smallest frame, measured in the same run.
 */
export async function run(): Promise<void> {
  const event: EventRecord = {
    sessionId: 'ses_01KAQ7Z3M2V8Y6TQ0B8C9D4E5F', runId: 'run_01KAQ7Z3M2WXYZ0123456789AB', channel: 'progress', type: 'text_chunk',
    at: '2026-11-23T16:00:00.000Z', requestId: 'req_01KAQ7Z3M2WXYZ0123456789AB', data: { step: 2, delta: 'Hello' }, seq: 25
  }
  const encodeUs = (encode: () => string) => {
    for (let i = 0; i < 1000; i++) encode()
    const started = process.cpuUsage()
    for (let i = 0; i < FRAMES * 5; i++) encode()
    const used = process.cpuUsage(started)
    return (used.user + used.system) / (FRAMES * 5)
  }
  const full = encodeEvent(event)
  const minimal = () => `id: ${event.seq}\nevent: ${event.type}\ndata: ${JSON.stringify({ seq: event.seq, type: event.type, data: event.data })}\n\n`
  const encodeFull = encodeUs(() => encodeEvent(event))
  const encodeMinimal = encodeUs(() => minimal())

  const writes: Array<[number, number]> = []
  for (const size of [60, Buffer.byteLength(full), 1000]) writes.push([size, await writeCostUs(size)])

  console.log(`\nframes: what a text_chunk frame's bytes cost (${FRAMES} frames each)`)
  printTable([
    ['cost', 'bytes', 'µs CPU per frame'],
    ['encode the full envelope (today)', String(Buffer.byteLength(full)), fmt(encodeFull, 2)],
    ['encode seq, type and data only', String(Buffer.byteLength(minimal())), fmt(encodeMinimal, 2)],
    ...writes.map(([size, us]) => ['write and read one frame over loopback (both ends in this process)', String(size), fmt(us, 1)])
  ])
  console.log('a frame costs its socket write, whatever its size; the envelope adds under a microsecond of encoding')
}

/** CPU (user + system) the server side spends per frame written, one write per event-loop turn. */
async function writeCostUs(size: number): Promise<number> {
  const frame = Buffer.from(`data: ${'x'.repeat(size - 8)}\n\n`)
  let costUs = 0
  const server = createServer((_req, res: ServerResponse) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    let sent = 0
    const started = process.cpuUsage()
    const next = () => {
      if (sent++ === FRAMES) {
        const used = process.cpuUsage(started)
        costUs = (used.user + used.system) / FRAMES
        res.end()
        return
      }
      res.write(frame)
      setImmediate(next)
    }
    next()
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  try {
    const { body } = await request(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`)
    for await (const _ of body) { /* read to the end */ }
  } finally {
    server.close()
  }
  return costUs
}
