import type { EventBus } from '../events/event-bus.ts'
import type { RunRecord, RunStatus, Store } from '../store/store.ts'

const FINAL: ReadonlySet<RunStatus> = new Set(['completed', 'failed', 'cancelled'])
const PAUSED: ReadonlySet<RunStatus> = new Set(['awaiting_approval', 'awaiting_tool_result'])

/** Whether the run has ended. */
export const isFinal = (status: RunStatus): boolean => FINAL.has(status)

/**
 * Resolves with the run once it has ended (or paused, with untilPause), wherever it runs: it
 * listens on the bus for the run's `done` (or a `state_changed` to a paused status) and reads
 * the run from the store, which that event's unit of work has already updated. Resolves null
 * when the run or its session is gone.
 */
export function waitForRun(bus: EventBus, store: Store, sessionId: string, runId: string, untilPause = false): Promise<RunRecord | null> {
  return new Promise((resolve, reject) => {
    let settled = false
    const settle = (run: RunRecord | null) => {
      if (settled) return
      settled = true
      unsubscribe()
      unEnded()
      resolve(run)
    }
    const check = () => {
      store.getRun(sessionId, runId).then((run) => {
        if (!run) settle(null)
        else if (FINAL.has(run.status) || (untilPause && PAUSED.has(run.status))) settle(run)
      }, (err: unknown) => {
        if (settled) return
        settled = true
        unsubscribe()
        unEnded()
        reject(err)
      })
    }
    const unsubscribe = bus.subscribe(sessionId, (event) => {
      if (event.runId !== runId) return
      if (event.type === 'done' || (untilPause && event.type === 'state_changed' && PAUSED.has(event.data.to as RunStatus))) check()
    })
    const unEnded = bus.onSessionEnded((ended) => {
      if (ended === sessionId) settle(null)
    })
    // Read once the subscription is set: a `done` committed before then is in what this reads.
    void bus.subscribed(sessionId).then(check)
  })
}
