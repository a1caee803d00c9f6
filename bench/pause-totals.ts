/** How the benches' watches (service-watch.ts, heap-watch.ts) count a kind of pause: GCs, stalls, commits. */

/** Pauses at least this long are listed one by one, and counted as long. */
export const PAUSE_MS = 5

/** Count, sum and longest of a kind of pause, in ms. */
export interface PauseTotals {
  count: number
  totalMs: number
  maxMs: number
  /** How many lasted PAUSE_MS or more. */
  long: number
}

export const totals = (): PauseTotals => ({ count: 0, totalMs: 0, maxMs: 0, long: 0 })

/** Counts one pause of `ms` into `t`. */
export const add = (t: PauseTotals, ms: number): void => {
  t.count++
  t.totalMs += ms
  if (ms > t.maxMs) t.maxMs = ms
  if (ms >= PAUSE_MS) t.long++
}
