import type { ServerResponse } from 'node:http'
import type { EventRecord, EventChannel, Store } from '../store/store.ts'

/** What a stream subscribes through: the EventBus port (only its subscribe). */
export interface EventFeed {
  subscribe(sessionId: string, listener: (event: EventRecord) => void): () => void
}

/** The one SSE encoder: `id`, `event`, `data` (the event as one JSON line), blank line. */
export function encodeEvent(event: EventRecord): string {
  return `id: ${event.seq}\nevent: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`
}

/**
 * The frame of an event as bytes, encoded once however many streams send it: the event log
 * hands every subscriber the same record, and every socket then holds the same Buffer rather
 * than a string of its own.
 */
const frames = new WeakMap<EventRecord, Buffer>()
export function eventFrame(event: EventRecord): Buffer {
  let frame = frames.get(event)
  if (!frame) {
    frame = Buffer.from(encodeEvent(event))
    frames.set(event, frame)
  }
  return frame
}

/** Bytes written to streams that their sockets have not taken yet, summed over every stream sharing it. */
export interface HeldBytes {
  held: number
  /** The most that was ever held at once (sizing AGENTD_MAX_STREAM_BYTES). */
  peak: number
  /** Streams sharing the budget; each may hold its share of max even when the budget is spent. */
  streams: number
  /** Above this, a stream that is behind is dropped instead of buffering more. */
  readonly max: number
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
  /** The budget of unsent bytes shared with other streams; a stream that is behind when it is spent is dropped. */
  budget?: HeldBytes
  /** Headers the reply already carries (request ID, CORS, security); the SSE ones take precedence. */
  headers?: Record<string, string | number | string[] | undefined>
  /** Called once when the stream has ended, for whatever reason. */
  onClose?: () => void
}

export interface OpenEventStream {
  /** Ends the stream after a final comment frame (shutdown). */
  end(reason: string): void
  /** Bytes written to this stream that its socket has not taken yet. */
  readonly heldBytes: number
  readonly closed: Promise<void>
}

const REPLAY_PAGE = 500

/**
 * Streams a session's events to one client: subscribe first, replay from the store, then go
 * live, dropping live events already replayed, so the seam loses, repeats and reorders nothing.
 * A reader that holds more than maxBufferedBytes (written, not yet taken by its socket), or more
 * than its share of a spent shared budget, when its next event comes is disconnected; it resumes
 * with Last-Event-ID from the last event it received.
 */
export function openEventStream(res: ServerResponse, store: Store, feed: EventFeed, options: EventStreamOptions): OpenEventStream {
  const pingIntervalMs = options.pingIntervalMs ?? 15_000
  const maxBuffered = options.maxBufferedBytes ?? 4 * 1024 * 1024
  const budget = options.budget ?? { held: 0, peak: 0, streams: 0, max: Number.POSITIVE_INFINITY }
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
  let held = 0
  budget.streams++
  const pending: EventRecord[] = []
  /** Bytes of the live events waiting for the replay to finish; a reader that lets them pile up is too slow. */
  let pendingBytes = 0

  const finish = () => {
    if (ended) return
    ended = true
    clearInterval(ping)
    unsubscribe()
    // What the socket still holds is freed with it.
    budget.held -= held
    budget.streams--
    held = 0
    if (!res.writableEnded) res.end()
    options.onClose?.()
    resolveClosed()
  }

  /**
   * Counts what the response holds in memory: bytes the kernel took at once are not held, bytes
   * still queued are. Refreshed on every write, when a write is flushed and on 'drain'; between
   * two refreshes the count can only be higher than the truth, never lower.
   */
  const recount = () => {
    if (ended) return
    const now = res.writableLength
    budget.held += now - held
    held = now
    if (budget.held > budget.peak) budget.peak = budget.held
  }
  const send = (bytes: Buffer | string) => {
    // Counted now (what the kernel did not take at once) and again once it is flushed.
    res.write(bytes, recount)
    recount()
  }
  res.on('drain', recount)

  const write = (event: EventRecord) => {
    if (ended || event.seq <= lastSeq) return
    lastSeq = event.seq
    if (!wanted(event)) return
    const frame = eventFrame(event)
    recount()
    const overBudget = budget.held + frame.length > budget.max && held + frame.length > budget.max / budget.streams
    if (held > 0 && (held > maxBuffered || overBudget)) {
      // Too slow: drop the connection instead of buffering without bound. When the streams
      // together would hold more than the budget, the ones that would hold more than their
      // share go first, so readers that keep up are not dropped for the slow ones; a reader
      // with nothing held always takes the frame.
      res.destroy()
      finish()
      return
    }
    send(frame)
    if (options.untilDone && event.type === 'done') finish()
  }

  const unsubscribe = feed.subscribe(options.sessionId, (event) => {
    if (!replaying) return write(event)
    pending.push(event)
    pendingBytes += eventFrame(event).length
    if (pendingBytes > maxBuffered) {
      res.destroy()
      finish()
    }
  })

  /** Resolves when the response has flushed what it holds, or has closed. */
  const drained = () => new Promise<void>((resolve) => {
    const done = () => {
      res.off('drain', done)
      res.off('close', done)
      resolve()
    }
    res.on('drain', done)
    res.on('close', done)
  })

  res.writeHead(200, {
    ...options.headers,
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache, no-transform',
    'x-accel-buffering': 'no',
    connection: 'keep-alive'
  })
  send('retry: 2000\n\n')
  // A reader that is behind has no use for pings piling up behind its events.
  const ping = setInterval(() => {
    recount()
    if (!ended && held === 0) send(': ping\n\n')
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
        // Replay is read at the reader's pace: it waits for the socket to drain instead of
        // dropping a reader that reconnects with a large backlog (a dropped reader would come
        // back for the same events, and never get past them).
        for (const event of page) {
          if (res.writableNeedDrain) await drained()
          if (ended) break
          write(event)
        }
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
    get heldBytes() {
      return held
    },
    closed
  }
}
