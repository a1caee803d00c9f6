import { fork, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { fileURLToPath } from 'node:url'
import { getHeapSpaceStatistics } from 'node:v8'

/** A server running in a child process of the bench. */
export interface ChildServer {
  /** Its base URL on 127.0.0.1. */
  readonly url: string
  readonly pid: number
  /** Its memory now, after a full garbage collection when it was started with --expose-gc. */
  memory(): Promise<ChildMemory>
  /** Asks it to close and exit; kills it if it has not exited within 10 s. */
  close(): Promise<void>
}

/** A child's process.memoryUsage(), and whether a forced GC ran just before it was taken. */
export interface ChildMemory extends NodeJS.MemoryUsage {
  collected: boolean
  /**
   * Bytes of V8's young generation in RSS. V8 grows it with the allocation rate and keeps it
   * after a GC, so it is part of RSS without being held by anything.
   */
  youngGeneration: number
}

const children = new Set<ChildProcess>()
// A bench that crashes or is interrupted must not leave servers behind.
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL')
})

/**
 * Forks `bench/<entry>` with `args` and resolves with the URL it reports once it listens.
 * `execArgv` adds Node flags (e.g. --cpu-prof) to the child only; `env` adds variables.
 */
export async function startChild(entry: string, args: string[], execArgv: string[] = [], env: Record<string, string> = {}): Promise<ChildServer> {
  const child = fork(fileURLToPath(new URL(entry, import.meta.url)), args, {
    execArgv: ['--disable-warning=ExperimentalWarning', ...execArgv],
    env: { ...process.env, ...env },
    stdio: ['ignore', 'inherit', 'inherit', 'ipc']
  })
  children.add(child)
  child.once('exit', () => children.delete(child))
  const url = await new Promise<string>((resolve, reject) => {
    const onExit = (code: number | null) => reject(new Error(`bench child ${entry} exited with code ${String(code)} before listening`))
    child.once('exit', onExit)
    child.once('message', (message: { url: string }) => {
      child.off('exit', onExit)
      resolve(message.url)
    })
  })
  return {
    url,
    pid: child.pid ?? 0,
    async memory() {
      const answer = new Promise<ChildMemory>((resolve, reject) => {
        const onExit = () => reject(new Error(`bench child ${entry} exited before reporting its memory`))
        const onMessage = (message: { memory?: ChildMemory }) => {
          if (!message.memory) return
          child.off('message', onMessage)
          child.off('exit', onExit)
          resolve(message.memory)
        }
        child.on('message', onMessage)
        child.once('exit', onExit)
      })
      child.send('memory')
      return answer
    },
    async close() {
      if (child.exitCode !== null || child.signalCode !== null) return
      const exited = once(child, 'exit')
      child.send('close')
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000)
      await exited
      clearTimeout(timer)
    }
  }
}

/**
 * The child's side: reports `url` to the bench, answers 'memory' with its memory usage (after a
 * full GC when started with --expose-gc), and on 'close' (or when the bench goes away) runs
 * `close` and exits, so that --cpu-prof can write its profile.
 */
export function serveChild(url: string, close: () => Promise<void>): void {
  let closing = false
  const stop = () => {
    if (closing) return
    closing = true
    close().finally(() => process.exit(0))
  }
  process.on('message', (message) => {
    if (message === 'close') stop()
    if (message === 'memory') {
      const gc = (globalThis as { gc?: () => void }).gc
      gc?.()
      const youngGeneration = getHeapSpaceStatistics().find((space) => space.space_name === 'new_space')?.physical_space_size ?? 0
      process.send?.({ memory: { ...process.memoryUsage(), collected: gc !== undefined, youngGeneration } })
    }
  })
  process.on('disconnect', stop)
  process.send?.({ url })
}
