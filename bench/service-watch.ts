/**
 * Inside the agentd process of a bench: what held its event loop up, for the bench to ask over
 * IPC (bench/child.ts). One timer, every TICK_MS, measures how late it fires (the event loop's
 * delay, as perf_hooks.monitorEventLoopDelay does) and keeps each stall of PAUSE_MS or more with
 * where the main thread was meanwhile (on a CPU, queued for one, blocked), and the main thread's
 * CPU clock. GC pauses come from a PerformanceObserver, and what it allocated from
 * bench/heap-watch.ts; the SQLite store's group commits (BEGIN IMMEDIATE … COMMIT), its
 * statements by kind and the COMMITs that rewound the WAL are timed around node:sqlite's
 * StatementSync.prototype.run, and the checkpoints the store asks for on the event loop (PRAGMA
 * wal_checkpoint) around DatabaseSync.prototype.exec; those the store's checkpoint thread makes
 * hold no turn of the loop and are not counted. Pauses carry their time on the bench's clock,
 * so the bench can tell which chunks were in flight during them. The timer wakes an idle agentd
 * 200 times a second (a few % of a core on a small VM); a busy one it costs little.
 */
import { closeSync, openSync, readSync, writeFileSync } from 'node:fs'
import { Session } from 'node:inspector/promises'
import { PerformanceObserver, constants, createHistogram } from 'node:perf_hooks'
import { DatabaseSync, StatementSync } from 'node:sqlite'
import type { EventBus } from '../src/events/event-bus.ts'
import { watchHeap, type HeapSample } from './heap-watch.ts'
import { PAUSE_MS, add, totals, type PauseTotals } from './pause-totals.ts'
import { fromPerformanceNow, preciseNow } from './stamping-model.ts'

/** A COMMIT that rewound the WAL is listed as a pause when it took this long (see watchService). */
const RESTART_PAUSE_MS = 1
/** The watch's timer: a shorter interval gives a finer CPU clock at more wake-ups. */
const TICK_MS = 5

/** One pause of PAUSE_MS or more: when it ended (preciseNow) and how long it lasted. */
export interface Pause {
  endedAt: number
  ms: number
  kind: 'gc minor' | 'gc major' | 'gc other' | 'group commit' | 'checkpoint' | 'wal restart' | 'stall'
  /** For a group commit: how many statements it ran. */
  statements?: number
  /** For a stall: how much of it the main thread spent on the CPU, */
  cpuMs?: number
  /** … how much it was ready to run while other threads had the cores (the rest it was blocked: I/O). */
  queuedMs?: number
}

/** What the process went through since the previous sample. */
export interface ServiceSample {
  seconds: number
  /** How late the watch's timer fired, in ms. */
  loopDelay: { p50: number; p99: number; max: number }
  /** Turns of the event loop that kept the watch's timer waiting PAUSE_MS or more past its time. */
  stalls: PauseTotals & { cpuMs: number; queuedMs: number }
  gc: PauseTotals
  groupCommits: PauseTotals & { statements: number }
  commits: PauseTotals
  /** WAL checkpoints on the event loop, asked for with PRAGMA wal_checkpoint (a SQLite file only). */
  checkpoints: PauseTotals
  /**
   * COMMITs that rewound the WAL: the first write after a checkpoint copied all of it starts the
   * file over, and SQLite fsyncs its new header then, on the event loop, whichever connection
   * checkpointed (a SQLite file only). The COMMIT's whole time.
   */
  restarts: PauseTotals
  /** The store's other statements by kind ("INSERT INTO events", "UPDATE sessions SET last_seq" …): count and time. */
  statements: Record<string, { count: number; totalMs: number }>
  pauses: Pause[]
  /**
   * The main thread's CPU time (ms) at each tick of the watch's timer, beside the tick's time
   * (preciseNow): how much work agentd did between any two moments, whatever else the machine ran.
   */
  cpuClock: { at: number[]; cpuMs: number[] }
  /**
   * Each text_chunk whose delta is a send time (the stamping model's), as agentd published it:
   * the send time and how long after it the event was handed to its streams, which write its
   * frame in the same turn. Set by watchPublished().
   */
  published: { sentAt: number[]; delay: number[] }
  /** What it allocated on V8's heap meanwhile, and its GCs as V8 counts them (bench/heap-watch.ts). */
  heap: HeapSample
}

/**
 * The main thread's time on a CPU and waiting for one, in ms, from Linux's schedstat ("<on cpu
 * ns> <waiting on a run queue ns> <timeslices>"), read again through a descriptor kept open;
 * elsewhere its CPU time alone. Called from the main thread only.
 */
function threadTimesReader(): () => { cpuMs: number; queuedMs: number } {
  const text = Buffer.alloc(128)
  let fd = -1
  try {
    fd = openSync('/proc/thread-self/schedstat', 'r')
  } catch {
    // Not Linux: CPU time only.
  }
  return () => {
    if (fd >= 0) {
      try {
        const [cpu, queued] = text.toString('latin1', 0, readSync(fd, text, 0, text.length, 0)).split(' ')
        return { cpuMs: Number(cpu) / 1e6, queuedMs: Number(queued) / 1e6 }
      } catch {
        closeSync(fd)
        fd = -1
      }
    }
    const { user, system } = process.threadCpuUsage()
    return { cpuMs: (user + system) / 1000, queuedMs: 0 }
  }
}

/** "INSERT INTO events", "UPDATE sessions SET last_seq", "BEGIN IMMEDIATE", "COMMIT" …: a statement's first words. */
function statementKind(sql: string): string {
  return sql.replace(/\s+/g, ' ').trim().split(' ').slice(0, sql.startsWith('UPDATE') ? 4 : 3).join(' ').replace(/ =$/, '')
}

/** Reads the WAL's checkpoint sequence number (header bytes 12–15); restarted() says whether it moved since the last call. */
function walHeaderReader(path: string): { restarted(): boolean } {
  let fd = -1
  let sequence = -1
  const header = Buffer.alloc(16)
  return {
    restarted() {
      try {
        if (fd < 0) fd = openSync(path, 'r')
        if (readSync(fd, header, 0, 16, 0) < 16) return false
      } catch {
        return false
      }
      const now = header.readUInt32BE(12)
      const moved = sequence >= 0 && now !== sequence
      sequence = now
      return moved
    }
  }
}

/**
 * Profiles this process from now until the returned stop(), which writes the profile to `file`:
 * one phase of a bench rather than the whole process. 'cpu': a .cpuprofile, as node --cpu-prof
 * writes it; 'heap': a .heapprofile of sampled allocations (every 8 KiB on average), objects
 * collected since included, so that it shows what the phase allocated.
 */
export async function startProfile(kind: 'cpu' | 'heap'): Promise<{ stop(file: string): Promise<void> }> {
  const session = new Session()
  session.connect()
  if (kind === 'heap') {
    await session.post('HeapProfiler.enable')
    await session.post('HeapProfiler.startSampling', { samplingInterval: 8192, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true })
  } else {
    await session.post('Profiler.enable')
    await session.post('Profiler.start')
  }
  return {
    async stop(file) {
      if (kind === 'heap') {
        const { profile } = await session.post('HeapProfiler.stopSampling')
        writeFileSync(file, JSON.stringify(profile))
      } else {
        const { profile } = await session.post('Profiler.stop')
        // The profile's times are µs of the monotonic clock; this pair maps them to preciseNow().
        const clock = { monotonicUs: Number(process.hrtime.bigint() / 1000n), preciseNow: preciseNow() }
        writeFileSync(file, JSON.stringify({ ...profile, clock }))
      }
      session.disconnect()
    }
  }
}

/**
 * Starts watching; `sample()` reports what happened since the previous call (or the start) and
 * starts over. `watchPublished(bus)` adds the time each stamped text chunk was published.
 */
export function watchService(walPath: string | null): { sample(): ServiceSample; watchPublished(bus: EventBus): void } {
  const delay = createHistogram()
  const heap = watchHeap()
  const threadTimes = threadTimesReader()
  let since = preciseNow()
  let gc = totals()
  let stalls = { ...totals(), cpuMs: 0, queuedMs: 0 }
  let groupCommits = { ...totals(), statements: 0 }
  let commits = totals()
  let checkpoints = totals()
  let restarts = totals()
  let statements: ServiceSample['statements'] = {}
  let pauses: Pause[] = []
  let cpuClock: ServiceSample['cpuClock'] = { at: [], cpuMs: [] }
  let published: ServiceSample['published'] = { sentAt: [], delay: [] }

  const gcKind = (flags: number): Pause['kind'] =>
    flags === constants.NODE_PERFORMANCE_GC_MINOR ? 'gc minor' : flags === constants.NODE_PERFORMANCE_GC_MAJOR ? 'gc major' : 'gc other'
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      add(gc, entry.duration)
      if (entry.duration >= PAUSE_MS) {
        const kind = gcKind((entry as unknown as { detail: { kind: number } }).detail.kind)
        pauses.push({ endedAt: fromPerformanceNow(entry.startTime + entry.duration), ms: entry.duration, kind })
      }
    }
  }).observe({ entryTypes: ['gc'] })

  // A stall is kept with where the main thread was meanwhile: on the CPU (agentd's own work),
  // queued for a core (the machine is busy), or blocked (waiting for I/O).
  let lastTick = performance.now()
  let last = threadTimes()
  setInterval(() => {
    const tick = performance.now()
    const times = threadTimes()
    const late = Math.max(0, tick - lastTick - TICK_MS)
    delay.record(Math.max(1, Math.round(late * 1e6)))
    if (late >= PAUSE_MS) {
      const cpuMs = times.cpuMs - last.cpuMs
      const queuedMs = times.queuedMs - last.queuedMs
      add(stalls, late)
      stalls.cpuMs += cpuMs
      stalls.queuedMs += queuedMs
      pauses.push({ endedAt: fromPerformanceNow(tick), ms: late, kind: 'stall', cpuMs, queuedMs })
    }
    cpuClock.at.push(fromPerformanceNow(tick))
    cpuClock.cpuMs.push(times.cpuMs)
    lastTick = tick
    last = times
  }, TICK_MS).unref()

  // The store's group commit is BEGIN IMMEDIATE, the batch's statements, COMMIT, all in one turn.
  // Once a checkpoint (on the store's thread, or asked for with exec, timed below) has copied the
  // whole WAL, the next COMMIT rewinds it: it writes a new header, which bumps the checkpoint
  // sequence in it, and fsyncs it before its frames (wal.c, sqlite3WalFrames). That COMMIT is
  // read as a restart. (SQLite's own checkpoint inside a COMMIT, past wal_autocheckpoint pages,
  // shows as a long group commit; the store's thread keeps the WAL far below that.)
  const wal = walPath ? walHeaderReader(walPath) : null
  const exec = DatabaseSync.prototype.exec as (this: DatabaseSync, sql: string) => void
  DatabaseSync.prototype.exec = function (this: DatabaseSync, sql: string) {
    if (!sql.includes('wal_checkpoint')) return exec.call(this, sql)
    const started = performance.now()
    try {
      return exec.call(this, sql)
    } finally {
      const ms = performance.now() - started
      add(checkpoints, ms)
      pauses.push({ endedAt: fromPerformanceNow(started + ms), ms, kind: 'checkpoint' })
    }
  }
  const run = StatementSync.prototype.run as (this: StatementSync, ...params: unknown[]) => ReturnType<StatementSync['run']>
  let batchStart = -1
  let batchStatements = 0
  // What each statement is, worked out once: sourceSQL makes a new string on every read.
  const kinds = new WeakMap<StatementSync, string>()
  StatementSync.prototype.run = function (this: StatementSync, ...params: unknown[]) {
    let sql = kinds.get(this)
    if (sql === undefined) {
      sql = statementKind(this.sourceSQL)
      kinds.set(this, sql)
    }
    if (sql === 'BEGIN IMMEDIATE') {
      batchStart = performance.now()
      batchStatements = 0
      return run.apply(this, params)
    }
    const started = performance.now()
    const result = run.apply(this, params)
    const ended = performance.now()
    if (sql !== 'COMMIT') {
      batchStatements++
      const kind = statements[sql] ?? (statements[sql] = { count: 0, totalMs: 0 })
      kind.count++
      kind.totalMs += ended - started
      return result
    }
    add(commits, ended - started)
    if (wal?.restarted()) {
      add(restarts, ended - started)
      if (ended - started >= RESTART_PAUSE_MS) pauses.push({ endedAt: fromPerformanceNow(ended), ms: ended - started, kind: 'wal restart' })
    }
    if (batchStart >= 0) {
      const ms = ended - batchStart
      add(groupCommits, ms)
      groupCommits.statements += batchStatements
      if (ms >= PAUSE_MS) pauses.push({ endedAt: fromPerformanceNow(ended), ms, kind: 'group commit', statements: batchStatements })
      batchStart = -1
    }
    return result
  }

  return {
    watchPublished(bus) {
      // Called after the session's own listeners (the SSE streams) have written the frame.
      bus.subscribeAll((event) => {
        if (event.type !== 'text_chunk') return
        const sentAt = Number((event.data as { delta?: unknown }).delta)
        if (!Number.isFinite(sentAt)) return
        published.sentAt.push(sentAt)
        published.delay.push(preciseNow() - sentAt)
      })
    },
    sample() {
      const now = preciseNow()
      const ms = (ns: number) => ns / 1e6
      const sample: ServiceSample = {
        seconds: (now - since) / 1000,
        loopDelay: { p50: ms(delay.percentile(50)), p99: ms(delay.percentile(99)), max: ms(delay.max) },
        stalls, gc, groupCommits, commits, checkpoints, restarts, statements, pauses, cpuClock, published, heap: heap.sample()
      }
      delay.reset()
      since = now
      gc = totals()
      stalls = { ...totals(), cpuMs: 0, queuedMs: 0 }
      groupCommits = { ...totals(), statements: 0 }
      commits = totals()
      checkpoints = totals()
      restarts = totals()
      statements = {}
      pauses = []
      cpuClock = { at: [], cpuMs: [] }
      published = { sentAt: [], delay: [] }
      return sample
    }
  }
}
