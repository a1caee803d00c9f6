import { once } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import { Worker } from 'node:worker_threads'
import type { CheckpointAnswer } from './sqlite-checkpoint-worker.ts'

/** How long close() lets the thread close its connection before it is terminated. */
const CLOSE_TIMEOUT_MS = 2_000

/**
 * Copies a SQLite store's WAL into its database file on a worker thread with a connection of
 * its own (sqlite-checkpoint-worker.ts). A checkpoint copies a few hundred pages and fsyncs
 * twice: 2–5 ms, and up to 13 ms, measured on the bench machine with 100 streams, that used to
 * hold the event loop every ~60 ms. On the thread it overlaps the service's own work: SQLite
 * lets a checkpoint run beside the writer (WAL mode), and the writer rewinds the WAL at its next
 * commit once everything has been copied.
 *
 * The thread starts at the first request (a store that never gets that far never pays for it).
 * Requests made while one runs are folded into one more after it. If the thread cannot run
 * (it fails to start, or its connection fails), `request()` answers false from then on and the
 * store checkpoints on its own connection, as it did before this existed; `onFailure` is told
 * why, once, so that the service can log it.
 */
export class WalCheckpointer {
  readonly #path: string
  readonly #onFailure: ((err: Error) => void) | undefined
  #worker: Worker | null = null
  /** A request is being served by the thread. */
  #running = false
  /** Another was asked for meanwhile: it runs when the current one is answered. */
  #again = false
  #failed = false
  #closed = false
  /** Resolves the waiters of settled(). */
  #idle: Array<() => void> = []

  constructor(path: string, onFailure?: (err: Error) => void) {
    this.#path = path
    this.#onFailure = onFailure
  }

  /** Asks for a checkpoint; false when the thread cannot serve it (the caller then checkpoints itself). */
  request(): boolean {
    if (this.#failed) return false
    if (this.#closed) return true
    if (this.#running) {
      this.#again = true
      return true
    }
    this.#running = true
    try {
      this.#thread().postMessage('checkpoint')
    } catch (err) {
      this.#fail(err)
      return false
    }
    return true
  }

  /** Resolves once no checkpoint is running or asked for (tests and close). */
  settled(): Promise<void> {
    if (!this.#running) return Promise.resolve()
    return new Promise((resolve) => this.#idle.push(resolve))
  }

  /** Ends the thread after the checkpoint it is running, closing its connection first. */
  async close(): Promise<void> {
    this.#closed = true
    this.#again = false
    const worker = this.#worker
    if (!worker) return
    this.#worker = null
    const exited = once(worker, 'exit').then(() => true, () => true)
    // Until it has exited, the thread keeps the process alive: a caller awaiting close() gets its answer.
    worker.ref()
    worker.postMessage('close')
    const closedInTime = await Promise.race([exited, sleep(CLOSE_TIMEOUT_MS, false, { ref: false })])
    if (!closedInTime) await worker.terminate()
    this.#settle()
  }

  #thread(): Worker {
    if (this.#worker) return this.#worker
    const worker = new Worker(new URL('./sqlite-checkpoint-worker.ts', import.meta.url), { workerData: { path: this.#path } })
    // The thread never keeps the process alive: the store's close() ends it, and so does exit.
    worker.unref()
    worker.on('message', (answer: CheckpointAnswer) => {
      // A connection that cannot checkpoint (I/O error) is given up on: the store's own takes over.
      if (!answer.ok) this.#fail(new Error(answer.message))
      this.#answered()
    })
    worker.on('error', (err) => {
      this.#fail(err)
      this.#answered()
    })
    // An end that close() did not ask for (the thread ran out of memory, say) is a failure too:
    // a request waiting on it would otherwise never be answered, and no other sent.
    worker.on('exit', (code) => {
      if (this.#worker !== worker) return
      this.#fail(new Error(`the checkpoint thread ended unasked (exit code ${code})`))
      this.#answered()
    })
    this.#worker = worker
    return worker
  }

  #answered(): void {
    this.#running = false
    if (this.#again && !this.#failed && !this.#closed) {
      this.#again = false
      this.request()
      return
    }
    this.#settle()
  }

  #settle(): void {
    this.#running = false
    for (const resolve of this.#idle.splice(0)) resolve()
  }

  #fail(reason: unknown): void {
    if (this.#failed) return
    this.#failed = true
    try {
      this.#onFailure?.(reason instanceof Error ? reason : new Error(String(reason)))
    } catch {
      // A report that fails changes nothing: the store checkpoints itself from now on.
    }
    const worker = this.#worker
    this.#worker = null
    void worker?.terminate().catch(() => undefined)
  }
}
