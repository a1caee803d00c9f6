import type { EventRecord, NewEvent, Store } from '../store/store.ts'

export type EventListener = (event: EventRecord) => void

/**
 * The event log of every session: an event is committed to the store first and published to
 * live subscribers after, in seq order. The store hands out seq in the order appends are
 * called; publication is chained per session so that subscribers see exactly that order.
 */
export class EventLog {
  readonly #store: Store
  readonly #listeners = new Map<string, Set<EventListener>>()
  readonly #everything = new Set<EventListener>()
  readonly #tails = new Map<string, Promise<unknown>>()

  constructor(store: Store) {
    this.#store = store
  }

  /**
   * Stores the event, then publishes it; resolves with its seq once it is committed. The write
   * goes to the store at once (a store may commit many in one transaction); publication waits
   * for every earlier event of the session, so subscribers see seq 1, 2, 3 … in order.
   */
  append(event: NewEvent): Promise<EventRecord> {
    const committed = this.#store.appendEvent(event)
    const previous = this.#tails.get(event.sessionId) ?? Promise.resolve()
    const published = previous.then(async () => {
      const record = await committed
      this.#publish(record)
      return record
    })
    const tail = published.catch(() => undefined)
    this.#tails.set(event.sessionId, tail)
    void tail.then(() => {
      if (this.#tails.get(event.sessionId) === tail) this.#tails.delete(event.sessionId)
    })
    return published
  }

  /** Calls the listener with every event of the session committed from now on; returns the unsubscribe. */
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

  /** Calls the listener with every committed event of every session (metrics, audit). */
  subscribeAll(listener: EventListener): () => void {
    this.#everything.add(listener)
    return () => this.#everything.delete(listener)
  }

  #publish(event: EventRecord): void {
    const set = this.#listeners.get(event.sessionId)
    for (const listener of [...(set ?? []), ...this.#everything]) {
      try {
        listener(event)
      } catch {
        // A listener is a network writer; its failure is its own connection's business.
      }
    }
  }
}
