import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { readdir, readFile } from 'node:fs/promises'
import { CappedBuffer } from './output.ts'

export interface RunCommandOptions {
  cwd: string
  /** The whole process group is killed after this long. */
  timeoutMs?: number
  /** Kills the whole process group when it fires. */
  signal?: AbortSignal
  /** Bytes kept of stdout and of stderr each; the rest is counted, not stored. */
  maxOutputBytes: number
  /** Total output after which the command is killed as a flood (default 16 × maxOutputBytes, at least 1 MiB). */
  killAfterBytes?: number
  /** The environment of the command (nothing is inherited), to which AGENTD_COMMAND is added (see killMarked). */
  env: Record<string, string | undefined>
}

export interface CommandResult {
  /** null when the command was killed by a signal. */
  exitCode: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
  /** Some output was dropped (a note says where). */
  truncated: boolean
  timedOut: boolean
  aborted: boolean
  /** Killed because it printed more than killAfterBytes. */
  flooded: boolean
  /** Bytes the command printed, kept or not. */
  outputBytes: number
  stdoutBytes: number
  stderrBytes: number
  durationMs: number
}

/** The longest delay setTimeout takes. */
const MAX_TIMER_MS = 2 ** 31 - 1

// After SIGKILL the pipes close at once unless a process is stuck in the kernel; do not wait on it forever.
const closeGraceMs = 1000

/** The variable that marks every process a command starts, also those that leave its process group. */
export const COMMAND_MARKER = 'AGENTD_COMMAND'

/**
 * SIGKILLs every process whose environment carries `${COMMAND_MARKER}=${marker}`: the command's
 * descendants that left its process group (`setsid`, `setpgid`), which a kill of the group misses.
 * Linux only (/proc); elsewhere, and for a process that cleared its environment, the group kill is all.
 * Scans again while it finds any, since they may have forked meanwhile.
 */
async function killMarked(marker: string): Promise<void> {
  const needle = Buffer.from(`${COMMAND_MARKER}=${marker}\0`)
  for (let round = 0; round < 5; round++) {
    const entries = await readdir('/proc').catch(() => [] as string[])
    const marked = await Promise.all(
      entries
        .filter((name) => /^\d+$/.test(name) && Number(name) !== process.pid)
        .map((pid) => readFile(`/proc/${pid}/environ`).then((env) => (env.includes(needle) ? Number(pid) : 0), () => 0))
    )
    const found = marked.filter((pid) => pid > 0)
    if (found.length === 0) return
    for (const pid of found) {
      try {
        process.kill(pid, 'SIGKILL')
      } catch {
        // ESRCH: it is gone already.
      }
    }
  }
}

/**
 * Runs `bash -c command` in its own process group (detached), so timeout, abort, a flood of output
 * or the end of the command kill it together with everything it started, including processes
 * that left the group (killMarked).
 */
export function runCommand(command: string, options: RunCommandOptions): Promise<CommandResult> {
  const started = Date.now()
  const killAfterBytes = options.killAfterBytes ?? Math.max(16 * options.maxOutputBytes, 1024 * 1024)
  const marker = randomBytes(12).toString('hex')
  return new Promise<CommandResult>((resolve, reject) => {
    const child = spawn('bash', ['-c', command], {
      cwd: options.cwd,
      env: { ...options.env, [COMMAND_MARKER]: marker },
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe']
    })
    const stdout = new CappedBuffer(options.maxOutputBytes)
    const stderr = new CappedBuffer(options.maxOutputBytes)
    let timedOut = false
    let aborted = false
    let flooded = false
    let exit: { code: number | null; signal: NodeJS.Signals | null } | null = null
    let graceTimer: NodeJS.Timeout | undefined
    let done = false

    const killGroup = () => {
      if (child.pid === undefined) return
      try {
        process.kill(-child.pid, 'SIGKILL')
      } catch {
        // ESRCH: the group is already gone.
      }
      // A process that left the group and holds the pipes would keep the call open until the grace timer.
      void killMarked(marker)
    }
    const stop = () => {
      killGroup()
      graceTimer ??= setTimeout(() => {
        child.stdout.destroy()
        child.stderr.destroy()
        void finish()
      }, closeGraceMs)
    }
    const finish = async () => {
      if (done) return
      done = true
      clearTimeout(timer)
      clearTimeout(graceTimer)
      options.signal?.removeEventListener('abort', onAbort)
      // Nothing the command started outlives the call: what left the group since the last sweep goes now.
      await killMarked(marker)
      resolve({
        exitCode: exit?.code ?? null,
        signal: exit?.signal ?? (timedOut || aborted || flooded ? 'SIGKILL' : null),
        stdout: stdout.text(),
        stderr: stderr.text(),
        truncated: stdout.truncated || stderr.truncated,
        timedOut,
        aborted,
        flooded,
        outputBytes: stdout.total + stderr.total,
        stdoutBytes: stdout.total,
        stderrBytes: stderr.total,
        durationMs: Date.now() - started
      })
    }
    const onData = (sink: CappedBuffer) => (chunk: Buffer) => {
      sink.push(chunk)
      if (!flooded && stdout.total + stderr.total > killAfterBytes) {
        flooded = true
        stop()
      }
    }
    const onAbort = () => {
      aborted = true
      stop()
    }

    // setTimeout fires at once for a delay over 2^31 - 1 ms (bash_run's timeoutMs has no maximum): one that long is no limit.
    const timer =
      options.timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            timedOut = true
            stop()
          }, Math.min(options.timeoutMs, MAX_TIMER_MS))
    if (options.signal?.aborted) onAbort()
    else options.signal?.addEventListener('abort', onAbort, { once: true })

    child.stdout.on('data', onData(stdout))
    child.stderr.on('data', onData(stderr))
    child.on('error', (err) => {
      if (done) return
      done = true
      clearTimeout(timer)
      clearTimeout(graceTimer)
      options.signal?.removeEventListener('abort', onAbort)
      reject(err)
    })
    child.on('exit', (code, signal) => {
      exit = { code, signal }
      // Background children would keep the pipes open and outlive the call.
      stop()
    })
    child.on('close', () => void finish())
  })
}
