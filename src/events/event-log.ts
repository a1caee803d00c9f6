import type { EventRecord, NewEvent, Store, StoreWrite } from '../store/store.ts'
import type { EventBus } from './event-bus.ts'

const nothing = (): undefined => undefined

/**
 * Where the service's writes go: each unit of work is committed to the store, and the events it
 * stored are published on the bus after, in seq order. Units of work are handed to the store at
 * once (a store may commit many in one transaction); publication waits for every earlier unit
 * of the same session, so subscribers see seq 1, 2, 3 … in order.
 */
export class EventLog {
  readonly #store: Store
  readonly #bus: EventBus
  readonly #tails = new Map<string, Promise<unknown>>()

  constructor(store: Store, bus: EventBus) {
    this.#store = store
    this.#bus = bus
  }

  /**
   * Commits the writes as one unit of work (all or none), then publishes its events. Resolves
   * with the stored events once committed; `sessionId` orders publication (every write of a
   * unit belongs to one session).
   */
  commit(sessionId: string, writes: readonly StoreWrite[]): Promise<EventRecord[]> {
    const committed = this.#store.commit(writes)
    const previous = this.#tails.get(sessionId)
    let published: Promise<EventRecord[]>
    if (previous === undefined) {
      // Every earlier unit of the session is published: this one is, once committed. (A text
      // chunk is a unit of its own: this path is kept to the fewest promises and closures.)
      published = committed.then(this.#publish)
    } else {
      // Its failure reaches the caller through `published`, which may only look once the earlier
      // unit is published: meanwhile it is not an unhandled rejection.
      committed.catch(nothing)
      published = previous.then(() => committed).then(this.#publish)
    }
    const tail = published.then(nothing, nothing)
    this.#tails.set(sessionId, tail)
    void tail.then(() => {
      if (this.#tails.get(sessionId) === tail) this.#tails.delete(sessionId)
    })
    return published
  }

  readonly #publish = (events: EventRecord[]): EventRecord[] => {
    for (const event of events) this.#bus.publish(event)
    return events
  }

  /** Stores one event, then publishes it; resolves with it (and its seq) once committed. */
  async append(event: NewEvent): Promise<EventRecord> {
    const [record] = await this.commit(event.sessionId, [{ type: 'event', event }])
    return record as EventRecord
  }
}
