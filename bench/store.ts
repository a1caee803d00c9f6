import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { pathToFileURL } from 'node:url'
import { DatabaseSync, StatementSync } from 'node:sqlite'
import { newId } from '../src/ids.ts'
import { json, sessionParams } from '../src/store/rows.ts'
import { SqliteStore } from '../src/store/sqlite.ts'
import type { EventChannel, MessageRecord, RunRecord, SessionRecord, Store, StoreWrite } from '../src/store/store.ts'
import { fmt, percentile, printTable } from './report.ts'

const CHUNKS = 20
const CONCURRENT = 50
const RUNS = { [CONCURRENT]: 2000, 1: 1000 } as Record<number, number>
const WARMUP = 200
/**
 * Measured runs are made in this many slices, the paths taking turns (each slice starting with the
 * next path: the one that goes first is favoured), so that all see the same machine state.
 */
const SLICES = 10
/** Runs of the pass that counts statements (node:sqlite's methods wrapped), apart from the timed ones. */
const COUNTED_RUNS = 100

/**
 * store: the CPU the SQLite store costs per run and per event, with no HTTP and no model. Each
 * path drives a store on a file of its own (WAL, synchronous=NORMAL) with the calls agentd makes
 * for one run of the throughput bench (new session, one fs_list call, a CHUNKS-chunk answer:
 * 32 events), in agentd's order and units of work, CONCURRENT runs at once and one at a time:
 * - node:sqlite floor: the same rows written with plain prepared INSERTs and UPDATEs (one a row),
 *   and the same reads, one transaction per event-loop turn, on the current schema; no seq
 *   bookkeeping, no row mapping.
 * - SqliteStore: src/store/sqlite.ts.
 * - BENCH_STORE_BASELINE=<path of another sqlite.ts> adds that store (say, a copy of an older
 *   commit's tree), measured in the same run.
 * CPU is this process's (process.cpuUsage), which is only the driver and the store; "writes ms"
 * is the time from a write's call to its commit (p99 shows checkpoints); WAL syscalls and bytes
 * are this process's writes (/proc/self/io, Linux).
 */
export async function run(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'agentd-bench-store-'))
  const paths: Path[] = []
  try {
    paths.push(await floorPath(join(dir, 'floor.db')), await storePath('SqliteStore', join(dir, 'store.db'), SqliteStore))
    const baseline = process.env['BENCH_STORE_BASELINE']
    if (baseline) {
      const module = (await import(pathToFileURL(resolve(baseline)).href)) as { SqliteStore: StoreClass }
      paths.push(await storePath(`SqliteStore (${baseline})`, join(dir, 'baseline.db'), module.SqliteStore))
    }
    for (const concurrency of [CONCURRENT, 1]) {
      const runs = RUNS[concurrency] as number
      const counts = paths.map(() => ({ statements: 0, transactions: 0 }))
      for (const [i, path] of paths.entries()) {
        await drive(path, WARMUP, concurrency)
        counts[i] = await countStatements(() => drive(path, COUNTED_RUNS, concurrency))
      }
      const results = paths.map(() => ({ cpuMicros: 0, systemMicros: 0, runs: 0, events: 0, latencies: [] as number[], syscw: 0, wchar: 0, syscr: 0 }))
      for (let slice = 0; slice < SLICES; slice++) {
        for (let turn = 0; turn < paths.length; turn++) {
          const i = (slice + turn) % paths.length
          const path = paths[i] as Path
          const result = results[i] as (typeof results)[number]
          const io = ownIo()
          const cpu = process.cpuUsage()
          const outcome = await drive(path, runs / SLICES, concurrency)
          const used = process.cpuUsage(cpu)
          const ioAfter = ownIo()
          result.cpuMicros += used.user + used.system
          result.systemMicros += used.system
          result.runs += runs / SLICES
          result.events += outcome.events
          result.latencies.push(...outcome.latencies)
          result.syscw += ioAfter.syscw - io.syscw
          result.wchar += ioAfter.wchar - io.wchar
          result.syscr += ioAfter.syscr - io.syscr
        }
      }
      const rows: string[][] = [[
        'path', 'runs', 'CPU µs/run', 'of it system', 'CPU µs/event', 'transactions/run', 'statements/run', 'write calls/run', 'KiB/run', 'read calls/run', 'writes p50 ms', 'p99 ms', 'max ms'
      ]]
      for (const [i, path] of paths.entries()) {
        const r = results[i] as (typeof results)[number]
        const c = counts[i] as { statements: number; transactions: number }
        rows.push([
          path.name, String(r.runs), fmt(r.cpuMicros / r.runs, 0), fmt(r.systemMicros / r.runs, 0), fmt(r.cpuMicros / r.events, 1), fmt(c.transactions / COUNTED_RUNS, 1),
          fmt(c.statements / COUNTED_RUNS, 1), fmt(r.syscw / r.runs, 0), fmt(r.wchar / r.runs / 1024, 1), fmt(r.syscr / r.runs, 1), fmt(percentile(r.latencies, 50), 3),
          fmt(percentile(r.latencies, 99), 3), fmt(Math.max(...r.latencies), 2)
        ])
      }
      const events = (results[0]?.events ?? 0) / (results[0]?.runs ?? 1)
      console.log(`\nstore: a run = new session, fs_list call, ${CHUNKS}-chunk answer (${fmt(events, 0)} events); ` +
        `${concurrency === 1 ? 'one run at a time' : `${concurrency} runs at once`}; CPU of this process (driver and store)`)
      printTable(rows)
      const floor = (results[0]?.cpuMicros ?? 0) / (results[0]?.runs ?? 1)
      console.log(`above the floor: ${paths.slice(1).map((p, i) => `${p.name} ${fmt((results[i + 1]?.cpuMicros ?? 0) / (results[i + 1]?.runs ?? 1) - floor, 0)} µs/run`).join(', ')}`)
    }
  } finally {
    for (const path of paths) await path.close()
    rmSync(dir, { recursive: true, force: true })
  }
}

type StoreClass = new (path: string) => Store & { migrate(): Promise<void> }

/** One way of storing a run: the calls agentd makes, with their results thrown away. */
interface Path {
  name: string
  /** Reads, as agentd makes them per run. */
  countSessions(tenant: string): Promise<unknown>
  getSession(tenant: string, id: string): Promise<unknown>
  getSessionById(id: string): Promise<unknown>
  listEvents(sessionId: string, after: number): Promise<unknown>
  listMessages(sessionId: string): Promise<unknown>
  createSession(session: SessionRecord): Promise<unknown>
  /** A unit of work: all of its writes or none. */
  commit(writes: StoreWrite[]): Promise<unknown>
  close(): Promise<void>
}

async function storePath(name: string, file: string, Class: StoreClass): Promise<Path> {
  const store = new Class(file)
  await store.migrate()
  return {
    name,
    countSessions: (tenant) => store.countSessions(tenant),
    getSession: (tenant, id) => store.getSession(tenant, id),
    getSessionById: (id) => store.getSessionById(id),
    listEvents: (sessionId, after) => store.listEvents(sessionId, { after }),
    listMessages: (sessionId) => store.listMessages(sessionId),
    createSession: (session) => store.createSession(session),
    commit: (writes) => store.commit(writes),
    close: () => store.close()
  }
}

/**
 * The floor: the store's schema (migrated by SqliteStore, then closed) written with plain
 * prepared statements. Each event is inserted with the seq its run counts itself.
 */
async function floorPath(file: string): Promise<Path> {
  const setup = new SqliteStore(file)
  await setup.migrate()
  await setup.close()
  const d = new DatabaseSync(file, { enableForeignKeyConstraints: true })
  d.exec('PRAGMA locking_mode = EXCLUSIVE; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;')
  const s = {
    begin: d.prepare('BEGIN IMMEDIATE'),
    commit: d.prepare('COMMIT'),
    count: d.prepare('SELECT sessions FROM tenant_stats WHERE tenant = ?'),
    session: d.prepare('SELECT * FROM sessions WHERE id = ? AND tenant = ?'),
    sessionById: d.prepare('SELECT * FROM sessions WHERE id = ?'),
    events: d.prepare('SELECT * FROM events WHERE session_id = ? AND seq > ? ORDER BY seq'),
    messages: d.prepare('SELECT * FROM messages WHERE session_id = ? ORDER BY pos'),
    insertSession: d.prepare(`INSERT INTO sessions (id, tenant, created_at, updated_at, status, model, instructions, tools,
      approval, limits, metadata, input_tokens, output_tokens, total_tokens, forked_from)
      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
    insertEvent: d.prepare('INSERT INTO events (session_id, seq, run_id, channel, type, at, request_id, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)'),
    insertMessage: d.prepare(`INSERT INTO messages (id, session_id, run_id, role, content, tool_calls, tool_call_id, at_seq, created_at)
      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`),
    insertRun: d.prepare(`INSERT INTO runs (id, session_id, status, request_id, steps, usage, error, message_id, input, created_at,
      started_at, ended_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`),
    runStatus: d.prepare('UPDATE runs SET status = ?, started_at = coalesce(?, started_at), ended_at = coalesce(?, ended_at) WHERE id = ?'),
    runSteps: d.prepare('UPDATE runs SET steps = ?, usage = ? WHERE id = ?'),
    sessionStatus: d.prepare('UPDATE sessions SET status = ?, updated_at = ? WHERE id = ?'),
    usage: d.prepare('UPDATE sessions SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?, total_tokens = total_tokens + ? WHERE id = ?'),
    toolCall: d.prepare(`INSERT INTO tool_calls (id, session_id, run_id, step, name, input, state, started_at, ended_at, duration_ms, result, error)
      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_id, id) DO UPDATE SET state = excluded.state,
      ended_at = excluded.ended_at, duration_ms = excluded.duration_ms, result = excluded.result`)
  }
  const seqs = new Map<string, number>()
  let pending: Array<{ work: () => void; done: () => void }> = []
  const flush = () => {
    const batch = pending
    pending = []
    s.begin.run()
    for (const write of batch) write.work()
    s.commit.run()
    for (const write of batch) write.done()
  }
  const write = (work: () => void) => new Promise<void>((done) => {
    if (pending.length === 0) setImmediate(flush)
    pending.push({ work, done })
  })
  /** A write as the plain statement it becomes, its parameters taken now. */
  const statementOf = (w: StoreWrite): (() => void) => {
    switch (w.type) {
      case 'event': {
        const e = w.event
        const data = JSON.stringify(e.data)
        return () => {
          const seq = (seqs.get(e.sessionId) ?? 0) + 1
          seqs.set(e.sessionId, seq)
          s.insertEvent.run(e.sessionId, seq, e.runId, e.channel, e.type, e.at, e.requestId, data)
        }
      }
      case 'message': {
        const m = w.message
        const toolCalls = json(m.toolCalls)
        return () => void s.insertMessage.run(m.id, m.sessionId, m.runId, m.role, m.content, toolCalls, m.toolCallId ?? null, seqs.get(m.sessionId) ?? 0, m.createdAt)
      }
      case 'newRun': {
        const r = w.run
        const usage = json(r.usage)
        return () => void s.insertRun.run(r.id, r.sessionId, r.status, r.requestId, r.steps, usage, null, r.messageId, r.input, r.createdAt, null, null)
      }
      case 'run': {
        const { patch, id } = w
        if (patch.status) return () => void s.runStatus.run(patch.status ?? null, patch.startedAt ?? null, patch.endedAt ?? null, id)
        const usage = json(patch.usage)
        return () => void s.runSteps.run(patch.steps ?? 0, usage, id)
      }
      case 'session': {
        const { patch, id } = w
        const at = new Date().toISOString()
        return () => void s.sessionStatus.run(patch.status ?? null, at, id)
      }
      case 'usage': {
        const { usage, sessionId } = w
        return () => void s.usage.run(usage.inputTokens, usage.outputTokens, usage.totalTokens, sessionId)
      }
      case 'toolCall': {
        const c = w.call
        const input = json(c.input)
        const result = json(c.result)
        return () => void s.toolCall.run(c.id, c.sessionId, c.runId, c.step, c.name, input, c.state, c.startedAt, c.endedAt, c.durationMs, result, null)
      }
    }
  }
  return {
    name: 'node:sqlite floor',
    countSessions: async (tenant) => s.count.get(tenant),
    getSession: async (tenant, id) => s.session.get(id, tenant),
    getSessionById: async (id) => s.sessionById.get(id),
    listEvents: async (sessionId, after) => s.events.all(sessionId, after),
    listMessages: async (sessionId) => s.messages.all(sessionId),
    createSession: (session) => {
      const params = sessionParams(session, false)
      return write(() => void s.insertSession.run(...params))
    },
    commit: (writes) => {
      const work = writes.map(statementOf)
      return write(() => {
        for (const apply of work) apply()
      })
    },
    async close() {
      d.close()
    }
  }
}

/** Runs `count` runs on `path`, `concurrency` at once; returns the events stored and each write's time to commit. */
async function drive(path: Path, count: number, concurrency: number): Promise<{ events: number; latencies: number[] }> {
  const latencies: number[] = []
  let events = 0
  let next = 0
  const timed = <T>(write: Promise<T>): Promise<T> => {
    const started = performance.now()
    return write.then((value) => {
      latencies.push(performance.now() - started)
      return value
    })
  }
  const worker = async () => {
    while (next < count) {
      next++
      const stored = await oneRun(path, timed)
      events += stored
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker))
  return { events, latencies }
}

/**
 * One run as agentd stores it (traced from a throughput run): the route's reads, the run's
 * units of work in order, the text deltas of one tick as one unit handed over without waiting.
 * Returns the number of events stored.
 */
async function oneRun(path: Path, timed: <T>(write: Promise<T>) => Promise<T>): Promise<number> {
  const tenant = 'default'
  const now = () => new Date().toISOString()
  const session: SessionRecord = {
    id: newId('ses'), tenant, createdAt: now(), updatedAt: now(), status: 'idle', model: 'gpt-4o-mini', instructions: null, tools: null,
    approval: { mode: 'auto' }, limits: {}, metadata: {}, lastSeq: 0, usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 }, forkedFrom: null
  }
  const requestId = newId('req')
  const run: RunRecord = {
    id: newId('run'), sessionId: session.id, status: 'queued', requestId, steps: 0, usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 },
    error: null, messageId: newId('msg'), input: 'List the workspace, then answer.', createdAt: now(), startedAt: null, endedAt: null
  }
  const event = (channel: EventChannel, type: string, data: Record<string, unknown>): StoreWrite =>
    ({ type: 'event', event: { sessionId: session.id, runId: run.id, channel, type, at: now(), requestId, data } })
  const message = (fields: Pick<MessageRecord, 'role' | 'content'> & Partial<MessageRecord>): StoreWrite =>
    ({ type: 'message', message: { id: newId('msg'), sessionId: session.id, runId: run.id, createdAt: now(), ...fields } })
  const usage1 = { inputTokens: 10, outputTokens: 5, totalTokens: 15 }
  const usage2 = { inputTokens: 10, outputTokens: 20, totalTokens: 30 }
  const total = { inputTokens: 20, outputTokens: 25, totalTokens: 45 }
  const callId = newId('call')
  const call = { id: callId, sessionId: session.id, runId: run.id, step: 1, name: 'fs_list', input: {}, startedAt: now(), endedAt: null, durationMs: null }
  const listing = { path: '.', entries: [], truncated: false }
  const finished = { ...call, state: 'completed' as const, endedAt: now(), durationMs: 2, result: listing }
  const deltas = Array.from({ length: CHUNKS }, (_, i) => `${Date.now()}.${String(i).padStart(3, '0')}`)

  await path.countSessions(tenant)
  await timed(path.createSession(session))
  await path.getSession(tenant, session.id)
  await timed(path.commit([{ type: 'newRun', run }]))
  await path.getSessionById(session.id)
  await path.listEvents(session.id, 0)
  await timed(path.commit([
    { type: 'run', id: run.id, patch: { status: 'running', startedAt: now() } },
    { type: 'session', id: session.id, patch: { status: 'running' } },
    event('monitor', 'state_changed', { from: 'queued', to: 'running' }),
    message({ id: run.messageId, role: 'user', content: run.input })
  ]))
  await path.listMessages(session.id)
  await timed(path.commit([
    { type: 'run', id: run.id, patch: { steps: 1, usage: usage1 } },
    { type: 'usage', sessionId: session.id, usage: usage1 },
    event('monitor', 'token_usage', usage1),
    message({ role: 'assistant', content: null, toolCalls: [{ id: callId, name: 'fs_list', arguments: '{}' }] })
  ]))
  await timed(path.commit([{ type: 'toolCall', call: { ...call, state: 'pending' } }, event('progress', 'tool:start', { call: { ...call, state: 'pending' } })]))
  await timed(path.commit([{ type: 'toolCall', call: { ...call, state: 'executing' } }]))
  await timed(path.commit([
    { type: 'toolCall', call: finished },
    event('monitor', 'tool_executed', { call: finished, durationMs: 2, ok: true }),
    event('progress', 'tool:end', { call: finished }),
    message({ role: 'tool', content: JSON.stringify(listing), toolCallId: callId })
  ]))
  await timed(path.commit([event('monitor', 'step_complete', { step: 1, durationMs: 7, usage: usage1 })]))
  const text = timed(path.commit([
    event('progress', 'text_chunk_start', { step: 2 }),
    ...deltas.map((delta) => event('progress', 'text_chunk', { step: 2, delta })),
    event('progress', 'text_chunk_end', { step: 2, text: deltas.join('') })
  ]))
  await timed(path.commit([
    { type: 'run', id: run.id, patch: { steps: 2, usage: total } },
    { type: 'usage', sessionId: session.id, usage: usage2 },
    event('monitor', 'token_usage', usage2),
    message({ role: 'assistant', content: deltas.join('') })
  ]))
  await text
  await timed(path.commit([event('monitor', 'step_complete', { step: 2, durationMs: 7, usage: usage2 })]))
  await timed(path.commit([
    { type: 'run', id: run.id, patch: { status: 'completed', endedAt: now() } },
    { type: 'session', id: session.id, patch: { status: 'idle' } },
    event('monitor', 'state_changed', { from: 'running', to: 'completed' }),
    event('progress', 'done', { step: 2, reason: 'completed', runId: run.id })
  ]))
  return 10 + CHUNKS + 2
}

/**
 * Runs `work` with node:sqlite's statement methods counted: every statement run (reads included)
 * and every transaction begun, whichever path made them.
 */
async function countStatements(work: () => Promise<unknown>): Promise<{ statements: number; transactions: number }> {
  const counts = { statements: 0, transactions: 0 }
  const proto = StatementSync.prototype as unknown as Record<string, (...args: unknown[]) => unknown>
  const dbProto = DatabaseSync.prototype as unknown as Record<string, (...args: unknown[]) => unknown>
  const originals = { run: proto.run, get: proto.get, all: proto.all, exec: dbProto.exec }
  for (const method of ['run', 'get', 'all'] as const) {
    const original = originals[method] as (...args: unknown[]) => unknown
    proto[method] = function (this: StatementSync, ...args: unknown[]) {
      counts.statements++
      if (/^\s*BEGIN/i.test(this.sourceSQL)) counts.transactions++
      return original.apply(this, args)
    }
  }
  dbProto.exec = function (this: DatabaseSync, sql: unknown) {
    counts.statements++
    if (/^\s*BEGIN/i.test(String(sql))) counts.transactions++
    return (originals.exec as (...args: unknown[]) => unknown).call(this, sql)
  }
  try {
    await work()
  } finally {
    Object.assign(proto, { run: originals.run, get: originals.get, all: originals.all })
    dbProto.exec = originals.exec as (...args: unknown[]) => unknown
  }
  return counts
}

/** This process's write syscalls and bytes so far (/proc/self/io); zeros where there is none. */
function ownIo(): { syscw: number; wchar: number; syscr: number } {
  try {
    const io = readFileSync('/proc/self/io', 'utf8')
    const field = (name: string) => Number(new RegExp(`^${name}: (\\d+)`, 'm').exec(io)?.[1] ?? 0)
    return { syscw: field('syscw'), wchar: field('wchar'), syscr: field('syscr') }
  } catch {
    return { syscw: 0, wchar: 0, syscr: 0 }
  }
}
