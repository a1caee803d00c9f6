import { createHash } from 'node:crypto'
import { Redis } from 'ioredis'
import pg from 'pg'
import { selectOne } from '../store/postgres.ts'

/** What agentd processes on one database tell each other. Every message names its sender. */
export type ClusterMessage =
  /** Events were committed: per session, its newest seq. Receivers read the rows they have not delivered. */
  | { type: 'events'; from: string; sessions: Array<[sessionId: string, seq: number]> }
  /** A session was deleted: its streams end everywhere. */
  | { type: 'ended'; from: string; sessionId: string; reason: string }
  /** A session has a queued run nobody may be about to claim. */
  | { type: 'queued'; from: string; sessionId: string }
  /** The owner of a run is asked to stop it. */
  | { type: 'cancel'; from: string; to: string; runId: string }
  /**
   * A decision or client result for a call of a run the receiver owns; answered with 'answer'.
   * `signal` is the coordinator's CallSignal: the channel carries it without looking inside.
   */
  | { type: 'signal'; from: string; to: string; id: string; runId: string; callId: string; signal: unknown }
  | { type: 'answer'; from: string; to: string; id: string; accepted: boolean }

/**
 * A broadcast between the processes of one deployment: every process hears every message
 * (its own included), at most once, with no order promised between senders. Nothing durable
 * travels here: messages are wake-ups and requests, the database holds the state.
 */
export interface ClusterChannel {
  readonly kind: 'postgres' | 'redis'
  send(message: ClusterMessage): Promise<void>
  /** Calls the listener with every message; returns the unsubscribe. */
  onMessage(listener: (message: ClusterMessage) => void): () => void
  /** Forgets what every process has had time to read (called now and then). */
  sweep(): Promise<void>
  /** Calls the listener after the channel reconnected (messages sent meanwhile are lost: catch up from the database). */
  onReconnect(listener: () => void): () => void
  close(): Promise<void>
}

/**
 * The LISTEN/NOTIFY channel of a deployment named `name` (`agentd:<schema>`): the name itself, or,
 * when it does not fit PostgreSQL's names (63 bytes: a schema name of 57 bytes or more), `agentd#`
 * and a hash of it. pg_notify refuses a longer name ("channel name too long") where LISTEN cuts it
 * short, so every wake-up failed and no process heard another.
 */
function notifyChannelOf(name: string): string {
  return Buffer.byteLength(name) <= 63 ? name : `agentd#${createHash('sha256').update(name).digest('hex').slice(0, 40)}`
}

/** NOTIFY payloads must stay under 8000 bytes; larger messages travel through the cluster_messages table. */
const MAX_NOTIFY_BYTES = 7000

/**
 * How often the listening connection is asked `SELECT 1`, and how long it has to answer. A
 * connection the network dropped without a word (no reset, no FIN) still looks open and hears
 * nothing: without the question, wake-ups would stop for good and streams on this process would
 * wait for events already stored. A failed answer reconnects it, and reconnecting catches up.
 */
const LISTEN_CHECK = { everyMs: 10_000, timeoutMs: 5000 }

abstract class ListenerSets {
  protected readonly messageListeners = new Set<(message: ClusterMessage) => void>()
  protected readonly reconnectListeners = new Set<() => void>()

  onMessage(listener: (message: ClusterMessage) => void): () => void {
    this.messageListeners.add(listener)
    return () => this.messageListeners.delete(listener)
  }

  onReconnect(listener: () => void): () => void {
    this.reconnectListeners.add(listener)
    return () => this.reconnectListeners.delete(listener)
  }

  protected dispatch(text: string): void {
    let message: ClusterMessage
    try {
      message = JSON.parse(text) as ClusterMessage
    } catch {
      return
    }
    for (const listener of [...this.messageListeners]) {
      try {
        listener(message)
      } catch {
        // A listener's failure is its own; the others still hear the message.
      }
    }
  }

  protected reconnected(): void {
    for (const listener of [...this.reconnectListeners]) listener()
  }
}

/**
 * The channel over PostgreSQL LISTEN/NOTIFY. Listening takes one dedicated connection; sending
 * goes through the pool as its own small statement, never inside a transaction that writes
 * events (a NOTIFY takes a lock global to the instance at commit, which would serialise every
 * event-writing commit of every process). The channel is named after the schema, so
 * deployments (or test runs) in other schemas of the same database never hear each other.
 */
export class PostgresChannel extends ListenerSets implements ClusterChannel {
  readonly kind = 'postgres' as const
  readonly #pool: pg.Pool
  readonly #connect: () => pg.Client
  readonly #name: string
  /** What it LISTENs and NOTIFYs on (notifyChannelOf). */
  readonly #channel: string
  readonly #onError: (err: Error) => void
  #listener: pg.Client | null = null
  #closed = false
  #retry: NodeJS.Timeout | undefined
  readonly #check: NodeJS.Timeout
  #checking = false

  private constructor(
    pool: pg.Pool, connect: () => pg.Client, name: string, onError: (err: Error) => void, check: typeof LISTEN_CHECK
  ) {
    super()
    this.#pool = pool
    this.#connect = connect
    this.#name = name
    this.#channel = notifyChannelOf(name)
    this.#onError = onError
    this.#check = setInterval(() => void this.#checkListener(check.timeoutMs), check.everyMs)
    this.#check.unref()
  }

  /**
   * Opens the listening connection; `connect` makes a client with the store's settings. `check`:
   * how often the listening connection is asked whether it is alive, and how long it has to answer.
   */
  static async open(
    pool: pg.Pool, connect: () => pg.Client, onError: (err: Error) => void, check: typeof LISTEN_CHECK = LISTEN_CHECK
  ): Promise<PostgresChannel> {
    const { rows } = await pool.query<{ schema: string }>('SELECT current_schema() AS schema')
    const channel = new PostgresChannel(pool, connect, `agentd:${rows[0]?.schema ?? 'public'}`, onError, check)
    try {
      await channel.#listen()
    } catch (err) {
      clearInterval(channel.#check)
      throw err
    }
    return channel
  }

  /** Asks the listening connection a question; one that does not answer in time is replaced. */
  async #checkListener(timeoutMs: number): Promise<void> {
    const client = this.#listener
    if (!client || this.#checking) return
    this.#checking = true
    try {
      await selectOne(client, timeoutMs)
    } catch (err) {
      this.#onError(new Error(`the listening connection did not answer (${(err as Error).message}); reconnecting`, { cause: err }))
      this.#reconnectSoon(client)
    } finally {
      this.#checking = false
    }
  }

  /** The channel's name; Redis uses the same one, so it too stays within one deployment. */
  get name(): string {
    return this.#name
  }

  async #listen(): Promise<void> {
    const client = this.#connect()
    client.on('notification', (note) => {
      if (note.channel === this.#channel && note.payload) void this.#receive(note.payload)
    })
    client.on('error', (err) => {
      this.#onError(err)
      this.#reconnectSoon(client)
    })
    client.on('end', () => this.#reconnectSoon(client))
    try {
      await client.connect()
      await client.query(`LISTEN ${pg.escapeIdentifier(this.#channel)}`)
    } catch (err) {
      // A LISTEN that timed out leaves its connection open: each retry would leave one more.
      await client.end().catch(() => undefined)
      throw err
    }
    if (this.#closed) {
      // Closed while this one was reconnecting: close() could not see it.
      await client.end().catch(() => undefined)
      return
    }
    this.#listener = client
  }

  #reconnectSoon(client: pg.Client): void {
    if (this.#closed || this.#listener !== client) return
    this.#listener = null
    client.end().catch(() => undefined)
    const attempt = (delayMs: number) => {
      this.#retry = setTimeout(() => {
        this.#listen().then(() => this.reconnected(), (err: Error) => {
          if (this.#closed) return
          this.#onError(err)
          attempt(Math.min(delayMs * 2, 5000))
        })
      }, delayMs)
      this.#retry.unref()
    }
    attempt(100)
  }

  async #receive(payload: string): Promise<void> {
    if (payload.startsWith('#')) {
      const { rows } = await this.#pool.query<{ payload: string }>('SELECT payload FROM cluster_messages WHERE id = $1', [payload.slice(1)])
        .catch(() => ({ rows: [] as Array<{ payload: string }> }))
      if (rows[0]) this.dispatch(rows[0].payload)
      return
    }
    this.dispatch(payload)
  }

  async send(message: ClusterMessage): Promise<void> {
    if (this.#closed) return
    let payload = JSON.stringify(message)
    if (Buffer.byteLength(payload) > MAX_NOTIFY_BYTES) {
      const { rows } = await this.#pool.query<{ id: string }>('INSERT INTO cluster_messages (payload) VALUES ($1) RETURNING id', [payload])
      payload = `#${rows[0]?.id}`
    }
    await this.#pool.query('SELECT pg_notify($1, $2)', [this.#channel, payload])
  }

  /** Forgets large messages every process has had time to read. */
  async sweep(): Promise<void> {
    await this.#pool.query(`DELETE FROM cluster_messages WHERE sent_at < now() - interval '1 minute'`)
  }

  async close(): Promise<void> {
    this.#closed = true
    clearTimeout(this.#retry)
    clearInterval(this.#check)
    const listener = this.#listener
    this.#listener = null
    await listener?.end().catch(() => undefined)
    this.messageListeners.clear()
    this.reconnectListeners.clear()
  }
}

/** How long a Redis command may take before it fails (and what used it goes on without it). */
const REDIS_COMMAND_TIMEOUT_MS = 1000

/** While Redis stays down, its error is reported once a minute, not at every reconnect attempt (ten a second). */
const REDIS_ERROR_EVERY_MS = 60_000

/** Reports the first error after a good spell, then at most one every REDIS_ERROR_EVERY_MS until `recovered`. */
function quietErrors(onError: (err: Error) => void): ((err: Error) => void) & { recovered: () => void } {
  let lastAt = Number.NEGATIVE_INFINITY
  const report = (err: Error) => {
    if (Date.now() - lastAt < REDIS_ERROR_EVERY_MS) return
    lastAt = Date.now()
    onError(err)
  }
  return Object.assign(report, { recovered: () => { lastAt = Number.NEGATIVE_INFINITY } })
}

/** The channel over Redis pub/sub (AGENTD_REDIS_URL): wake-ups cost the database nothing. */
export class RedisChannel extends ListenerSets implements ClusterChannel {
  readonly kind = 'redis' as const
  readonly #publisher: Redis
  readonly #subscriber: Redis
  readonly #name: string

  private constructor(publisher: Redis, subscriber: Redis, name: string) {
    super()
    this.#publisher = publisher
    this.#subscriber = subscriber
    this.#name = name
  }

  static async open(url: string, name: string, onError: (err: Error) => void): Promise<RedisChannel> {
    // Nothing waits for Redis: every use of it (rate limits, stream caps, wake-ups) goes on
    // without it when it fails. So a command fails at once while the connection is down (no
    // offline queue) and after REDIS_COMMAND_TIMEOUT_MS when Redis stops answering; queued, each
    // request would wait for ioredis's reconnect attempts, 7-30 s apiece once Redis was gone.
    const options = { lazyConnect: true, maxRetriesPerRequest: 2, connectTimeout: 5000, enableOfflineQueue: false, commandTimeout: REDIS_COMMAND_TIMEOUT_MS }
    const publisher = new Redis(url, options)
    const subscriber = new Redis(url, options)
    const report = quietErrors(onError)
    for (const client of [publisher, subscriber]) {
      client.on('error', report)
      client.on('ready', report.recovered)
    }
    const channel = new RedisChannel(publisher, subscriber, name)
    try {
      await Promise.all([publisher.connect(), subscriber.connect()])
      await subscriber.subscribe(name)
    } catch (err) {
      publisher.disconnect()
      subscriber.disconnect()
      throw new Error(`cannot use Redis at AGENTD_REDIS_URL: ${(err as Error).message}`, { cause: err })
    }
    // Connected already: a later 'ready' is a reconnect. ioredis subscribes again by itself; what
    // was sent meanwhile is lost.
    subscriber.on('ready', () => channel.reconnected())
    subscriber.on('message', (from, text: string) => {
      if (from === name) channel.dispatch(text)
    })
    return channel
  }

  /** The publishing connection, shared with the rate limiter and the stream counter. */
  get client(): Redis {
    return this.#publisher
  }

  async sweep(): Promise<void> {
    // Pub/sub keeps nothing.
  }

  async send(message: ClusterMessage): Promise<void> {
    await this.#publisher.publish(this.#name, JSON.stringify(message))
  }

  async close(): Promise<void> {
    this.messageListeners.clear()
    this.reconnectListeners.clear()
    await Promise.all([this.#publisher.quit().catch(() => undefined), this.#subscriber.quit().catch(() => undefined)])
  }
}

/**
 * Redis pub/sub with LISTEN/NOTIFY behind it (AGENTD_REDIS_URL on PostgreSQL): a message Redis
 * does not take goes over the database instead, and every process hears both. So while Redis is
 * down, streams still get the events other processes write, and approvals, client results and
 * interrupts still reach their run's owner; the database carries the wake-ups only then.
 */
export class FallbackChannel implements ClusterChannel {
  readonly kind = 'redis' as const
  readonly #redis: RedisChannel
  readonly #postgres: PostgresChannel

  constructor(redis: RedisChannel, postgres: PostgresChannel) {
    this.#redis = redis
    this.#postgres = postgres
  }

  async send(message: ClusterMessage): Promise<void> {
    await this.#redis.send(message).catch(() => this.#postgres.send(message))
  }

  onMessage(listener: (message: ClusterMessage) => void): () => void {
    const offRedis = this.#redis.onMessage(listener)
    const offPostgres = this.#postgres.onMessage(listener)
    return () => {
      offRedis()
      offPostgres()
    }
  }

  onReconnect(listener: () => void): () => void {
    const offRedis = this.#redis.onReconnect(listener)
    const offPostgres = this.#postgres.onReconnect(listener)
    return () => {
      offRedis()
      offPostgres()
    }
  }

  /** Large messages sent through the database are kept there for a while. */
  async sweep(): Promise<void> {
    await this.#postgres.sweep()
  }

  async close(): Promise<void> {
    await this.#postgres.close()
    await this.#redis.close()
  }
}
