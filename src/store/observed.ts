import type { Store } from './store.ts'

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
  return new Proxy(store, {
    get(target, property, receiver) {
      const value: unknown = Reflect.get(target, property, receiver)
      if (typeof value !== 'function') return value
      // The methods use private fields, so they must run on the target, not on the proxy.
      if (property === 'close' || property === 'migrate') return value.bind(target)
      const operation = String(property)
      return (...args: unknown[]) => {
        const result: unknown = (value as (...a: unknown[]) => unknown).apply(target, args)
        if (!(result instanceof Promise)) return result
        return result.then(
          (settled) => {
            if (failures.delete(operation)) report()
            return settled
          },
          (err: unknown) => {
            const code = (err as { code?: string } | null)?.code
            if (code !== 'STORE_CLOSED') {
              failures.set(operation, `${operation}: ${err instanceof Error ? err.message : String(err)}`)
              report()
              onFailure(operation, err)
            }
            throw err
          }
        )
      }
    }
  })
}
