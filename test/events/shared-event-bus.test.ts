import pg from 'pg'
import t from 'tap'
import { createServer } from 'node:http'
import { PostgresChannel, type ClusterChannel, type ClusterMessage } from '../../src/events/cluster-channel.ts'
import { EventLog } from '../../src/events/event-log.ts'
import { SharedEventBus } from '../../src/events/shared-event-bus.ts'
import { openEventStream } from '../../src/events/sse.ts'
import { PostgresStore } from '../../src/store/postgres.ts'
import type { EventRecord, SessionRecord, Store } from '../../src/store/store.ts'
import type { TapTest } from '../helpers/app.ts'
import { postgresUrl, withSchema } from '../helpers/postgres.ts'
import { until } from '../helpers/server-process.ts'
import { proxyInFrontOf } from '../helpers/tcp-proxy.ts'
import { testSession } from '../store/contract.ts'

/**
 * Two "processes" in one test: each with its own store (pool), channel and bus, on one schema.
 * `bListensVia`: a URL B's listening connection takes instead (a proxy), asked every 200 ms whether it is alive.
 */
async function twoProcesses(t: TapTest, options: { bListensVia?: string } = {}) {
  const schema = await withSchema(t)
  const open = async (name: string, listenVia?: string) => {
    const store = new PostgresStore({ connectionString: postgresUrl, options: `-c search_path=${schema}` })
    await store.migrate()
    const errors: string[] = []
    const connect = listenVia
      ? () => new pg.Client({ connectionString: listenVia, options: `-c search_path=${schema}`, connectionTimeoutMillis: 1000 })
      : () => store.newClient()
    const check = listenVia ? { everyMs: 200, timeoutMs: 300 } : undefined
    const channel = await PostgresChannel.open(store.pool, connect, (err) => errors.push(err.message), check)
    const bus = new SharedEventBus({ store, channel, processId: name, onError: () => undefined })
    t.teardown(async () => {
      await bus.close()
      await channel.close()
      await store.close()
    })
    return { store, channel, bus, errors, log: new EventLog(store, bus) }
  }
  const a = await open('own_a')
  const b = await open('own_b', options.bListensVia)
  const now = new Date().toISOString()
  const session: SessionRecord = testSession('ses_bus', { createdAt: now, updatedAt: now })
  await a.store.createSession(session)
  return { a, b, schema }
}

/** A channel the test drives: it delivers what the test hands its listeners, and sends nothing. */
function drivenChannel() {
  const messages = new Set<(message: ClusterMessage) => void>()
  const reconnects = new Set<() => void>()
  const channel: ClusterChannel = {
    kind: 'postgres',
    send: async () => undefined,
    onMessage: (listener) => (messages.add(listener), () => messages.delete(listener)),
    onReconnect: (listener) => (reconnects.add(listener), () => reconnects.delete(listener)),
    sweep: async () => undefined,
    close: async () => undefined
  }
  return { channel, messages, reconnects }
}

const event = (type: string) => ({ sessionId: 'ses_bus', runId: null, channel: 'monitor' as const, type, at: new Date().toISOString(), requestId: null, data: {} })

t.test('events written by two processes reach a subscriber on either, each once, in seq order', async (t) => {
  const { a, b } = await twoProcesses(t)
  const onB: EventRecord[] = []
  const onA: EventRecord[] = []
  b.bus.subscribe('ses_bus', (e) => onB.push(e))
  a.bus.subscribe('ses_bus', (e) => onA.push(e))
  // Live delivery covers what is written once the subscriptions are set; before, a replay would.
  await Promise.all([a.bus.subscribed('ses_bus'), b.bus.subscribed('ses_bus')])
  for (let i = 0; i < 30; i++) {
    const writer = i % 3 === 0 ? b.log : a.log
    void writer.append(event(`e${i}`))
  }
  await until(async () => onB.length >= 30 && onA.length >= 30, 10_000, '30 events on both')
  await new Promise((r) => setTimeout(r, 100))
  const expected = Array.from({ length: 30 }, (_, i) => i + 1)
  t.same(onB.map((e) => e.seq), expected, 'B: every seq once, in order')
  t.same(onA.map((e) => e.seq), expected, 'A: every seq once, in order')
})

t.test("deleting a session ends it on the other process's bus", async (t) => {
  const { a, b } = await twoProcesses(t)
  const ended: string[] = []
  b.bus.onSessionEnded((sessionId, reason) => ended.push(`${sessionId}: ${reason}`))
  a.bus.endSession('ses_bus', 'deleted')
  await until(async () => ended.length > 0, 5000, 'the end on B')
  t.same(ended, ['ses_bus: deleted'])
})

t.test('a listening connection that drops reconnects, and what was written meanwhile still arrives', async (t) => {
  const { a, b, schema } = await twoProcesses(t)
  const onB: EventRecord[] = []
  b.bus.subscribe('ses_bus', (e) => onB.push(e))
  await b.bus.subscribed('ses_bus')
  await a.log.append(event('before'))
  await until(async () => onB.length === 1, 5000, 'the first event')
  const admin = new PostgresStore({ connectionString: postgresUrl })
  t.teardown(() => admin.close())
  const killed = await admin.pool.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1`, [`LISTEN "agentd:${schema}"`])
  t.ok((killed.rowCount ?? 0) >= 1, 'the listening connections were cut')
  await a.log.append(event('while cut'))
  await a.log.append(event('after'))
  await until(async () => onB.length === 3, 10_000, 'the events written while the connection was down')
  t.same(onB.map((e) => [e.seq, e.type]), [[1, 'before'], [2, 'while cut'], [3, 'after']])
})

t.test('a listening connection the network silences (nothing closes) is noticed and replaced; the events written meanwhile arrive', async (t) => {
  // B listens through a proxy that can drop the network under it; its pool, and A, do not.
  const { proxy, url: viaProxy } = await proxyInFrontOf(t, postgresUrl, 5432)
  const { a, b } = await twoProcesses(t, { bListensVia: viaProxy.toString() })
  const onB: EventRecord[] = []
  b.bus.subscribe('ses_bus', (e) => onB.push(e))
  await b.bus.subscribed('ses_bus')
  await a.log.append(event('before'))
  await until(async () => onB.length === 1, 5000, 'the first event')

  proxy.partition()
  await a.log.append(event('while silent'))
  await until(async () => b.errors.some((m) => m.includes('did not answer')), 5000, 'the silent connection noticed')
  proxy.restore()
  await until(async () => onB.length === 2, 10_000, 'the event written while the connection was silent')
  await a.log.append(event('after'))
  await until(async () => onB.length === 3, 5000, 'wake-ups again')
  t.same(onB.map((e) => [e.seq, e.type]), [[1, 'before'], [2, 'while silent'], [3, 'after']])
})

/** A bus on `store` and a driven channel, with the seqs it delivers to a subscriber of ses_bus; `wake` is another process's notice of `seq`. */
function busFollowing(t: TapTest, store: Store) {
  const { channel, messages, reconnects } = drivenChannel()
  const bus = new SharedEventBus({ store, channel, processId: 'own_b', onError: () => undefined })
  t.teardown(() => bus.close())
  const received: number[] = []
  bus.subscribe('ses_bus', (e) => received.push(e.seq))
  const wake = (seq: number) => messages.forEach((listener) => listener({ type: 'events', from: 'own_a', sessions: [['ses_bus', seq]] }))
  const reconnect = () => reconnects.forEach((listener) => listener())
  return { bus, received, wake, reconnect }
}

t.test('a reconnect during a catch-up read still reads what was written while the channel was down', async (t) => {
  // A store whose reads wait until the test lets them answer, and a channel the test drives.
  const stored: EventRecord[] = []
  const reads: Array<() => void> = []
  const store = {
    getSessionById: async () => ({ lastSeq: 0 }),
    listEvents: (_sessionId: string, options: { after: number }) => {
      const answer = stored.filter((e) => e.seq > options.after)
      return new Promise<EventRecord[]>((resolve) => reads.push(() => resolve(answer)))
    }
  } as unknown as Store
  const { received, wake, reconnect } = busFollowing(t, store)
  const answerRead = async () => {
    await until(async () => reads.length > 0, 2000, 'a read')
    reads.shift()?.()
    await new Promise((resolve) => setImmediate(resolve))
  }

  // A wake-up for seq 1 starts a read; seq 1 is not stored yet when the read is taken.
  wake(1)
  await until(async () => reads.length > 0, 2000, 'the first read')
  // Meanwhile the channel went down and came back: seqs 1 and 2 were written, their wake-ups lost.
  stored.push({ ...event('one'), seq: 1 }, { ...event('two'), seq: 2 })
  reconnect()
  await answerRead()
  await answerRead()
  t.same(received, [1, 2], 'the reconnect asked for a read after the one in flight')
})

t.test('a catch-up reads a page at a time, also from the start of a long session and after a reconnect', async (t) => {
  const stored: EventRecord[] = Array.from({ length: 2500 }, (_, i) => ({ ...event(`e${i + 1}`), seq: i + 1 }))
  const limits: Array<number | undefined> = []
  const store = {
    // Where the bus starts cannot be read: it starts from the session's first event.
    getSessionById: async () => { throw new Error('the database is away') },
    listEvents: async (_sessionId: string, options: { after: number; limit?: number }) => {
      limits.push(options.limit)
      return stored.filter((e) => e.seq > options.after).slice(0, options.limit ?? Infinity)
    }
  } as unknown as Store
  const { bus, received, wake, reconnect } = busFollowing(t, store)
  await bus.subscribed('ses_bus')
  wake(2500)
  await until(async () => received.length === 2500, 2000, 'every event')
  t.ok(limits.every((limit) => limit !== undefined && limit <= 1000), `reads of at most 1000 events: ${limits.join(', ')}`)
  t.same(received, stored.map((e) => e.seq), 'each once, in order')

  // Written while the channel was down: a reconnect reads everything after, a page at a time.
  stored.push(...Array.from({ length: 1500 }, (_, i) => ({ ...event(`f${i + 1}`), seq: 2501 + i })))
  reconnect()
  await until(async () => received.length === 4000, 2000, 'the events written meanwhile')
  t.same(received.slice(2500), stored.slice(2500).map((e) => e.seq))
  t.ok(limits.every((limit) => limit !== undefined && limit <= 1000))
})

t.test('a subscription is set only once its starting point is read, so a read after it misses nothing the bus skips', async (t) => {
  // Another process commits seq 1 while this one's subscription reads where it starts: that read
  // (on a pooled connection of its own) answers after the commit, so the bus starts after seq 1.
  const stored: EventRecord[] = []
  let answerBaseline: () => void = () => {}
  const store = {
    getSessionById: () => new Promise((resolve) => {
      answerBaseline = () => resolve({ lastSeq: stored.length })
    }),
    listEvents: async (_sessionId: string, options: { after: number }) => stored.filter((e) => e.seq > options.after)
  } as unknown as Store
  const bus = new SharedEventBus({ store, channel: drivenChannel().channel, processId: 'own_b', onError: () => undefined })
  t.teardown(() => bus.close())
  const live: number[] = []
  bus.subscribe('ses_bus', (e) => live.push(e.seq))
  let set = false
  const subscribed = bus.subscribed('ses_bus').then(() => {
    set = true
  })
  await new Promise((resolve) => setImmediate(resolve))
  t.notOk(set, 'not set while where it starts is still being read')
  stored.push({ ...event('committed meanwhile'), seq: 1 })
  answerBaseline()
  await subscribed
  const replayed = (await store.listEvents('ses_bus', { after: 0 })).map((e) => e.seq)
  t.same([...replayed, ...live], [1], 'the event the bus starts after is in a read made once it is set, and only there')
})

t.test('an SSE stream replays only once its subscription is set', async (t) => {
  const stored: EventRecord[] = []
  let set = false
  let answer: () => void = () => {}
  const feed = {
    subscribe: () => () => undefined,
    subscribed: () => new Promise<void>((resolve) => {
      answer = () => {
        set = true
        resolve()
      }
    })
  }
  const readsBeforeSet: number[] = []
  const store = {
    listEvents: async () => {
      if (!set) readsBeforeSet.push(1)
      return stored
    },
    getSessionById: async () => ({ id: 'ses_bus' })
  } as unknown as Store
  const app = createServer((_req, res) => {
    openEventStream(res, store, feed, { sessionId: 'ses_bus', after: 0 })
  })
  await new Promise<void>((resolve) => app.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise((resolve) => app.close(resolve)))
  const { port } = app.address() as { port: number }
  const controller = new AbortController()
  t.teardown(() => controller.abort())
  const response = await fetch(`http://127.0.0.1:${port}/`, { signal: controller.signal })
  t.equal(response.status, 200)
  await new Promise((resolve) => setTimeout(resolve, 50))
  t.same(readsBeforeSet, [], 'no replay read before the subscription is set')
  stored.push({ ...event('committed meanwhile'), seq: 1 })
  answer()
  const reader = (response.body as ReadableStream<Uint8Array>).getReader()
  let text = ''
  while (!text.includes('committed meanwhile')) text += new TextDecoder().decode((await reader.read()).value)
  t.match(text, /id: 1\nevent: committed meanwhile/, 'the replay, made after, carries the event')
  controller.abort()
})

t.test('a catch-up read that fails is tried again: the events it was to read still arrive, with no other wake-up', async (t) => {
  const stored: EventRecord[] = [{ ...event('one'), seq: 1 }, { ...event('done'), seq: 2 }]
  let failures = 1
  const store = {
    getSessionById: async () => ({ lastSeq: 0 }),
    listEvents: async (_sessionId: string, options: { after: number }) => {
      // A pooled connection the database dropped (pg_terminate_backend, a restart) fails one read.
      if (failures-- > 0) throw new Error('terminating connection due to administrator command')
      return stored.filter((e) => e.seq > options.after)
    }
  } as unknown as Store
  const { bus, received, wake } = busFollowing(t, store)
  await bus.subscribed('ses_bus')
  // The run's last wake-up: nothing else will come for this session.
  wake(2)
  await until(async () => received.length === 2, 5000, 'the events of the failed read')
  t.same(received, [1, 2], 'each once, in order')
})

t.test('a session deleted while the channel was down ends on this process once it reconnects', async (t) => {
  // Its 'ended' message went out while this process was not listening, and is lost.
  let deleted = false
  const store = {
    getSessionById: async () => (deleted ? null : { lastSeq: 0 }),
    listEvents: async () => []
  } as unknown as Store
  const { bus, reconnect } = busFollowing(t, store)
  await bus.subscribed('ses_bus')
  const ended: string[] = []
  bus.onSessionEnded((sessionId) => ended.push(sessionId))
  deleted = true
  reconnect()
  await until(async () => ended.length > 0, 5000, 'the session ended')
  t.same(ended, ['ses_bus'])
})

t.test('a reconnect ends nothing whose session is still there', async (t) => {
  const store = { getSessionById: async () => ({ lastSeq: 0 }), listEvents: async () => [] } as unknown as Store
  const { bus, reconnect } = busFollowing(t, store)
  await bus.subscribed('ses_bus')
  const ended: string[] = []
  bus.onSessionEnded((sessionId) => ended.push(sessionId))
  reconnect()
  await new Promise((resolve) => setTimeout(resolve, 200))
  t.same(ended, [])
})

t.test('a subscription to a session deleted just before (its end already sent) ends it on this process', async (t) => {
  // The route found the session, then another process deleted it and its 'ended' came before this subscription.
  const store = { getSessionById: async () => null, listEvents: async () => [] } as unknown as Store
  const bus = new SharedEventBus({ store, channel: drivenChannel().channel, processId: 'own_b', onError: () => undefined })
  t.teardown(() => bus.close())
  const ended: string[] = []
  bus.onSessionEnded((sessionId) => ended.push(sessionId))
  bus.subscribe('ses_bus', () => undefined)
  await bus.subscribed('ses_bus')
  await until(async () => ended.length > 0, 2000, 'the session ended')
  t.same(ended, ['ses_bus'])
})

t.test('a listening connection whose LISTEN fails as it reconnects is closed, not left open beside the next one', async (t) => {
  const schema = await withSchema(t)
  const store = new PostgresStore({ connectionString: postgresUrl, options: `-c search_path=${schema}` })
  t.teardown(() => store.close())
  const clients: pg.Client[] = []
  const connect = () => {
    const client = store.newClient()
    // The second connection connects, then its LISTEN fails (a statement timeout on a database that stalls).
    if (clients.length === 1) {
      const query = client.query.bind(client) as (text: string) => Promise<unknown>
      ;(client as unknown as { query: (text: string) => Promise<unknown> }).query = async (text: string) => {
        if (text.startsWith('LISTEN')) throw new Error('Query read timeout')
        return query(text)
      }
    }
    clients.push(client)
    return client
  }
  const channel = await PostgresChannel.open(store.pool, connect, () => undefined)
  t.teardown(() => channel.close())
  let reconnected = false
  channel.onReconnect(() => (reconnected = true))
  const first = clients[0] as pg.Client & { processID: number }
  await store.pool.query('SELECT pg_terminate_backend($1)', [first.processID])
  await until(async () => reconnected, 10_000, 'listening again, on a third connection')
  t.equal(clients.length, 3)
  const failed = clients[1] as pg.Client & { processID: number }
  const open = async () => (await store.pool.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [failed.processID])).rowCount
  await until(async () => (await open()) === 0, 5000, 'the failed connection closed')
  t.equal(await open(), 0, 'its backend is gone')
})

t.test('a channel closed while its listening connection reconnects leaves no connection open', async (t) => {
  const schema = await withSchema(t)
  const store = new PostgresStore({ connectionString: postgresUrl, options: `-c search_path=${schema}` })
  t.teardown(() => store.close())
  const clients: Array<pg.Client & { processID: number }> = []
  let connecting: () => void = () => {}
  const connect = () => {
    const client = store.newClient() as pg.Client & { processID: number }
    if (clients.length === 1) {
      // The reconnect is under way (connected, not listening yet) when the channel closes.
      const listen = client.query.bind(client) as (text: string) => Promise<unknown>
      ;(client as unknown as { query: (text: string) => Promise<unknown> }).query = async (text: string) => {
        connecting()
        await new Promise((resolve) => setTimeout(resolve, 300))
        return listen(text)
      }
    }
    clients.push(client)
    return client
  }
  const channel = await PostgresChannel.open(store.pool, connect, () => undefined)
  const reconnecting = new Promise<void>((resolve) => (connecting = resolve))
  await store.pool.query('SELECT pg_terminate_backend($1)', [clients[0]?.processID])
  await reconnecting
  await channel.close()
  const second = clients[1] as pg.Client & { processID: number }
  const open = async () => (await store.pool.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [second.processID])).rowCount
  await until(async () => (await open()) === 0, 5000, 'the connection made during the close closed')
  t.equal(await open(), 0, 'its backend is gone')
})
