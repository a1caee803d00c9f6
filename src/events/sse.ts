import type { ServerResponse } from 'node:http'
import type { EventRecord, EventChannel, Store } from '../store/store.ts'
import type { EventBus } from './event-bus.ts'

/** The one SSE encoder: `id`, `event`, `data` (the event as one JSON line), blank line. */
export function encodeEvent(event: EventRecord): string {
  return `id: ${event.seq}\nevent: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`
}

export interface EventStreamOptions {
  sessionId: string
  /** Replay events with seq > after first. */
  after: number
  channels?: EventChannel[] | undefined
  types?: string[] | undefined
  /** Only this run's events (the POST messages stream). */
  runId?: string | undefined
  /** End after the next `done` event that passes the filters. */
  untilDone?: boolean
  pingIntervalMs?: number
  /** Unsent bytes a reader may fall behind by (besides the kernel's buffers) before it is dropped as too slow. */
  maxBufferedBytes?: number
  /** Headers the reply already carries (request ID, CORS, security); the SSE ones take precedence. */
  headers?: Record<string, string | number | string[] | undefined>
  /** Called once when the stream has ended, for whatever reason. */
  onClose?: () => void
}

export interface OpenEventStream {
  /** Ends the stream after a final comment frame (shutdown). */
  end(reason: string): void
  readonly closed: Promise<void>
}

const REPLAY_PAGE = 500

/**
 * Streams a session's events to one client: subscribe first, replay from the store, then go
 * live, dropping live events already replayed, so the seam loses, repeats and reorders nothing.
 * A reader that falls more than maxBufferedBytes behind is disconnected; it resumes with
 * Last-Event-ID from the last event it received.
 */
export function openEventStream(res: ServerResponse, store: Store, bus: Pick<EventBus, 'subscribe'>, options: EventStreamOptions): OpenEventStream {
  const pingIntervalMs = options.pingIntervalMs ?? 15_000
  const maxBuffered = options.maxBufferedBytes ?? 4 * 1024 * 1024
  const channels = options.channels?.length ? new Set(options.channels) : null
  const types = options.types?.length ? new Set(options.types) : null
  const wanted = (event: EventRecord) =>
    (!channels || channels.has(event.channel)) &&
    (!types || types.has(event.type)) &&
    (!options.runId || event.runId === options.runId)

  let resolveClosed: () => void = () => {}
  const closed = new Promise<void>((resolve) => (resolveClosed = resolve))
  let ended = false
  let lastSeq = options.after
  let replaying = true
  const pending: EventRecord[] = []

  const finish = () => {
    if (ended) return
    ended = true
    clearInterval(ping)
    unsubscribe()
    if (!res.writableEnded) res.end()
    options.onClose?.()
    resolveClosed()
  }

  const write = (event: EventRecord) => {
    if (ended || event.seq <= lastSeq) return
    lastSeq = event.seq
    if (!wanted(event)) return
    if (res.writableLength > maxBuffered) {
      // Too slow: the backlog is already over the limit. Drop the connection instead of
      // buffering without bound; the client resumes from the last id it received.
      res.destroy()
      finish()
      return
    }
    res.write(encodeEvent(event))
    if (options.untilDone && event.type === 'done') finish()
  }

  const unsubscribe = bus.subscribe(options.sessionId, (event) => {
    if (replaying) pending.push(event)
    else write(event)
  })

  res.writeHead(200, {
    ...options.headers,
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache, no-transform',
    'x-accel-buffering': 'no',
    connection: 'keep-alive'
  })
  res.write('retry: 2000\n\n')
  const ping = setInterval(() => {
    if (!ended) res.write(': ping\n\n')
  }, pingIntervalMs)
  ping.unref()
  res.on('close', finish)
  res.on('error', finish)

  void (async () => {
    try {
      for (;;) {
        const page = await store.listEvents(options.sessionId, {
          after: lastSeq,
          limit: REPLAY_PAGE,
          ...(channels ? { channels: [...channels] } : {}),
          ...(types ? { types: [...types] } : {})
        })
        for (const event of page) write(event)
        if (ended || page.length < REPLAY_PAGE) break
      }
      // Filtered replay may stop below the session's newest seq; the pending live events fill in.
      replaying = false
      for (const event of pending.splice(0)) write(event)
    } catch {
      finish()
    }
  })()

  return {
    end(reason: string) {
      if (ended) return
      res.write(`: ${reason}\n\n`)
      finish()
    },
    closed
  }
}
