import { storeUnavailable, type Store, type StoreWrite } from './store.ts'

export interface StoreHealth {
  /** The last failed store call, until a later call of the same operation succeeds; /readyz reports it. */
  storeFailure: string | null
}

/**
 * How long a failure stays reported without failing again. A process that reports one leaves its
 * load balancer's rotation, and then nobody may call the operation that failed: without an end it
 * would stay out after the store had healed. Within this time a store that still fails fails again
 * (runs retry their ends, readiness probes come every few seconds), so the report stays fresh.
 */
export const STORE_FAILURE_TTL_MS = 30_000

/**
 * Wraps a store so that every failing call is recorded in `health` (and logged by `onFailure`)
 * before the error goes on to the caller; a later success of the same operation clears it
 * (other operations succeeding says nothing about the one that failed), and so does
 * `ttlMs` without a new failure. Two kinds of cause are the whole database's, not the call's
 * (storeUnavailable): one out of reach is only logged, since /readyz asks the database itself,
 * and one that cannot write (a full disk) is cleared by any unit of work committed after it.
 * The callers decide what a failure means for them (a run ends as failed, a request gets 5xx);
 * this only makes the failure visible.
 */
export function observeStore(
  store: Store, health: StoreHealth, onFailure: (operation: string, err: unknown) => void, ttlMs = STORE_FAILURE_TTL_MS
): Store {
  /** Per operation: what failed, when (newest last), and whether the cause was the whole database's (a full disk). */
  const failures = new Map<string, { text: string; at: number; storeWide: boolean }>()
  let expiry: NodeJS.Timeout | undefined
  const report = () => {
    const now = Date.now()
    for (const [operation, failure] of failures) if (now - failure.at >= ttlMs) failures.delete(operation)
    const newest = [...failures.values()].at(-1)
    health.storeFailure = newest?.text ?? null
    clearTimeout(expiry)
    const oldest = failures.values().next().value
    if (oldest) {
      expiry = setTimeout(report, oldest.at + ttlMs - now)
      expiry.unref()
    }
  }
  // One wrapper per method, made on first use (the store is called for every event); a method
  // replaced on the store gets a wrapper of its own.
  const wrappers = new WeakMap<object, unknown>()
  const wrap = (property: string, method: (...a: unknown[]) => unknown) => (...args: unknown[]) => {
    const result: unknown = method.apply(store, args)
    if (!(result instanceof Promise)) return result
    return result.then(
      (settled) => {
        // Named only while something is failing: the name of a unit of work costs a little to build.
        if (failures.size > 0) {
          let cleared = failures.delete(operationName(property, args))
          // A unit of work committed: the database writes again, whatever unit it refused for a full disk.
          if (property === 'commit') for (const [operation, failure] of failures) if (failure.storeWide) cleared = failures.delete(operation)
          if (cleared) report()
        }
        return settled
      },
      (err: unknown) => {
        const code = (err as { code?: string } | null)?.code
        // A closed store (shutdown), a deleted session or a tenant at its limit is not the store failing.
        if (code !== 'STORE_CLOSED' && code !== 'SESSION_GONE' && code !== 'TENANT_FULL') {
          const operation = operationName(property, args)
          // A database out of reach is logged, not kept: /readyz asks it itself (Store.ping), and
          // a failure kept would outlast the outage.
          const unavailable = storeUnavailable(err)
          if (unavailable !== 'unreachable') {
            failures.delete(operation)
            const text = `${operation}: ${err instanceof Error ? err.message : String(err)}`
            failures.set(operation, { text, at: Date.now(), storeWide: unavailable === 'failing' })
            report()
          }
          onFailure(operation, err)
        }
        throw err
      }
    )
  }
  return new Proxy(store, {
    get(target, property, receiver) {
      const value: unknown = Reflect.get(target, property, receiver)
      if (typeof value !== 'function') return value
      // The methods use private fields, so they must run on the target, not on the proxy.
      if (property === 'close' || property === 'migrate') return value.bind(target)
      let wrapper = wrappers.get(value)
      if (!wrapper) {
        wrapper = wrap(String(property), value as (...a: unknown[]) => unknown)
        wrappers.set(value, wrapper)
      }
      return wrapper
    }
  })
}

/**
 * The name a failure is reported and cleared under. A unit of work is named by the kinds of its
 * writes ("commit(run,usage,event,message)"), so that a different unit succeeding (the run
 * recording its own failure) does not hide the one that failed.
 */
function operationName(method: string, args: unknown[]): string {
  if (method !== 'commit' || !Array.isArray(args[0])) return method
  const kinds = [...new Set((args[0] as StoreWrite[]).map((write) => write.type))]
  return `commit(${kinds.join(',')})`
}
