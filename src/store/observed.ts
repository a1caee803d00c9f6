import type { Store, StoreWrite } from './store.ts'

export interface StoreHealth {
  /** The last failed store call, until a later call succeeds; /readyz reports it. */
  storeFailure: string | null
}

/**
 * Wraps a store so that every failing call is recorded in `health` (and logged by `onFailure`)
 * before the error goes on to the caller; a later success of the same operation clears it
 * (other operations succeeding says nothing about the one that failed). The callers decide
 * what a failure means for them (a run ends as failed, a request gets 5xx); this only makes
 * the failure visible.
 */
export function observeStore(store: Store, health: StoreHealth, onFailure: (operation: string, err: unknown) => void): Store {
  const failures = new Map<string, string>()
  const report = () => {
    health.storeFailure = failures.values().next().value ?? null
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
        if (failures.size > 0 && failures.delete(operationName(property, args))) report()
        return settled
      },
      (err: unknown) => {
        const code = (err as { code?: string } | null)?.code
        // A closed store (shutdown) or a deleted session is not the store failing.
        if (code !== 'STORE_CLOSED' && code !== 'SESSION_GONE') {
          const operation = operationName(property, args)
          failures.set(operation, `${operation}: ${err instanceof Error ? err.message : String(err)}`)
          report()
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
