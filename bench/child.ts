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
  /** Asks it a question it serves (serveChild's `answers`), with an argument, and resolves with its answer. */
  ask<T>(question: string, argument?: string): Promise<T>
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

/** What the bench sends a child besides 'close': a question, and what the child sends back. */
interface Question { ask: string; argument?: string | undefined; id: number }
interface Answer { id: number; answer?: unknown; error?: string }

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
  const waiting = new Map<number, { resolve: (value: unknown) => void; reject: (err: Error) => void }>()
  let asked = 0
  child.on('message', (message: Answer) => {
    const question = waiting.get(message.id)
    if (!question) return
    waiting.delete(message.id)
    if (message.error !== undefined) question.reject(new Error(message.error))
    else question.resolve(message.answer)
  })
  child.once('exit', () => {
    for (const question of waiting.values()) question.reject(new Error(`bench child ${entry} exited before it answered`))
    waiting.clear()
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
    ask<T>(question: string, argument?: string) {
      const id = ++asked
      return new Promise<T>((resolve, reject) => {
        waiting.set(id, { resolve: resolve as (value: unknown) => void, reject })
        child.send({ ask: question, argument, id } satisfies Question)
      })
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
 * full GC when started with --expose-gc) and the bench's questions from `answers`, and on 'close'
 * (or when the bench goes away) runs `close` and exits, so that --cpu-prof can write its profile.
 */
export function serveChild(url: string, close: () => Promise<void>, answers: Record<string, (argument?: string) => unknown> = {}): void {
  let closing = false
  const stop = () => {
    if (closing) return
    closing = true
    close().finally(() => process.exit(0))
  }
  process.on('message', (message: 'close' | 'memory' | Question) => {
    if (message === 'close') return stop()
    if (message === 'memory') {
      const gc = (globalThis as { gc?: () => void }).gc
      gc?.()
      const youngGeneration = getHeapSpaceStatistics().find((space) => space.space_name === 'new_space')?.physical_space_size ?? 0
      process.send?.({ memory: { ...process.memoryUsage(), collected: gc !== undefined, youngGeneration } })
    }
    if (typeof message === 'string') return
    const answer = answers[message.ask]
    const reply = (sent: Answer) => process.send?.(sent)
    if (!answer) return reply({ id: message.id, error: `no answer to ${message.ask}` })
    Promise.resolve(message.argument).then(answer).then(
      (value) => reply({ id: message.id, answer: value }),
      (err: unknown) => reply({ id: message.id, error: err instanceof Error ? err.message : String(err) })
    )
  })
  process.on('disconnect', stop)
  process.send?.({ url })
}
