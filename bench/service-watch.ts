/**
 * Inside the agentd process of a bench: what held its event loop up, for the bench to ask over
 * IPC (bench/child.ts). The event loop's delay (perf_hooks.monitorEventLoopDelay), garbage
 * collection pauses, and the SQLite store's group commits (BEGIN IMMEDIATE … COMMIT) and COMMITs,
 * timed around node:sqlite's StatementSync.prototype.run. Every pause of PAUSE_MS or more is kept
 * with its time on the bench's clock, so the bench can tell which late chunks it explains.
 */
import { readFileSync, writeFileSync } from 'node:fs'
import { Session } from 'node:inspector/promises'
import { PerformanceObserver, constants, monitorEventLoopDelay } from 'node:perf_hooks'
import { StatementSync } from 'node:sqlite'
import { preciseNow } from './stamping-model.ts'

/** Pauses at least this long are listed one by one. */
const PAUSE_MS = 5
/** The loop-delay timer's interval; a shorter one catches shorter stalls at more wake-ups. */
const RESOLUTION_MS = 2

/** Count, sum and longest of a kind of pause, in ms. */
export interface PauseTotals {
  count: number
  totalMs: number
  maxMs: number
  /** How many lasted PAUSE_MS or more. */
  long: number
}

/** One pause of PAUSE_MS or more: when it ended (preciseNow) and how long it lasted. */
export interface Pause {
  endedAt: number
  ms: number
  kind: 'gc minor' | 'gc major' | 'gc other' | 'group commit' | 'stall'
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
  loopDelay: { p50: number; p99: number; max: number }
  /** Turns of the event loop that kept the watch's timer waiting PAUSE_MS or more past its time. */
  stalls: PauseTotals & { cpuMs: number; queuedMs: number }
  gc: PauseTotals
  groupCommits: PauseTotals & { statements: number }
  commits: PauseTotals
  pauses: Pause[]
  /**
   * The main thread's CPU time (ms) at each tick of the watch's timer, beside the tick's time
   * (preciseNow): how much work agentd did between any two moments, whatever else the machine ran.
   */
  cpuClock: { at: number[]; cpuMs: number[] }
}

const totals = (): PauseTotals => ({ count: 0, totalMs: 0, maxMs: 0, long: 0 })
const add = (t: PauseTotals, ms: number) => {
  t.count++
  t.totalMs += ms
  if (ms > t.maxMs) t.maxMs = ms
  if (ms >= PAUSE_MS) t.long++
}

/**
 * The calling thread's time on a CPU and waiting for one, in ms, from Linux's schedstat
 * ("<on cpu ns> <waiting on a run queue ns> <timeslices>"); elsewhere its CPU time alone.
 */
function threadTimes(): { cpuMs: number; queuedMs: number } {
  try {
    const [cpu, queued] = readFileSync('/proc/thread-self/schedstat', 'utf8').split(' ')
    return { cpuMs: Number(cpu) / 1e6, queuedMs: Number(queued) / 1e6 }
  } catch {
    const { user, system } = process.threadCpuUsage()
    return { cpuMs: (user + system) / 1000, queuedMs: 0 }
  }
}

/**
 * Profiles this process from now until the returned stop(), which writes the profile (a
 * .cpuprofile, as node --cpu-prof writes) to `file`: one phase of a bench rather than the whole process.
 */
export async function startProfile(): Promise<{ stop(file: string): Promise<void> }> {
  const session = new Session()
  session.connect()
  await session.post('Profiler.enable')
  await session.post('Profiler.start')
  return {
    async stop(file) {
      const { profile } = await session.post('Profiler.stop')
      writeFileSync(file, JSON.stringify(profile))
      session.disconnect()
    }
  }
}

/** Starts watching; `sample()` reports what happened since the previous call (or the start) and starts over. */
export function watchService(): { sample(): ServiceSample } {
  const delay = monitorEventLoopDelay({ resolution: RESOLUTION_MS })
  delay.enable()
  let since = preciseNow()
  let gc = totals()
  let stalls = { ...totals(), cpuMs: 0, queuedMs: 0 }
  let groupCommits = { ...totals(), statements: 0 }
  let commits = totals()
  let pauses: Pause[] = []
  let cpuClock: ServiceSample['cpuClock'] = { at: [], cpuMs: [] }

  const gcKind = (flags: number): Pause['kind'] =>
    flags === constants.NODE_PERFORMANCE_GC_MINOR ? 'gc minor' : flags === constants.NODE_PERFORMANCE_GC_MAJOR ? 'gc major' : 'gc other'
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      add(gc, entry.duration)
      if (entry.duration >= PAUSE_MS) {
        const kind = gcKind((entry as unknown as { detail: { kind: number } }).detail.kind)
        pauses.push({ endedAt: performance.timeOrigin + entry.startTime + entry.duration, ms: entry.duration, kind })
      }
    }
  }).observe({ entryTypes: ['gc'] })

  // The same kind of timer as the histogram's, but each stall is kept with its time and where the
  // main thread was meanwhile: on the CPU (agentd's own work), queued for a core (the machine is
  // busy), or blocked (waiting for I/O).
  let lastTick = performance.now()
  let last = threadTimes()
  setInterval(() => {
    const tick = performance.now()
    const times = threadTimes()
    const late = tick - lastTick - RESOLUTION_MS
    if (late >= PAUSE_MS) {
      const cpuMs = times.cpuMs - last.cpuMs
      const queuedMs = times.queuedMs - last.queuedMs
      add(stalls, late)
      stalls.cpuMs += cpuMs
      stalls.queuedMs += queuedMs
      pauses.push({ endedAt: performance.timeOrigin + tick, ms: late, kind: 'stall', cpuMs, queuedMs })
    }
    cpuClock.at.push(performance.timeOrigin + tick)
    cpuClock.cpuMs.push(times.cpuMs)
    lastTick = tick
    last = times
  }, RESOLUTION_MS).unref()

  // The store's group commit is BEGIN IMMEDIATE, the batch's statements, COMMIT, all in one turn.
  const run = StatementSync.prototype.run as (this: StatementSync, ...params: unknown[]) => ReturnType<StatementSync['run']>
  let batchStart = -1
  let batchStatements = 0
  StatementSync.prototype.run = function (this: StatementSync, ...params: unknown[]) {
    const sql = this.sourceSQL
    if (sql === 'BEGIN IMMEDIATE') {
      batchStart = performance.now()
      batchStatements = 0
      return run.apply(this, params)
    }
    if (sql !== 'COMMIT') {
      batchStatements++
      return run.apply(this, params)
    }
    const started = performance.now()
    const result = run.apply(this, params)
    const ended = performance.now()
    add(commits, ended - started)
    if (batchStart >= 0) {
      const ms = ended - batchStart
      add(groupCommits, ms)
      groupCommits.statements += batchStatements
      if (ms >= PAUSE_MS) pauses.push({ endedAt: performance.timeOrigin + ended, ms, kind: 'group commit', statements: batchStatements })
      batchStart = -1
    }
    return result
  }

  return {
    sample() {
      const now = preciseNow()
      const ms = (ns: number) => ns / 1e6
      const sample: ServiceSample = {
        seconds: (now - since) / 1000,
        // The histogram holds how late each RESOLUTION_MS timer fired, the interval itself included.
        loopDelay: { p50: ms(delay.percentile(50)), p99: ms(delay.percentile(99)), max: ms(delay.max) },
        stalls, gc, groupCommits, commits, pauses, cpuClock
      }
      delay.reset()
      since = now
      gc = totals()
      stalls = { ...totals(), cpuMs: 0, queuedMs: 0 }
      groupCommits = { ...totals(), statements: 0 }
      commits = totals()
      pauses = []
      cpuClock = { at: [], cpuMs: [] }
      return sample
    }
  }
}
