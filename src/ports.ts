import { randomBytes } from 'node:crypto'
import type { Redis } from 'ioredis'
import type { Logger } from 'pino'
import { LocalRunCoordinator } from './agent/local-run-coordinator.ts'
import { PostgresRunCoordinator } from './agent/postgres-run-coordinator.ts'
import type { RunCoordinator } from './agent/run-coordinator.ts'
import type { ClusterChannel, RedisChannel } from './events/cluster-channel.ts'
import { LocalEventBus, type EventBus } from './events/event-bus.ts'
import { SharedEventBus } from './events/shared-event-bus.ts'
import type { PostgresStore } from './store/postgres.ts'
import type { Store } from './store/store.ts'

/** What several processes share (STYLE 13), as this process sees it. */
export interface Ports {
  bus: EventBus
  coordinator: RunCoordinator
  /** The Redis connection when AGENTD_REDIS_URL is set (shared rate limits and stream caps), and the key prefix of this deployment. */
  redis: { client: Redis; namespace: string } | null
  /**
   * Runs the recovery now and then: on PostgreSQL for runs whose owner is gone, and on either store
   * for runs of this process whose end the store failed to record (RunCoordinator.release).
   */
  startRecovery(recover: () => Promise<unknown>): void
  close(): Promise<void>
}

/**
 * On SQLite the recovery has only this process's own runs to look at (those whose end the store
 * could not record); when there are none it reads nothing.
 */
const LOCAL_RECOVERY_MS = 1000

/** Calls `recover` every `intervalMs`, never two at once; a failure is logged and the next tick tries again. */
function recoverEvery(intervalMs: number, recover: () => Promise<unknown>, log: Logger): NodeJS.Timeout {
  let running = false
  const timer = setInterval(() => {
    if (running) return
    running = true
    recover()
      .catch((err: unknown) => log.error({ err }, 'recovering runs failed; the next recovery tries again'))
      .finally(() => (running = false))
  }, intervalMs)
  timer.unref()
  return timer
}

/** The cluster channels, loaded on first use: they bring `pg` and `ioredis`, which one process on SQLite without Redis never needs. */
const channels = () => import('./events/cluster-channel.ts')

/**
 * The ports of the configured deployment: one process on SQLite gets the in-process bus and
 * coordinator; processes on PostgreSQL share the database-backed coordinator and a bus whose
 * wake-ups travel over LISTEN/NOTIFY, or Redis pub/sub when AGENTD_REDIS_URL is set.
 */
export async function openPorts(options: {
  store: Store; readStore: Store; redisUrl: string | undefined; runLeaseMs: number; log: Logger
  /** How long a signal waits for the run's owner to answer (PostgresRunCoordinator); tests shorten it. */
  signalTimeoutMs?: number
}): Promise<Ports> {
  const { store, readStore, log } = options
  if (store.kind !== 'postgres') {
    const bus = new LocalEventBus()
    const coordinator = new LocalRunCoordinator({ store: readStore, bus })
    const redis = options.redisUrl
      ? await (await channels()).RedisChannel.open(options.redisUrl, 'agentd:local', (err) => log.warn({ err }, 'Redis connection error'))
      : null
    let recovery: NodeJS.Timeout | undefined
    return {
      bus, coordinator, redis: redis ? { client: redis.client, namespace: 'agentd:local:' } : null,
      startRecovery(recover) {
        recovery = recoverEvery(LOCAL_RECOVERY_MS, recover, log)
      },
      async close() {
        clearInterval(recovery)
        await coordinator.close()
        await bus.close()
        await redis?.close()
      }
    }
  }
  const shared = store as PostgresStore
  const { FallbackChannel, PostgresChannel, RedisChannel } = await channels()
  const onChannelError = (err: unknown) => log.warn({ err }, 'cluster channel error; wake-ups resume after it reconnects')
  const postgres = await PostgresChannel.open(shared.pool, () => shared.newClient(), onChannelError)
  let redis: RedisChannel | null = null
  try {
    if (options.redisUrl) redis = await RedisChannel.open(options.redisUrl, postgres.name, onChannelError)
  } catch (err) {
    await postgres.close()
    throw err
  }
  const channel: ClusterChannel = redis ? new FallbackChannel(redis, postgres) : postgres
  const ownerId = `own_${randomBytes(9).toString('base64url')}`
  const bus = new SharedEventBus({
    store: readStore, channel, processId: ownerId, onError: (err) => log.warn({ err }, 'event fan-out between processes failed')
  })
  const coordinator = new PostgresRunCoordinator({
    ownerId, store: shared, bus, channel, leaseMs: options.runLeaseMs, logger: log, signalTimeoutMs: options.signalTimeoutMs
  })
  let recovery: NodeJS.Timeout | undefined
  return {
    bus, coordinator, redis: redis ? { client: redis.client, namespace: `${postgres.name}:` } : null,
    startRecovery(recover) {
      // A dead owner's runs are taken over within its lease plus this interval.
      recovery = recoverEvery(Math.min(5000, Math.max(100, Math.floor(options.runLeaseMs / 3))), recover, log)
    },
    async close() {
      clearInterval(recovery)
      await coordinator.close()
      await bus.close()
      await channel.close()
    }
  }
}
