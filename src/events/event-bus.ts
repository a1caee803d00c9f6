import type { EventRecord } from '../store/store.ts'

export type EventListener = (event: EventRecord) => void

/**
 * Live fan-out of committed events (STYLE 13). Publishers hand over events only after they are
 * committed, in seq order per session; subscribers get each event at most once, in seq order.
 * Replay and resume read the store, never the bus, so a subscriber that joins late loses nothing
 * (SSE subscribes first, then replays, then drops what it has seen).
 *
 * `LocalEventBus` is the in-process implementation: only this process's subscribers hear this
 * process's events. A shared implementation (several processes on one database) carries a
 * wake-up per committed batch between processes and reads the events back from the store.
 */
export interface EventBus {
  /** Delivers committed events to the subscribers of their sessions (and to subscribeAll listeners). */
  publish(event: EventRecord): void
  /** Calls the listener with every event of the session published from now on; returns the unsubscribe. */
  subscribe(sessionId: string, listener: EventListener): () => void
  /**
   * Resolves once the session's subscription knows where it starts: a store read issued after
   * that sees every event the bus will not deliver to it. A subscriber that reads the store to
   * fill in what came before (SSE replay, a run's status) reads after this, or it may miss an
   * event committed while the subscription was being set up.
   */
  subscribed(sessionId: string): Promise<void>
  /** Calls the listener with every event this process publishes, whatever the session (metrics). */
  subscribeAll(listener: EventListener): () => void
  /** Says that a session was deleted: no event of it will follow (its streams end, on every process). */
  endSession(sessionId: string, reason: string): void
  /** Calls the listener when a session is ended (endSession); returns the unsubscribe. */
  onSessionEnded(listener: (sessionId: string, reason: string) => void): () => void
  close(): Promise<void>
}

/** The in-process EventBus: listener sets per session. */
export class LocalEventBus implements EventBus {
  readonly #listeners = new Map<string, Set<EventListener>>()
  readonly #everything = new Set<EventListener>()
  readonly #ended = new Set<(sessionId: string, reason: string) => void>()

  publish(event: EventRecord): void {
    const set = this.#listeners.get(event.sessionId)
    if (set) for (const listener of [...set]) deliver(listener, event)
    for (const listener of this.#everything) deliver(listener, event)
  }

  subscribe(sessionId: string, listener: EventListener): () => void {
    let set = this.#listeners.get(sessionId)
    if (!set) {
      set = new Set()
      this.#listeners.set(sessionId, set)
    }
    set.add(listener)
    return () => {
      set.delete(listener)
      if (set.size === 0 && this.#listeners.get(sessionId) === set) this.#listeners.delete(sessionId)
    }
  }

  /** In-process delivery starts the moment subscribe returns. */
  subscribed(): Promise<void> {
    return Promise.resolve()
  }

  subscribeAll(listener: EventListener): () => void {
    this.#everything.add(listener)
    return () => this.#everything.delete(listener)
  }

  endSession(sessionId: string, reason: string): void {
    for (const listener of [...this.#ended]) {
      try {
        listener(sessionId, reason)
      } catch {
        // A listener ends its own streams; its failure is its own business.
      }
    }
  }

  onSessionEnded(listener: (sessionId: string, reason: string) => void): () => void {
    this.#ended.add(listener)
    return () => this.#ended.delete(listener)
  }

  /** Whether any subscriber follows the session (a shared bus reads rows back only for those). */
  hasSubscribers(sessionId: string): boolean {
    return this.#listeners.has(sessionId)
  }

  async close(): Promise<void> {
    this.#listeners.clear()
    this.#everything.clear()
    this.#ended.clear()
  }
}

function deliver(listener: EventListener, event: EventRecord): void {
  try {
    listener(event)
  } catch {
    // A listener is a network writer; its failure is its own connection's business.
  }
}
