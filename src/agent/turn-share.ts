import { performance } from 'node:perf_hooks'

/**
 * How long runs may spend starting in one turn of the event loop before the rest wait for a later
 * turn. A group commit settles many runs' admissions at once (a hundred messages posted
 * together), and each of those runs then builds and sends its first model call, ~0.5-1 ms of CPU
 * apiece: in one turn, 50-100 ms during which no chunk of the runs already streaming is read,
 * stored or sent. Past the budget, a run waits for a later turn, which comes after the poll
 * phase has read what arrived meanwhile and relayed it.
 *
 * The price is batching: shorter turns mean smaller group commits and more socket writes and
 * reads per run. Measured on the bench machine (README, Benchmarks): with 100 streams, the chunk
 * → frame p99 fell from 60-78 ms to 22-34 ms; with 50 clients starting runs back to back, agentd
 * spent 1-8 % more CPU per run. Taking turns before every step's model call, not only the first,
 * cost 13-21 % for no more of the tail; a 5 ms budget cost as much as 2 ms.
 */
const TURN_BUDGET_MS = 2

/** At most this many waiting runs are tried per turn (each try is an immediate), however many wait. */
const TRIES_PER_TURN = 8

/** The runs waiting for their turn, first come first served. */
const waiting: Array<() => void> = []
/** Tries queued (immediates not yet run); while runs wait, at least one is. */
let tries = 0
/** When the current accounting window opened (null: none is open); it closes at the next check phase. */
let windowStart: number | null = null

const closeWindow = (): void => {
  windowStart = null
}

function budgetLeft(): boolean {
  const now = performance.now()
  if (windowStart === null) {
    windowStart = now
    // An immediate queued now runs at the next check phase (or the one after, when queued
    // during one), after the tries queued before it: the window lasts about one turn.
    setImmediate(closeWindow)
    return true
  }
  return now - windowStart < TURN_BUDGET_MS
}

/** Queues tries for the runs waiting, a few per turn rather than one per run per turn. */
function queueTries(): void {
  for (let n = Math.min(waiting.length, TRIES_PER_TURN) - tries; n > 0; n--) {
    tries++
    setImmediate(tryNext)
  }
}

/** The first waiting run goes when the turn has budget left; its run continues right after this immediate. */
function tryNext(): void {
  tries--
  if (waiting.length > 0 && budgetLeft()) (waiting.shift() as () => void)()
  // The turn's last try queues the next turn's (an immediate queued during a check phase runs on the next).
  if (tries === 0) queueTries()
}

/**
 * Called by a run before its first model call: undefined (go on) while this turn has budget left
 * and nobody is waiting, else a promise that resolves on the run's turn, in the order the runs
 * came. One run at a time never waits.
 */
export function takeTurn(): Promise<void> | undefined {
  if (waiting.length === 0 && budgetLeft()) return undefined
  return new Promise<void>((resolve) => {
    waiting.push(resolve)
    queueTries()
  })
}
