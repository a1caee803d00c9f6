import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import t from 'tap'
import { SqliteStore } from '../../src/store/sqlite.ts'
import type { NewEvent, StoreWrite } from '../../src/store/store.ts'
import { DEFAULT_TENANT } from '../../src/http/auth.ts'
import { buildTestApp, tempDir, type TapTest } from '../helpers/app.ts'
import { testSession } from './contract.ts'

/**
 * Deleting a session takes its rows with it, and forking one copies them. On SQLite that work
 * runs on the event loop, so a session of many events must be deleted or copied in bounded
 * pieces, not in one transaction that holds every other session of every tenant waiting
 * (55 000 events deleted blocked the loop for ~165 ms; 250 000 forked, ~480 ms).
 */

const EVENTS = 250_000

function textChunk(sessionId: string, i: number, runId: string | null = 'run_big', type = 'text_chunk'): StoreWrite {
  const event: NewEvent = {
    sessionId, runId, channel: 'progress', type, at: new Date().toISOString(), requestId: 'req_big',
    data: { step: 1, delta: `chunk ${i} of a long answer` }
  }
  return { type: 'event', event }
}

/** A store on this file, migrated, as a start of the service opens it; closed when the test ends (if it was not before). */
async function storeAt(t: TapTest, path: string): Promise<SqliteStore> {
  const store = new SqliteStore(path)
  t.teardown(() => store.close())
  await store.migrate()
  return store
}

/** A store on a file of its own, migrated, with these sessions (of tenant `t`); closed when the test ends. */
async function openStore(t: TapTest, ...sessionIds: string[]): Promise<SqliteStore> {
  const store = await storeAt(t, join(tempDir(t), 'agentd.db'))
  for (const id of sessionIds) await store.createSession(testSession(id))
  return store
}

/** The sessions of tenant `t` a listing shows. */
async function listed(store: SqliteStore): Promise<string[]> {
  return (await store.listSessions('t', { limit: 10 })).map((s) => s.id)
}

/**
 * Starts again on the file a stop left with session `id` half deleted or half copied: the file
 * holds part of its `of` events, no listing shows it, and the start hides it at once and removes it.
 */
async function restartAfterStop(t: TapTest, path: string, id: string, of: number, listedIds: string[]): Promise<SqliteStore> {
  const store = await storeAt(t, path)
  const left = (await store.listEvents(id, { after: 0 })).length
  t.ok(left > 0 && left < of, `the file holds part of it (${left} of ${of} events)`)
  t.same(await listed(store), listedIds, 'nor is it listed after the restart')
  const removing = store.removeUnfinished()
  t.equal(await store.getSession('t', id), null, 'it is not found from the start on')
  t.equal(await removing, 1, 'the start removes it')
  t.equal(await store.getSessionById(id), null, 'its row is gone')
  t.same(await store.listEvents(id, { after: 0 }), [], 'with its events')
  t.equal(await store.removeUnfinished(), 0, 'nothing is left for the next start')
  return store
}

/** Stores `count` text chunks of `runId` in the session, 2 000 a commit. */
async function addChunks(store: SqliteStore, sessionId: string, count: number, runId: string | null = 'run_big'): Promise<void> {
  for (let i = 0; i < count; i += 2000) {
    await store.commit(Array.from({ length: Math.min(2000, count - i) }, (_, j) => textChunk(sessionId, i + j, runId)))
  }
}

/**
 * Waits for the store's idle checkpoint, as a service has one between bursts: the setup's bulk
 * commits leave a WAL near SQLite's own checkpoint threshold, which a service never sees.
 */
async function quiet(store: SqliteStore): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 20))
  await store.checkpointed()
}

/** The longest time the event loop went without running a 1 ms interval while `work` ran. */
async function longestStall(work: () => Promise<unknown>): Promise<number> {
  let last = performance.now()
  let longest = 0
  const tick = setInterval(() => {
    const now = performance.now()
    longest = Math.max(longest, now - last)
    last = now
  }, 1)
  try {
    await work()
    longest = Math.max(longest, performance.now() - last)
  } finally {
    clearInterval(tick)
  }
  return longest
}

t.test('a session of many events is deleted without stalling the event loop, and hidden while it goes', async (t) => {
  const store = await openStore(t, 'ses_big', 'ses_other')
  await addChunks(store, 'ses_big', EVENTS)
  await store.commit([{ type: 'message', message: { id: 'msg_big', sessionId: 'ses_big', runId: null, role: 'user', content: 'hi', createdAt: new Date().toISOString() } }])
  t.equal((await store.getSession('t', 'ses_big'))?.lastSeq, EVENTS)

  await quiet(store)
  let seenWhileDeleting: unknown = 'not looked'
  let otherWritesWhileDeleting = 0
  const stall = await longestStall(async () => {
    const deleting = store.deleteSession('t', 'ses_big')
    // Another session's writes and reads go on meanwhile, and the session being deleted is gone for requests at once.
    await new Promise((resolve) => setTimeout(resolve, 5))
    seenWhileDeleting = await store.getSession('t', 'ses_big')
    while (!(await Promise.race([deleting.then(() => true), new Promise((resolve) => setTimeout(resolve, 2, false))]))) {
      await store.commit([{ type: 'event', event: { sessionId: 'ses_other', runId: null, channel: 'monitor', type: 'tick', at: new Date().toISOString(), requestId: null, data: {} } }])
      otherWritesWhileDeleting++
    }
    t.equal(await deleting, true, 'the deletion reports the session was there')
  })
  t.equal(seenWhileDeleting, null, 'a session being deleted is not found')
  t.ok(otherWritesWhileDeleting > 0, `other sessions' writes committed while it was deleted (${otherWritesWhileDeleting})`)
  // One transaction for all of it blocked the loop for ~270 ms here; pieces of a few thousand rows take a few ms each.
  t.ok(stall < 100, `the event loop's longest stall while ${EVENTS} events were deleted: ${stall.toFixed(1)} ms`)

  t.equal(await store.getSession('t', 'ses_big'), null)
  t.same(await store.listEvents('ses_big', { after: 0 }), [], 'its events are gone')
  t.same(await store.listMessages('ses_big'), [], 'its messages are gone')
  t.equal(await store.countSessions('t'), 1)
  t.equal(await store.deleteSession('t', 'ses_big'), false, 'a second deletion finds nothing')
  t.equal((await store.listEvents('ses_other', { after: 0 })).length, otherWritesWhileDeleting, 'the other session kept every event')
})

t.test('a deletion asked for twice at once removes the session once: the second answers false at once', async (t) => {
  const store = await openStore(t, 'ses_twice')
  await addChunks(store, 'ses_twice', 20_000)
  const order: string[] = []
  const first = store.deleteSession('t', 'ses_twice').then((deleted) => { order.push(`first ${deleted}`) })
  const second = store.deleteSession('t', 'ses_twice').then((deleted) => { order.push(`second ${deleted}`) })
  await Promise.all([first, second])
  t.same(order, ['second false', 'first true'], 'the second found the deletion under way and did none of its work')
  t.equal(await store.getSessionById('ses_twice'), null)
})

t.test('a deletion cut short by a stop is hidden, and finished at the next start', async (t) => {
  const path = join(tempDir(t), 'agentd.db')
  const store = await storeAt(t, path)
  await store.createSession(testSession('ses_cut'))
  await store.createSession(testSession('ses_kept'))
  await addChunks(store, 'ses_cut', 12_000)
  // The process stops mid-deletion: the store is closed while the pieces are still being removed.
  const deleting = store.deleteSession('t', 'ses_cut').catch((err: Error) => err)
  await new Promise((resolve) => setImmediate(resolve))
  await new Promise((resolve) => setImmediate(resolve))
  t.same(await listed(store), ['ses_kept'], 'a session being deleted is not listed')
  await store.close()
  t.match(await deleting, { code: 'STORE_CLOSED' }, 'the deletion did not finish')

  const reopened = await restartAfterStop(t, path, 'ses_cut', 12_000, ['ses_kept'])
  t.equal((await reopened.getSession('t', 'ses_kept'))?.id, 'ses_kept', 'the other session is untouched')
})

t.test('a fork cut short by a stop is never listed, and is removed at the next start', async (t) => {
  const path = join(tempDir(t), 'agentd.db')
  const store = await storeAt(t, path)
  await store.createSession(testSession('ses_src'))
  await addChunks(store, 'ses_src', 12_001, null)
  await store.commit([{ type: 'message', message: { id: 'msg_src', sessionId: 'ses_src', runId: null, role: 'user', content: 'hi', createdAt: new Date().toISOString() } }])
  const forking = store.forkSession('ses_src', testSession('ses_half'), 12_001, { newMessageId: () => 'msg_copy', sealedAnswer: () => 'sealed' })
    .catch((err: Error) => err)
  // The process stops once the fork's first piece (its row, its newest events) is in the file.
  while (!(await store.getSessionById('ses_half'))) await new Promise((resolve) => setImmediate(resolve))
  t.same(await listed(store), ['ses_src'], 'a fork still copying is not listed')
  await store.close()
  t.match(await forking, { code: 'STORE_CLOSED' }, 'the fork did not finish')

  const reopened = await restartAfterStop(t, path, 'ses_half', 12_001, ['ses_src'])
  const source = await reopened.getSession('t', 'ses_src')
  t.equal(source?.lastSeq, 12_001, 'the source is untouched')
  t.equal((await reopened.listEvents('ses_src', { after: 0 })).length, 12_001)
  t.same((await reopened.listMessages('ses_src')).map((m) => m.content), ['hi'])
})

t.test('the service removes, as it starts, a fork that a stop cut short', async (t) => {
  const path = join(tempDir(t), 'agentd.db')
  const store = new SqliteStore(path)
  await store.migrate()
  await store.createSession(testSession('ses_src', { tenant: DEFAULT_TENANT }))
  await addChunks(store, 'ses_src', 12_001, null)
  const forking = store.forkSession('ses_src', testSession('ses_half', { tenant: DEFAULT_TENANT }), 12_001, {
    newMessageId: () => 'msg_copy', sealedAnswer: () => 'sealed'
  }).catch((err: Error) => err)
  while (!(await store.getSessionById('ses_half'))) await new Promise((resolve) => setImmediate(resolve))
  await store.close()
  t.match(await forking, { code: 'STORE_CLOSED' })

  const { app } = await buildTestApp(t, { env: { AGENTD_DB: path } })
  const listed = await app.inject({ method: 'GET', url: '/v1/sessions' })
  t.same(listed.json().data.map((s: { id: string }) => s.id), ['ses_src'], 'the half fork is not listed')
  t.equal((await app.inject({ method: 'GET', url: '/v1/sessions/ses_half' })).statusCode, 404, 'nor found')
  t.equal((await app.inject({ method: 'GET', url: '/v1/sessions/ses_src' })).json().lastSeq, 12_001, 'its source is')
  // The removal goes on while the service serves; another connection to the file sees it end.
  const file = new DatabaseSync(path, { readOnly: true })
  t.teardown(() => file.close())
  const rowsOf = (id: string) => Number((file.prepare('SELECT count(*) AS n FROM events WHERE session_id = ?').get(id) as { n: number }).n)
  const deadline = Date.now() + 10_000
  while (file.prepare('SELECT 1 FROM sessions WHERE id = ?').get('ses_half') && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
  t.equal(file.prepare('SELECT 1 FROM sessions WHERE id = ?').get('ses_half'), undefined, 'the half fork is removed from the file')
  t.equal(rowsOf('ses_half'), 0, 'with the events it had copied')
  t.equal(rowsOf('ses_src'), 12_001, 'and the source keeps all of its own')
})

t.test('a session of many events is forked without stalling the event loop, the fork hidden until it is whole', async (t) => {
  const store = await openStore(t, 'ses_src')
  // Events of no run (the next test is about runs): the fork point is the whole history.
  await addChunks(store, 'ses_src', EVENTS + 1, null)
  await store.commit([{ type: 'message', message: { id: 'msg_src', sessionId: 'ses_src', runId: null, role: 'user', content: 'hi', createdAt: new Date().toISOString() } }])

  await quiet(store)
  let seenWhileCopying: unknown = 'not looked'
  let listedWhileCopying: string[] = []
  let fork: Awaited<ReturnType<SqliteStore['forkSession']>> | undefined
  const stall = await longestStall(async () => {
    const forking = store.forkSession('ses_src', testSession('ses_fork'), EVENTS + 1, { newMessageId: () => 'msg_copy', sealedAnswer: () => 'sealed' })
    await new Promise((resolve) => setTimeout(resolve, 5))
    seenWhileCopying = await store.getSession('t', 'ses_fork')
    listedWhileCopying = await listed(store)
    fork = await forking
  })
  t.equal(seenWhileCopying, null, 'a fork still copying is not found')
  t.same(listedWhileCopying, ['ses_src'], 'nor listed')
  t.ok(stall < 100, `the event loop's longest stall while ${EVENTS} events were copied: ${stall.toFixed(1)} ms`)
  t.equal(fork?.lastSeq, EVENTS + 1)
  t.equal((await store.getSession('t', 'ses_fork'))?.lastSeq, EVENTS + 1, 'found once whole')
  t.same(await listed(store), ['ses_src', 'ses_fork'], 'and listed')
  const copied = await store.listEvents('ses_fork', { after: 0 })
  t.equal(copied.length, EVENTS + 1, 'every event is copied')
  t.ok(copied.every((e, i) => e.seq === i + 1), 'under the same seqs, in order')
  t.same(copied.at(-1), { ...(await store.listEvents('ses_src', { after: EVENTS }))[0], sessionId: 'ses_fork' }, 'as they were')
  t.same((await store.listMessages('ses_fork')).map((m) => m.content), ['hi'], 'with the messages')
  const [next] = await store.commit([textChunk('ses_fork', 0)])
  t.equal(next?.seq, EVENTS + 2, 'the fork goes on from its newest seq')
})

t.test('a filtered read of a long session does not stall the event loop, and finds what one query would', async (t) => {
  const store = await openStore(t, 'ses_long', 'ses_other')
  // A long session whose runs each end with a done: the rare events a client filters for.
  for (let run = 0; run < EVENTS / 5000; run++) {
    await addChunks(store, 'ses_long', 4999, `run_${run}`)
    await store.commit([textChunk('ses_long', run, `run_${run}`, 'done')])
  }
  await quiet(store)
  const runs = EVENTS / 5000
  let dones: Awaited<ReturnType<SqliteStore['listEvents']>> = []
  let otherWrites = 0
  const stall = await longestStall(async () => {
    let reading = true
    const read = store.listEvents('ses_long', { after: 0, types: ['done'] }).finally(() => { reading = false })
    // Another session's writes go on while the filter reads.
    while (reading) {
      await store.commit([textChunk('ses_other', otherWrites)])
      otherWrites++
    }
    dones = await read
  })
  t.ok(otherWrites > 1, `another session committed ${otherWrites} writes meanwhile`)
  t.ok(stall < 100, `the event loop's longest stall while ${EVENTS} events were filtered: ${stall.toFixed(1)} ms`)
  t.same(dones.map((e) => e.seq), Array.from({ length: runs }, (_, i) => (i + 1) * 5000), 'every done, in order')
  t.same(dones.map((e) => e.runId), Array.from({ length: runs }, (_, i) => `run_${i}`))
  const page = await store.listEvents('ses_long', { after: 5000, types: ['done'], limit: 3 })
  t.same(page.map((e) => e.seq), [10_000, 15_000, 20_000], 'a page from a point, as many as asked')
  const window = await store.listEvents('ses_long', { after: 0, untilSeq: 12_000, channels: ['progress'], types: ['done'] })
  t.same(window.map((e) => e.seq), [5000, 10_000], 'up to untilSeq')
  t.same(await store.listEvents('ses_long', { after: EVENTS, types: ['done'] }), [], 'nothing past the newest')
  t.same(await store.listEvents('ses_nope', { after: 0, types: ['done'] }), [], 'nothing of a session without events')
  const reading = store.listEvents('ses_long', { after: 0, types: ['done'] }).catch((err: Error) => err)
  await store.close()
  t.match(await reading, { code: 'STORE_CLOSED' }, 'a read the store closes under ends as the store closed')
})

t.test('the point a fork of many runs starts from is found without stalling the event loop', async (t) => {
  const store = await openStore(t, 'ses_runs')
  // 400 runs of 50 events, each ended by its `done` but the last, still going.
  const runs = 400
  for (let r = 0; r < runs; r++) {
    await store.commit(Array.from({ length: 50 }, (_, j) => textChunk('ses_runs', j, `run_${r}`, j === 49 && r < runs - 1 ? 'done' : 'text_chunk')))
  }
  await quiet(store)
  let fork: Awaited<ReturnType<SqliteStore['forkSession']>> | undefined
  const stall = await longestStall(async () => {
    fork = await store.forkSession('ses_runs', testSession('ses_runs_fork'), runs * 50, { newMessageId: () => 'msg_copy', sealedAnswer: () => 'sealed' })
  })
  // One query looking for each run event's `done` took 10.7 s here.
  t.ok(stall < 100, `the event loop's longest stall finding the point among ${runs * 50} events: ${stall.toFixed(1)} ms`)
  t.equal(fork?.lastSeq, (runs - 1) * 50, 'the run still going is left out of the fork')
  t.equal((await store.listEvents('ses_runs_fork', { after: 0 })).length, (runs - 1) * 50)
})

t.test('a session of many messages is read for a run, forked and deleted without stalling the event loop', async (t) => {
  const store = await openStore(t, 'ses_talk', 'ses_other')
  const at = () => new Date().toISOString()
  // 50 000 messages: user and assistant turns; the last assistant asks for two tools, one answered.
  const count = 50_000
  for (let i = 0; i < count; i += 2000) {
    await store.commit(Array.from({ length: 2000 }, (_, j): StoreWrite => ({
      type: 'message',
      message: { id: `msg_${i + j}`, sessionId: 'ses_talk', runId: `run_${Math.floor((i + j) / 2)}`, role: (i + j) % 2 ? 'assistant' : 'user', content: `message ${i + j}: ${'words of a turn '.repeat(12)}`, createdAt: at() }
    })))
  }
  await store.commit([
    { type: 'message', message: { id: 'msg_calls', sessionId: 'ses_talk', runId: 'run_last', role: 'assistant', content: null, createdAt: at(),
      toolCalls: [{ id: 'call_a', name: 'fs_read', arguments: '{}' }, { id: 'call_b', name: 'fs_list', arguments: '{}' }] } },
    { type: 'message', message: { id: 'msg_result', sessionId: 'ses_talk', runId: 'run_last', role: 'tool', content: 'ok', toolCallId: 'call_a', createdAt: at() } },
    textChunk('ses_talk', 0, null)
  ])
  await quiet(store)

  // A run's start reads the history from the newest summary on: with none (or none that could be
  // written), all of it. In one statement: ~40-130 ms here.
  let context: Awaited<ReturnType<SqliteStore['listContextMessages']>> | undefined
  let otherWrites = 0
  const readStall = await longestStall(async () => {
    let reading = true
    const read = store.listContextMessages('ses_talk').finally(() => { reading = false })
    while (reading) await store.commit([textChunk('ses_other', otherWrites++)])
    context = await read
  })
  t.ok(otherWrites > 1, `another session committed ${otherWrites} writes while ${count} messages were read`)
  t.ok(readStall < 100, `the event loop's longest stall reading them: ${readStall.toFixed(1)} ms`)
  t.equal(context?.offset, 0)
  t.equal(context?.messages.length, count + 2, 'every message')
  t.ok(context?.messages.every((m, i) => i >= count || m.id === `msg_${i}`), 'in order')
  t.same(context?.messages.slice(-2).map((m) => m.id), ['msg_calls', 'msg_result'])

  let ids = 0
  const sealing = { newMessageId: () => `msg_fork${++ids}`, sealedAnswer: (name: string) => `sealed ${name}` }
  let forked: Awaited<ReturnType<SqliteStore['forkSession']>> | undefined
  const forkStall = await longestStall(async () => {
    forked = await store.forkSession('ses_talk', testSession('ses_talk_fork'), 1, sealing)
  })
  // In one transaction: ~300-400 ms here.
  t.ok(forkStall < 100, `the event loop's longest stall forking ${count} messages: ${forkStall.toFixed(1)} ms`)
  t.equal(forked?.lastSeq, 1)
  const copied = await store.listMessages('ses_talk_fork')
  t.equal(copied.length, count + 3, 'every message, and a sealed answer for the open call')
  t.same(copied.slice(0, 3).map((m) => m.content?.split(':')[0]), ['message 0', 'message 1', 'message 2'], 'in order')
  t.ok(copied.every((m) => m.id.startsWith('msg_fork') && m.sessionId === 'ses_talk_fork'), 'under new IDs')
  t.match(copied.slice(-3), [{ role: 'assistant', toolCalls: [{ id: 'call_a' }, { id: 'call_b' }] }, { role: 'tool', toolCallId: 'call_a', content: 'ok' },
    { role: 'tool', toolCallId: 'call_b', content: 'sealed fs_list', runId: 'run_last' }], 'the call left open is answered as sealed')

  await quiet(store)
  const deleteStall = await longestStall(() => store.deleteSession('t', 'ses_talk'))
  // In one transaction: ~110-170 ms here.
  t.ok(deleteStall < 60, `the event loop's longest stall deleting ${count} messages: ${deleteStall.toFixed(1)} ms`)
  t.same(await store.listMessages('ses_talk'), [])
  t.equal((await store.listMessages('ses_talk_fork')).length, count + 3, 'the fork keeps its own')
})

t.test('a fork whose copy fails part-way leaves nothing behind, as one transaction would', async (t) => {
  const store = await openStore(t, 'ses_src')
  await addChunks(store, 'ses_src', 12_000, null)
  await store.commit(['msg_1', 'msg_2', 'msg_3'].map((id): StoreWrite => ({
    type: 'message', message: { id, sessionId: 'ses_src', runId: null, role: 'user', content: id, createdAt: new Date().toISOString() }
  })))
  // The second copied message gets the first one's ID: its piece fails on the unique key.
  await t.rejects(store.forkSession('ses_src', testSession('ses_broken'), 12_000, { newMessageId: () => 'msg_same', sealedAnswer: () => 'sealed' }),
    /UNIQUE/, 'the fork fails')
  t.equal(await store.getSession('t', 'ses_broken'), null, 'no fork is left')
  t.same(await store.listEvents('ses_broken', { after: 0 }), [], 'nor any of its events')
  t.equal(await store.countSessions('t'), 1)
  t.equal((await store.listEvents('ses_src', { after: 0 })).length, 12_000, 'the source is untouched')
})

t.test('a session deleted while it is being forked fails the fork, which leaves nothing behind', async (t) => {
  const store = await openStore(t, 'ses_src')
  await addChunks(store, 'ses_src', 100_000, null)
  const forking = store.forkSession('ses_src', testSession('ses_fork'), 100_000, { newMessageId: () => 'msg_copy', sealedAnswer: () => 'sealed' })
    .then(() => 'forked', (err: Error) => err)
  // The fork copies 25 pieces; the deletion starts while it does, and takes the oldest events first.
  await new Promise((resolve) => setImmediate(resolve))
  await new Promise((resolve) => setImmediate(resolve))
  t.equal(await store.deleteSession('t', 'ses_src'), true)
  t.match(await forking, { code: 'SESSION_GONE' }, 'the fork fails: what it had copied may miss what the deletion took first')
  t.equal(await store.getSessionById('ses_fork'), null, 'no fork is left')
  t.same(await store.listEvents('ses_fork', { after: 0 }), [])
  t.equal(await store.countSessions('t'), 0)
})
