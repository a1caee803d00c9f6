import type { ServerResponse } from 'node:http'
import { dataJsonOf, type EventRecord, type EventChannel, type Store } from '../store/store.ts'

/** What a stream subscribes through: the EventBus port (its subscribe, and when the subscription is set). */
export interface EventFeed {
  subscribe(sessionId: string, listener: (event: EventRecord) => void): () => void
  subscribed(sessionId: string): Promise<void>
}

/**
 * The one SSE encoder: `id`, `event`, `data` (the event as one JSON line: the SPEC 4 envelope,
 * its fields in that order), blank line. The data is the store's own JSON text when it has it.
 */
export function encodeEvent(event: EventRecord): string {
  return `id: ${event.seq}\nevent: ${event.type}\ndata: {"seq":${event.seq},"sessionId":${JSON.stringify(event.sessionId)},` +
    `"runId":${nullable(event.runId)},"channel":${JSON.stringify(event.channel)},"type":${JSON.stringify(event.type)},` +
    `"at":${JSON.stringify(event.at)},"requestId":${nullable(event.requestId)},"data":${dataJsonOf(event)}}\n\n`
}

const nullable = (value: string | null | undefined): string => (value == null ? 'null' : JSON.stringify(value))

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
  /** End after the next `done` event (of runId, when given), sent only when it passes the channel and type filters. */
  untilDone?: boolean
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
  /** Sends a `: ping` comment, unless the reader is behind (its events are keeping it alive). */
  ping(): void
  /** Ends the stream after a final comment frame (shutdown). */
  end(reason: string): void
  /** Bytes written to this stream that its socket has not taken yet. */
  readonly heldBytes: number
}

const REPLAY_PAGE = 500
/** A batch of live frames is written once it holds this much, without waiting for the rest of its publication. */
const MAX_BATCH_BYTES = 32 * 1024
/** The first frame of every event stream (SPEC 4). */
export const RETRY_FRAME = Buffer.from('retry: 2000\n\n')
/** How long a run's stream with nothing to send yet holds its head back for its first events (a run queued behind another). */
const HEAD_WAIT_MS = 20
const PING_FRAME = Buffer.from(': ping\n\n')

/** The head of every event stream (SPEC 4); a HEAD request gets it without a stream. */
export const SSE_HEADERS = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache, no-transform',
  'x-accel-buffering': 'no'
} as const

/**
 * Streams a session's events to one client: subscribe first, replay from the store, then go
 * live, dropping live events already replayed, so the seam loses, repeats and reorders nothing.
 * A reader that holds more than maxBufferedBytes (written, not yet taken by its socket), or more
 * than its share of a spent shared budget, when its next event comes is disconnected; it resumes
 * with Last-Event-ID from the last event it received. The caller sends the pings (`ping()`): one
 * timer for every stream of the process (StreamHub) instead of one each.
 */
export function openEventStream(res: ServerResponse, store: Store, feed: EventFeed, options: EventStreamOptions): OpenEventStream {
  return new EventStream(res, store, feed, options)
}

/** A hub may hold many thousands of these at once, mostly idle: state lives in fields, not in closures, and options are not kept. */
class EventStream implements OpenEventStream {
  readonly #res: ServerResponse
  readonly #store: Store
  readonly #feed: EventFeed
  readonly #sessionId: string
  readonly #channels: Set<EventChannel> | null
  readonly #types: Set<string> | null
  /** The store filters the replay by channel and type, unless that would hide the `done` that ends the stream. */
  readonly #filterInStore: boolean
  readonly #runId: string | undefined
  readonly #untilDone: boolean
  readonly #maxBuffered: number
  readonly #budget: HeldBytes
  readonly #onClose: (() => void) | undefined
  readonly #unsubscribe: () => void
  #ended = false
  #lastSeq: number
  #replaying = true
  /** Bytes the response holds (written, not yet taken by the kernel), as last counted. */
  #held = 0
  /** Live events that came during the replay, sent after it; null until the first one. */
  #pending: EventRecord[] | null = null
  /** Bytes of the live events waiting for the replay to finish; a reader that lets them pile up is too slow. */
  #pendingBytes = 0
  /**
   * Frames of live events published together (one unit of work: a model step, a burst of text),
   * written as one at the end of the publication (#writeBatch): one write to the socket instead
   * of one per event, and one chunk for the client to read.
   */
  #batch: Buffer[] | null = null
  #batchBytes = 0
  /** The batch holds this stream's last event (`done` with untilDone): the stream ends once it is written. */
  #endAfterBatch = false
  /**
   * A run's stream (untilDone) holds its head and retry frame back for its first events, to go
   * out with them in one socket write (a write costs ~20-50 µs of CPU on a loopback connection,
   * whatever its size): those of the replay, else the run's first live ones, else at this timer.
   */
  #headTimer: NodeJS.Timeout | null = null
  #headSent = false

  constructor(res: ServerResponse, store: Store, feed: EventFeed, options: EventStreamOptions) {
    this.#res = res
    this.#store = store
    this.#feed = feed
    this.#sessionId = options.sessionId
    this.#channels = options.channels?.length ? new Set(options.channels) : null
    this.#types = options.types?.length ? new Set(options.types) : null
    const doneFiltered = (this.#channels !== null && !this.#channels.has('progress')) || (this.#types !== null && !this.#types.has('done'))
    this.#filterInStore = !(options.untilDone && doneFiltered)
    this.#runId = options.runId
    this.#untilDone = options.untilDone ?? false
    this.#maxBuffered = options.maxBufferedBytes ?? 4 * 1024 * 1024
    this.#budget = options.budget ?? { held: 0, peak: 0, streams: 0, max: Number.POSITIVE_INFINITY }
    this.#onClose = options.onClose
    this.#lastSeq = options.after
    this.#budget.streams++

    res.on('drain', this.#recount)
    this.#unsubscribe = feed.subscribe(options.sessionId, this.#onLive)
    res.writeHead(200, { ...options.headers, ...SSE_HEADERS, connection: 'keep-alive' })
    res.on('close', this.#finish)
    res.on('error', this.#finish)
    if (this.#untilDone) {
      // A run's stream ends with the run: its head goes out with its first bytes (the retry
      // frame and its first events, #headTimer), one socket write instead of three. It opens
      // with the run, and so does the run's model call: the call goes out first (it is what the
      // client waits for), the stream's replay at the end of this turn. Live events that come
      // sooner wait for the replay, as they always do.
      setImmediate(() => this.#open())
    } else {
      // A stream that may stay open sends its head on its own: written as it is, V8 flattens the
      // string Node built it into piece by piece, which the response keeps for as long as it is
      // open (~1 KB less per idle stream).
      res.flushHeaders()
      this.#open()
    }
  }

  #open(): void {
    if (this.#ended) return
    if (!this.#untilDone) this.#sendHead()
    void this.#replay()
  }

  /** Writes the retry frame (and, for a run's stream, the head held back with it: #headTimer), once: first of all the stream's bytes. */
  readonly #sendHead = (): void => {
    if (this.#headSent || this.#ended) return
    this.#headSent = true
    if (this.#headTimer) clearTimeout(this.#headTimer)
    this.#headTimer = null
    this.#send(RETRY_FRAME)
  }

  get heldBytes(): number {
    return this.#held
  }

  ping(): void {
    // A reader that is behind has no use for pings piling up behind its events.
    this.#recount()
    if (!this.#ended && this.#held === 0) this.#send(PING_FRAME)
  }

  end(reason: string): void {
    if (this.#ended) return
    // Events already published go first; the batch may hold the stream's last one, which ends it.
    this.#writeBatch()
    if (this.#ended) return
    this.#send(`: ${reason}\n\n`)
    this.#finish()
  }

  readonly #finish = (): void => {
    if (this.#ended) return
    this.#ended = true
    this.#unsubscribe()
    // What the socket still holds is freed with it.
    this.#budget.held -= this.#held
    this.#budget.streams--
    this.#held = 0
    this.#pending = null
    this.#batch = null
    if (this.#headTimer) clearTimeout(this.#headTimer)
    this.#headTimer = null
    if (!this.#res.writableEnded) this.#res.end()
    this.#onClose?.()
  }

  /**
   * Counts what the response holds in memory: bytes the kernel took at once are not held, bytes
   * still queued are. Refreshed on every write, when a write is flushed and on 'drain'; between
   * two refreshes the count can only be higher than the truth, never lower.
   */
  readonly #recount = (): void => {
    if (this.#ended) return
    const now = this.#res.writableLength
    this.#budget.held += now - this.#held
    this.#held = now
    if (this.#budget.held > this.#budget.peak) this.#budget.peak = this.#budget.held
  }

  #send(bytes: Buffer | string): void {
    // A run's stream sends its head first, in the same turn: the response corks the two into one write.
    if (!this.#headSent) this.#sendHead()
    // Counted now (what the kernel did not take at once) and again once it is flushed.
    this.#res.write(bytes, this.#recount)
    this.#recount()
  }

  #wanted(event: EventRecord): boolean {
    return (!this.#channels || this.#channels.has(event.channel)) &&
      (!this.#types || this.#types.has(event.type)) &&
      (!this.#runId || event.runId === this.#runId)
  }

  /** Sends an event: at once (replay, which paces itself on the socket), or in the batch of its publication (live). */
  #write(event: EventRecord, live = false): void {
    if (this.#ended || event.seq <= this.#lastSeq) return
    this.#lastSeq = event.seq
    const last = this.#untilDone && event.type === 'done' && (!this.#runId || event.runId === this.#runId)
    if (!this.#wanted(event)) {
      // ?until=done ends at the next done also when the filters leave its frame out.
      if (last) this.end('done')
      return
    }
    const frame = eventFrame(event)
    this.#recount()
    const budget = this.#budget
    // The batch counts as held: it is written before anything that comes after it.
    const held = this.#held + this.#batchBytes
    const overBudget = budget.held + this.#batchBytes + frame.length > budget.max && held + frame.length > budget.max / budget.streams
    if (held > 0 && (held > this.#maxBuffered || overBudget)) {
      // Too slow: drop the connection instead of buffering without bound. When the streams
      // together would hold more than the budget, the ones that would hold more than their
      // share go first, so readers that keep up are not dropped for the slow ones; a reader
      // with nothing held always takes the frame.
      this.#drop()
      return
    }
    if (!live) {
      this.#send(frame)
      if (last) this.#finish()
      return
    }
    // A bus publishes a unit's events one after another in one go: the batch is written once
    // they all are, at the end of this microtask.
    if (this.#batch === null) {
      this.#batch = [frame]
      queueMicrotask(this.#writeBatch)
    } else {
      this.#batch.push(frame)
    }
    this.#batchBytes += frame.length
    if (last) this.#endAfterBatch = true
    // Large frames (a long tool result) gain nothing from waiting, and a reader is judged by what it holds.
    if (this.#batchBytes >= MAX_BATCH_BYTES) this.#writeBatch()
  }

  readonly #writeBatch = (): void => {
    const batch = this.#batch
    if (batch === null) return
    this.#batch = null
    this.#batchBytes = 0
    if (this.#ended) return
    // A single frame is written as it is: every stream of the session sends the same Buffer.
    this.#send(batch.length === 1 ? (batch[0] as Buffer) : Buffer.concat(batch))
    if (this.#endAfterBatch) this.#finish()
  }

  readonly #onLive = (event: EventRecord): void => {
    if (!this.#replaying) return this.#write(event, true)
    if (this.#ended) return
    ;(this.#pending ??= []).push(event)
    this.#pendingBytes += eventFrame(event).length
    if (this.#pendingBytes > this.#maxBuffered) this.#drop()
  }

  /** Disconnects a reader that is too slow; it resumes with Last-Event-ID. */
  #drop(): void {
    this.#res.destroy()
    this.#finish()
  }

  /** The next page of stored events this stream sends. */
  #page(): Promise<EventRecord[]> {
    return this.#store.listEvents(this.#sessionId, {
      after: this.#lastSeq,
      limit: REPLAY_PAGE,
      ...(this.#channels && this.#filterInStore ? { channels: [...this.#channels] } : {}),
      ...(this.#types && this.#filterInStore ? { types: [...this.#types] } : {})
    })
  }

  async #replay(): Promise<void> {
    const res = this.#res
    try {
      // The replay reads what the live feed will not bring: only once the feed knows where it starts.
      await this.#feed.subscribed(this.#sessionId)
      // A session deleted after its route found it, and before this stream was registered, ended
      // no stream (EventBus.endSession), so this one would wait for good: once registered, it looks
      // the session up (a deletion after that ends it). Only when nothing is left to replay: a
      // deletion removes the events before the session, and a run's own stream always has some.
      const first = await this.#page()
      if (first.length === 0 && !(await this.#store.hasSession(this.#sessionId))) return this.end('session deleted')
      for (let page = first; ; page = await this.#page()) {
        // Replay is read at the reader's pace: it waits for the socket to drain instead of
        // dropping a reader that reconnects with a large backlog (a dropped reader would come
        // back for the same events, and never get past them).
        for (const event of page) {
          if (res.writableNeedDrain) await drained(res)
          if (this.#ended) break
          this.#write(event)
        }
        if (this.#ended || page.length < REPLAY_PAGE) break
      }
      // Filtered replay may stop below the session's newest seq; the pending live events fill in.
      this.#replaying = false
      const pending = this.#pending
      this.#pending = null
      if (pending) for (const event of pending) this.#write(event, true)
      // Nothing to send yet (the run's first unit is still being committed, or it waits behind another run).
      if (!this.#headSent && !this.#ended) this.#headTimer = setTimeout(this.#sendHead, HEAD_WAIT_MS)
    } catch {
      this.#finish()
    }
  }
}

/** Resolves when the response has flushed what it holds, or has closed. */
function drained(res: ServerResponse): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      res.off('drain', done)
      res.off('close', done)
      resolve()
    }
    res.on('drain', done)
    res.on('close', done)
  })
}
