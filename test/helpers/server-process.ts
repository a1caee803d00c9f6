import { spawn, type ChildProcess } from 'node:child_process'
import { createInterface } from 'node:readline'

const serverPath = new URL('../../src/server.ts', import.meta.url).pathname

export interface ServerProcess {
  url: string
  child: ChildProcess
  /** Every stdout line (pino JSON) so far. */
  lines: string[]
  /** Everything written to stderr so far (a crash's stack lands here). */
  stderr(): string
  /** Resolves with the exit code (or signal) when the process ends. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
}

/** Starts the real server (src/server.ts) as a child process on an ephemeral port; resolves once it listens. */
export function startServer(env: Record<string, string>, timeoutMs = 15_000): Promise<ServerProcess> {
  const child = spawn(process.execPath, [serverPath], {
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', HOST: '127.0.0.1', PORT: '0', LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  const lines: string[] = []
  let stderr = ''
  child.stderr?.on('data', (chunk) => (stderr += chunk))
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })))
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`server did not start: ${stderr}`))
    }, timeoutMs)
    void exited.then(({ code }) => {
      clearTimeout(timer)
      reject(new Error(`server exited with ${code} before listening: ${stderr}`))
    })
    createInterface({ input: child.stdout! }).on('line', (line) => {
      lines.push(line)
      const match = /Server listening at (http:\/\/127\.0\.0\.1:\d+)/.exec(line)
      if (match) {
        clearTimeout(timer)
        resolve({ url: match[1] as string, child, lines, exited, stderr: () => stderr })
      }
    })
  })
}

/** Polls `check` every 10 ms until it returns a value, or fails after timeoutMs. */
export async function until<T>(check: () => Promise<T | undefined | null | false>, timeoutMs = 5000, what = 'condition'): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await check()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 10))
  }
}
