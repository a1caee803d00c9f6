import type { EventRecord, Store } from '../store/store.ts'
import type { ClusterChannel, ClusterMessage } from './cluster-channel.ts'
import type { EventBus, EventListener } from './event-bus.ts'

/** Sessions named in one wake-up message, so that it stays small. */
const SESSIONS_PER_MESSAGE = 100
/** The `wanted` of a catch-up that reads until nothing newer is stored (after a reconnect). */
const EVERYTHING = Number.MAX_SAFE_INTEGER
/**
 * Events a catch-up reads at a time: a bus that starts from 0 (its starting point could not be
 * read) on a session of 250 000 events would otherwise hold them all in memory at once.
 */
const CATCH_UP_PAGE = 1000
/**
 * A catch-up read that failed is tried again after this, doubling up to RETRY_MAX_MS: the wake-up
 * that asked for it may be the session's last (a run's `done`), and nothing else would read it.
 */
const RETRY_FIRST_MS = 250
const RETRY_MAX_MS = 10_000

/** What this process has delivered of a session its subscribers follow. */
interface Followed {
  listeners: Set<EventListener>
  /** The newest seq delivered to them (at first, the session's newest seq when it was subscribed to). */
  delivered: number | undefined
  /** Resolves once `delivered` has its starting value. */
  ready: Promise<void>
  /** The newest seq known to be committed (from wake-ups), which a read must reach. */
  wanted: number
  reading: boolean
  /**
   * Counts the reconnects that asked for everything. A read in flight when one comes was taken
   * before it and may have missed what was written while the channel was down: the loop reads
   * once more.
   */
  rescans: number
  /** How long to wait before reading again after a failed read; RETRY_FIRST_MS after a good one. */
  retryMs: number
}

/**
 * The EventBus for several processes on one database. This process's events reach its own
 * subscribers at once; after each flush (one turn of the event loop) it sends one wake-up
 * naming every session it wrote to with its newest seq, never the events. A process with
 * subscribers of such a session reads the rows back from the store, from the last seq it
 * delivered (at first, the session's newest seq when it was subscribed to), so each subscriber
 * gets every event once, in seq order, whichever process wrote it. Deleting a session ends its
 * streams on every process.
 */
export class SharedEventBus implements EventBus {
  readonly #store: Store
  readonly #channel: ClusterChannel
  readonly #processId: string
  readonly #onError: (err: unknown) => void
  readonly #followed = new Map<string, Followed>()
  readonly #everything = new Set<EventListener>()
  readonly #ended = new Set<(sessionId: string, reason: string) => void>()
  /** The newest seq written since the last wake-up, per session. */
  #written = new Map<string, number>()
  #flushScheduled = false
  readonly #unsubscribe: Array<() => void>

  constructor(options: { store: Store; channel: ClusterChannel; processId: string; onError(err: unknown): void }) {
    this.#store = options.store
    this.#channel = options.channel
    this.#processId = options.processId
    this.#onError = options.onError
    this.#unsubscribe = [
      this.#channel.onMessage((message) => this.#receive(message)),
      // Wake-ups sent while the channel was down are lost: read every followed session again.
      // So are the ends of sessions deleted meanwhile, whose streams would stay open for good.
      this.#channel.onReconnect(() => {
        for (const [sessionId, followed] of this.#followed) {
          if (followed.delivered !== undefined) this.#catchUp(sessionId, EVERYTHING)
          this.#endIfDeleted(sessionId)
        }
      })
    ]
  }

  publish(event: EventRecord): void {
    for (const listener of this.#everything) deliver(listener, event)
    this.#written.set(event.sessionId, Math.max(this.#written.get(event.sessionId) ?? 0, event.seq))
    if (!this.#flushScheduled) {
      this.#flushScheduled = true
      setImmediate(() => this.#flush())
    }
    const followed = this.#followed.get(event.sessionId)
    if (!followed) return
    if (followed.delivered !== undefined && event.seq === followed.delivered + 1 && !followed.reading) {
      this.#deliver(followed, event)
    } else if (followed.delivered === undefined || event.seq > followed.delivered) {
      // Another process wrote the seqs in between and their wake-up has not come yet, or where
      // this subscription starts is not known yet: read them all, in order, from the store.
      this.#catchUp(event.sessionId, event.seq)
    }
  }

  subscribe(sessionId: string, listener: EventListener): () => void {
    let followed = this.#followed.get(sessionId)
    if (!followed) {
      const created: Followed = { listeners: new Set(), delivered: undefined, ready: Promise.resolve(), wanted: 0, reading: false, rescans: 0, retryMs: RETRY_FIRST_MS }
      // Where delivery starts: the session's newest seq now. Subscribers replay from the store
      // after subscribing (SSE), so anything up to here reaches them that way, and an event
      // delivered twice is dropped by them; one never delivered would be lost.
      created.ready = this.#store.getSessionById(sessionId).then((session) => {
        created.delivered ??= session?.lastSeq ?? 0
        // Deleted since its caller found it: its end may have come before this subscription, and
        // no event will follow; its streams would stay open for good.
        if (!session) this.#endDeleted(sessionId)
      }, (err: unknown) => {
        created.delivered ??= 0
        this.#onError(err)
      })
      followed = created
      this.#followed.set(sessionId, followed)
    }
    const set = followed.listeners
    set.add(listener)
    return () => {
      set.delete(listener)
      if (set.size === 0 && this.#followed.get(sessionId)?.listeners === set) this.#followed.delete(sessionId)
    }
  }

  /**
   * Where a subscription starts is the session's newest seq as read when it was made (subscribe);
   * that read runs on a pooled connection of its own, so an event committed meanwhile may be in
   * it. A subscriber's own read of the store must come after it: one issued earlier could run
   * first and see less, and the event between the two would reach it neither way.
   */
  subscribed(sessionId: string): Promise<void> {
    return this.#followed.get(sessionId)?.ready ?? Promise.resolve()
  }

  subscribeAll(listener: EventListener): () => void {
    this.#everything.add(listener)
    return () => this.#everything.delete(listener)
  }

  endSession(sessionId: string, reason: string): void {
    this.#ended.forEach((listener) => callEnded(listener, sessionId, reason))
    this.#channel.send({ type: 'ended', from: this.#processId, sessionId, reason }).catch(this.#onError)
  }

  onSessionEnded(listener: (sessionId: string, reason: string) => void): () => void {
    this.#ended.add(listener)
    return () => this.#ended.delete(listener)
  }

  async close(): Promise<void> {
    this.#flush()
    for (const unsubscribe of this.#unsubscribe) unsubscribe()
    this.#followed.clear()
    this.#everything.clear()
    this.#ended.clear()
  }

  #flush(): void {
    this.#flushScheduled = false
    if (this.#written.size === 0) return
    const sessions = [...this.#written]
    this.#written = new Map()
    for (let i = 0; i < sessions.length; i += SESSIONS_PER_MESSAGE) {
      this.#channel.send({ type: 'events', from: this.#processId, sessions: sessions.slice(i, i + SESSIONS_PER_MESSAGE) }).catch(this.#onError)
    }
  }

  #receive(message: ClusterMessage): void {
    if (message.from === this.#processId) return
    if (message.type === 'events') {
      for (const [sessionId, seq] of message.sessions) {
        const followed = this.#followed.get(sessionId)
        if (followed && seq > (followed.delivered ?? 0)) this.#catchUp(sessionId, seq)
      }
    } else if (message.type === 'ended') {
      this.#ended.forEach((listener) => callEnded(listener, message.sessionId, message.reason))
    }
  }

  /** Reads the session's events after the last one delivered until `seq` is reached; one read at a time per session. */
  #catchUp(sessionId: string, seq: number): void {
    const followed = this.#followed.get(sessionId)
    if (!followed) return
    followed.wanted = Math.max(followed.wanted, seq)
    if (seq === EVERYTHING) followed.rescans++
    if (followed.reading) return
    followed.reading = true
    const read = async () => {
      await followed.ready
      while (this.#followed.get(sessionId) === followed && (followed.delivered ?? 0) < followed.wanted) {
        const after = followed.delivered ?? 0
        const rescans = followed.rescans
        const events = await this.#store.listEvents(sessionId, { after, limit: CATCH_UP_PAGE })
        for (const event of events) if (event.seq > (followed.delivered ?? 0)) this.#deliver(followed, event)
        // Nothing newer is stored (a catch-up after a reconnect asks for everything, a page at a
        // time): done, unless a reconnect came while this read was out (it left `wanted` at EVERYTHING).
        if (followed.rescans !== rescans || events.length === CATCH_UP_PAGE) continue
        if (events.length === 0 || followed.wanted === EVERYTHING) followed.wanted = followed.delivered ?? 0
      }
    }
    read().then(() => {
      followed.reading = false
      followed.retryMs = RETRY_FIRST_MS
    }, (err: unknown) => {
      followed.reading = false
      this.#onError(err)
      const retry = setTimeout(() => this.#catchUp(sessionId, followed.wanted), followed.retryMs)
      retry.unref()
      followed.retryMs = Math.min(followed.retryMs * 2, RETRY_MAX_MS)
    })
  }

  #endIfDeleted(sessionId: string): void {
    this.#store.getSessionById(sessionId).then((session) => {
      if (!session) this.#endDeleted(sessionId)
    }, this.#onError)
  }

  /** Ends a deleted session's streams and waits on this process only (its deleter told the others). */
  #endDeleted(sessionId: string): void {
    this.#ended.forEach((listener) => callEnded(listener, sessionId, 'session deleted'))
  }

  #deliver(followed: Followed, event: EventRecord): void {
    followed.delivered = event.seq
    for (const listener of [...followed.listeners]) deliver(listener, event)
  }
}

function deliver(listener: EventListener, event: EventRecord): void {
  try {
    listener(event)
  } catch {
    // A listener is a network writer; its failure is its own connection's business.
  }
}

function callEnded(listener: (sessionId: string, reason: string) => void, sessionId: string, reason: string): void {
  try {
    listener(sessionId, reason)
  } catch {
    // A listener ends its own streams; its failure is its own business.
  }
}
