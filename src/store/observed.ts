import type { Store } from './store.ts'

export interface StoreHealth {
  /** The last failed store call, until a later call succeeds; /readyz reports it. */
  storeFailure: string | null
}

/**
 * Wraps a store so that every failing call is recorded in `health` (and logged by `onFailure`)
 * before the error goes on to the caller, and a later success clears it. The callers decide
 * what a failure means for them (a run ends as failed, a request gets 5xx); this only makes
 * the failure visible.
 */
export function observeStore(store: Store, health: StoreHealth, onFailure: (operation: string, err: unknown) => void): Store {
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
            if (health.storeFailure !== null && operation !== 'ping') health.storeFailure = null
            return settled
          },
          (err: unknown) => {
            const code = (err as { code?: string } | null)?.code
            if (code !== 'STORE_CLOSED') {
              health.storeFailure = `${operation}: ${err instanceof Error ? err.message : String(err)}`
              onFailure(operation, err)
            }
            throw err
          }
        )
      }
    }
  })
}
