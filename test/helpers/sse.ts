import { request as httpRequest, type IncomingMessage } from 'node:http'

/** One parsed SSE frame. */
export interface SseFrame {
  id?: string
  event?: string
  data?: string
  retry?: number
  comment?: string
}

/** An event frame's data, parsed (the agentd Event). */
export interface StreamedEvent {
  seq: number
  sessionId: string
  runId: string | null
  channel: string
  type: string
  requestId: string | null
  data: Record<string, any>
}

/** Splits an SSE byte stream into frames, per the WHATWG parsing rules agentd's frames use. */
export function parseFrames(text: string): { frames: SseFrame[]; rest: string } {
  const frames: SseFrame[] = []
  const blocks = text.split('\n\n')
  const rest = blocks.pop() ?? ''
  for (const block of blocks) {
    const frame: SseFrame = {}
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) frame.comment = line.slice(1).trim()
      else {
        const colon = line.indexOf(':')
        const field = line.slice(0, colon)
        const value = line.slice(colon + 1).replace(/^ /, '')
        if (field === 'id') frame.id = value
        else if (field === 'event') frame.event = value
        else if (field === 'data') frame.data = frame.data === undefined ? value : `${frame.data}\n${value}`
        else if (field === 'retry') frame.retry = Number(value)
      }
    }
    frames.push(frame)
  }
  return { frames, rest }
}

export interface SseResult {
  status: number
  headers: IncomingMessage['headers']
  frames: SseFrame[]
  events: StreamedEvent[]
  /** True when the server ended the stream; false when we stopped reading. */
  endedByServer: boolean
}

/**
 * Opens a real SSE request and reads it until the server ends it, `stopAfter` events arrived,
 * or `timeoutMs` passed. Non-SSE answers resolve with their status and no frames.
 */
export function readSse(
  url: string,
  options: { method?: string; headers?: Record<string, string>; body?: unknown; stopAfter?: number; timeoutMs?: number; stopWhen?: (e: StreamedEvent) => boolean } = {}
): Promise<SseResult & { body: string }> {
  return new Promise((resolve, reject) => {
    const payload = options.body === undefined ? undefined : JSON.stringify(options.body)
    const req = httpRequest(url, {
      method: options.method ?? 'GET',
      headers: {
        accept: 'text/event-stream',
        ...(payload ? { 'content-type': 'application/json' } : {}),
        ...options.headers
      }
    })
    const frames: SseFrame[] = []
    const events: StreamedEvent[] = []
    let buffer = ''
    let body = ''
    let settled = false
    const timer = setTimeout(() => finish(false), options.timeoutMs ?? 10_000)
    let res: IncomingMessage | undefined
    const finish = (endedByServer: boolean) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      req.destroy()
      resolve({ status: res?.statusCode ?? 0, headers: res?.headers ?? {}, frames, events, endedByServer, body })
    }
    req.on('response', (response) => {
      res = response
      response.setEncoding('utf8')
      response.on('data', (chunk: string) => {
        body += chunk
        buffer += chunk
        const parsed = parseFrames(buffer)
        buffer = parsed.rest
        for (const frame of parsed.frames) {
          frames.push(frame)
          if (frame.data !== undefined && frame.event) {
            const event = JSON.parse(frame.data) as StreamedEvent
            events.push(event)
            if ((options.stopAfter !== undefined && events.length >= options.stopAfter) || options.stopWhen?.(event)) return finish(false)
          }
        }
      })
      response.on('end', () => finish(true))
      response.on('error', () => finish(true))
    })
    req.on('error', (err) => (settled ? undefined : reject(err)))
    if (payload) req.write(payload)
    req.end()
  })
}
