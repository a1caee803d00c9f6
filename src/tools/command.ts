import { spawn } from 'node:child_process'
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
  /** The complete environment of the command (nothing is inherited). */
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
  durationMs: number
}

// After SIGKILL the pipes close at once unless a process is stuck in the kernel; do not wait on it forever.
const closeGraceMs = 1000

/**
 * Runs `bash -c command` in its own process group (detached), so timeout, abort, a flood of output
 * or the end of the command kill it together with everything it started.
 */
export function runCommand(command: string, options: RunCommandOptions): Promise<CommandResult> {
  const started = Date.now()
  const killAfterBytes = options.killAfterBytes ?? Math.max(16 * options.maxOutputBytes, 1024 * 1024)
  return new Promise<CommandResult>((resolve, reject) => {
    const child = spawn('bash', ['-c', command], {
      cwd: options.cwd,
      env: options.env,
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
    }
    const stop = () => {
      killGroup()
      graceTimer ??= setTimeout(() => {
        child.stdout.destroy()
        child.stderr.destroy()
        finish()
      }, closeGraceMs)
    }
    const finish = () => {
      if (done) return
      done = true
      clearTimeout(timer)
      clearTimeout(graceTimer)
      options.signal?.removeEventListener('abort', onAbort)
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

    const timer =
      options.timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            timedOut = true
            stop()
          }, options.timeoutMs)
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
    child.on('close', finish)
  })
}
