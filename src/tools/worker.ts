import { Worker, type ResourceLimits } from 'node:worker_threads'
import { ToolFailure } from './tool-errors.ts'

export interface WorkerRunOptions {
  /** The worker is terminated and the call fails with TIMEOUT (aborted) after this long. */
  timeoutMs?: number
  /** Terminates the worker; the call rejects with the signal's reason. */
  signal?: AbortSignal
  /** V8 heap limits of the worker; defaults keep a runaway tool far below the service's own heap. */
  resourceLimits?: ResourceLimits
}

/** What worker-entry.ts posts back. */
export type WorkerReply =
  | { ok: true; result: unknown }
  | {
      ok: false
      failure:
        | { kind: 'tool_failure'; code: ToolFailure['code']; errorType: ToolFailure['errorType']; message: string; detail?: Record<string, unknown> }
        | { kind: 'error'; name: string; message: string; code?: string }
    }

const defaultLimits: ResourceLimits = { maxOldGenerationSizeMb: 128, maxYoungGenerationSizeMb: 16, stackSizeMb: 4 }
const entry = new URL('./worker-entry.ts', import.meta.url)

/**
 * Runs `exportName(input)` of `modulePath` on a worker thread, so CPU-bound or runaway work cannot
 * block the event loop. The worker is terminated on timeout or abort; running out of its heap limit
 * becomes a runtime UNKNOWN failure with `detail.reason = 'memory_limit'` (the SPEC has no code for
 * an exhausted resource, and OUTPUT_TOO_LARGE would claim the output was the problem).
 */
export function runInWorker<T = unknown>(
  modulePath: string | URL,
  exportName: string,
  input: unknown,
  options: WorkerRunOptions = {}
): Promise<T> {
  const { signal, timeoutMs } = options
  if (signal?.aborted) return Promise.reject(signal.reason)
  const resourceLimits = { ...defaultLimits, ...options.resourceLimits }
  const moduleUrl = modulePath instanceof URL ? modulePath.href : modulePath

  return new Promise<T>((resolve, reject) => {
    const worker = new Worker(entry, {
      workerData: { moduleUrl, exportName, input },
      resourceLimits,
      // Piped and discarded: console output is not part of the protocol and must not flood the service's logs.
      stdout: true,
      stderr: true
    })
    worker.stdout.resume()
    worker.stderr.resume()
    let settled = false
    const finish = (fn: () => void) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      signal?.removeEventListener('abort', onAbort)
      fn()
      // terminate() also stops a thread stuck in a loop; its promise is not awaited so the caller settles now.
      worker.terminate().catch(() => {})
    }
    const timer =
      timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            finish(() => reject(new ToolFailure('TIMEOUT', `The worker did not finish within ${timeoutMs} ms and was stopped.`, { timeoutMs })))
          }, timeoutMs)
    const onAbort = () => finish(() => reject(signal?.reason))
    signal?.addEventListener('abort', onAbort, { once: true })

    worker.on('message', (reply: WorkerReply) => {
      finish(() => (reply.ok ? resolve(reply.result as T) : reject(revive(reply.failure))))
    })
    worker.on('error', (err: Error & { code?: string }) => {
      if (err.code === 'ERR_WORKER_OUT_OF_MEMORY') {
        const limitMb = resourceLimits.maxOldGenerationSizeMb
        finish(() =>
          reject(
            new ToolFailure('UNKNOWN', `The work ran out of its memory limit (${limitMb} MB) and was stopped.`, { reason: 'memory_limit', limitMb }, {
              cause: err,
              recommendations: ['The tool ran out of its memory budget; call it on a smaller input (narrower path, fewer files, simpler pattern).']
            })
          )
        )
      } else {
        finish(() => reject(err))
      }
    })
    worker.on('exit', (code) => {
      finish(() => reject(new Error(`The worker exited with code ${code} before answering.`)))
    })
  })
}

function revive(failure: Extract<WorkerReply, { ok: false }>['failure']): Error {
  if (failure.kind === 'tool_failure') {
    return new ToolFailure(failure.code, failure.message, failure.detail, { errorType: failure.errorType })
  }
  const err = new Error(failure.message) as Error & { code?: string }
  err.name = failure.name
  if (failure.code !== undefined) err.code = failure.code
  return err
}
