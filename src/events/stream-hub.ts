import type { ServerResponse } from 'node:http'
import type { Store } from '../store/store.ts'
import { openEventStream, type EventFeed, type EventStreamOptions, type HeldBytes, type OpenEventStream } from './sse.ts'

/** What a caller asks of an event stream; the rest (ping, buffering, budget) is the hub's. */
export type StreamRequest = Pick<EventStreamOptions, 'sessionId' | 'after' | 'channels' | 'types' | 'runId' | 'untilDone' | 'headers'>

export interface StreamHubOptions {
  store: Store
  feed: EventFeed
  /** Open streams the whole process serves at most. */
  maxStreams: number
  /** Open streams one API key may hold at most. */
  maxStreamsPerKey: number
  /** Unsent bytes one stream may hold before it is dropped as too slow. */
  maxBufferedBytes: number
  /** Unsent bytes all streams together may hold; streams that are behind are dropped beyond it. */
  maxTotalBufferedBytes: number
  /** How often each stream gets a `: ping` comment; default 15 s (SPEC 4). */
  pingIntervalMs?: number
}

/** Why no stream may open now: this key holds its share, or the process serves all it may. */
export interface StreamRefusal {
  limit: 'streamsPerKey' | 'streams'
  open: number
  max: number
}

/** Pings go out in ticks of about this long, each tick to the streams of one slot. */
const PING_TICK_MS = 100

/** An open stream as the hub keeps it. */
interface HubEntry {
  sessionId: string
  /** The ping slot it is in. */
  slot: Set<OpenEventStream>
}

/**
 * Every open SSE stream of this process: the per-key and global caps, the bytes they hold
 * (one budget for all of them), their pings, and ending them by session (deleted) or all at
 * once (shutdown).
 *
 * Pings come from one timer for all streams, not one each. The interval is cut into slots of
 * PING_TICK_MS; a stream joins the emptiest slot when it opens, and each tick pings one slot. So
 * each stream is pinged every interval, the first time within an interval of opening, and 10 000
 * streams cost one timer and ~70 writes every 100 ms, also when they all opened at once (a
 * reconnect storm), instead of 10 000 timers that fire together when their streams opened together.
 */
export class StreamHub {
  readonly #options: StreamHubOptions
  readonly #streams = new Map<OpenEventStream, HubEntry>()
  readonly #byKey = new Map<string, number>()
  readonly #budget: HeldBytes
  readonly #pingSlots: Set<OpenEventStream>[]
  readonly #pingTickMs: number
  /** The slot the last tick pinged. */
  #pingCursor = 0
  /** Runs while any stream is open. */
  #pinger: NodeJS.Timeout | null = null

  constructor(options: StreamHubOptions) {
    this.#options = options
    this.#budget = { held: 0, peak: 0, streams: 0, max: options.maxTotalBufferedBytes }
    const pingIntervalMs = options.pingIntervalMs ?? 15_000
    const slots = Math.max(1, Math.round(pingIntervalMs / PING_TICK_MS))
    this.#pingSlots = Array.from({ length: slots }, () => new Set())
    this.#pingTickMs = pingIntervalMs / slots
  }

  /** How many streams are open now. */
  get count(): number {
    return this.#streams.size
  }

  /** Bytes written to open streams that their sockets have not taken yet. */
  get heldBytes(): number {
    return this.#budget.held
  }

  /** The most bytes open streams ever held at once. */
  get peakHeldBytes(): number {
    return this.#budget.peak
  }

  /** The reason a stream for this key may not open now, or null when it may. */
  refusal(keyId: string): StreamRefusal | null {
    if (this.#streams.size >= this.#options.maxStreams) return { limit: 'streams', open: this.#streams.size, max: this.#options.maxStreams }
    const open = this.#byKey.get(keyId) ?? 0
    if (open >= this.#options.maxStreamsPerKey) return { limit: 'streamsPerKey', open, max: this.#options.maxStreamsPerKey }
    return null
  }

  /** Streams a session's events to the response; the caller checked refusal() first. */
  open(res: ServerResponse, keyId: string, request: StreamRequest, onClose?: () => void): OpenEventStream {
    const { store, feed, maxBufferedBytes } = this.#options
    this.#byKey.set(keyId, (this.#byKey.get(keyId) ?? 0) + 1)
    const entry: HubEntry = { sessionId: request.sessionId, slot: this.#emptiestPingSlot() }
    const stream = openEventStream(res, store, feed, {
      ...request,
      maxBufferedBytes,
      budget: this.#budget,
      onClose: () => {
        this.#streams.delete(stream)
        entry.slot.delete(stream)
        if (this.#streams.size === 0) this.#stopPinging()
        const left = (this.#byKey.get(keyId) ?? 1) - 1
        if (left > 0) this.#byKey.set(keyId, left)
        else this.#byKey.delete(keyId)
        onClose?.()
      }
    })
    this.#streams.set(stream, entry)
    entry.slot.add(stream)
    this.#startPinging()
    return stream
  }

  /** Ends the open streams of a session (it was deleted: no event will follow). */
  endSession(sessionId: string, reason: string): void {
    for (const [stream, entry] of [...this.#streams]) if (entry.sessionId === sessionId) stream.end(reason)
  }

  /** Ends every open stream (shutdown); clients reconnect elsewhere with Last-Event-ID. */
  endAll(reason: string): void {
    for (const stream of [...this.#streams.keys()]) stream.end(reason)
  }

  #emptiestPingSlot(): Set<OpenEventStream> {
    let emptiest = this.#pingSlots[0] as Set<OpenEventStream>
    for (const slot of this.#pingSlots) if (slot.size < emptiest.size) emptiest = slot
    return emptiest
  }

  #startPinging(): void {
    if (this.#pinger) return
    this.#pinger = setInterval(() => {
      this.#pingCursor = (this.#pingCursor + 1) % this.#pingSlots.length
      for (const stream of this.#pingSlots[this.#pingCursor] as Set<OpenEventStream>) stream.ping()
    }, this.#pingTickMs)
    this.#pinger.unref()
  }

  #stopPinging(): void {
    if (this.#pinger) clearInterval(this.#pinger)
    this.#pinger = null
  }
}
