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
  pingIntervalMs?: number
}

/** Why no stream may open now: this key holds its share, or the process serves all it may. */
export interface StreamRefusal {
  limit: 'streamsPerKey' | 'streams'
  open: number
  max: number
}

/**
 * Every open SSE stream of this process: the per-key and global caps, the bytes they hold
 * (one budget for all of them), and ending them by session (deleted) or all at once (shutdown).
 */
export class StreamHub {
  readonly #options: StreamHubOptions
  /** Open streams and the session each follows. */
  readonly #streams = new Map<OpenEventStream, string>()
  readonly #byKey = new Map<string, number>()
  readonly #budget: HeldBytes

  constructor(options: StreamHubOptions) {
    this.#options = options
    this.#budget = { held: 0, peak: 0, streams: 0, max: options.maxTotalBufferedBytes }
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
    const { store, feed, maxBufferedBytes, pingIntervalMs } = this.#options
    this.#byKey.set(keyId, (this.#byKey.get(keyId) ?? 0) + 1)
    const stream = openEventStream(res, store, feed, {
      ...request,
      maxBufferedBytes,
      budget: this.#budget,
      ...(pingIntervalMs ? { pingIntervalMs } : {}),
      onClose: () => {
        this.#streams.delete(stream)
        const left = (this.#byKey.get(keyId) ?? 1) - 1
        if (left > 0) this.#byKey.set(keyId, left)
        else this.#byKey.delete(keyId)
        onClose?.()
      }
    })
    this.#streams.set(stream, request.sessionId)
    return stream
  }

  /** Ends the open streams of a session (it was deleted: no event will follow). */
  endSession(sessionId: string, reason: string): void {
    for (const [stream, id] of [...this.#streams]) if (id === sessionId) stream.end(reason)
  }

  /** Ends every open stream (shutdown); clients reconnect elsewhere with Last-Event-ID. */
  endAll(reason: string): void {
    for (const stream of [...this.#streams.keys()]) stream.end(reason)
  }
}
