import { spawn } from 'node:child_process'

/** The package's bin, run as a user runs it. */
export const BIN = new URL('../../bin/agentd.js', import.meta.url).pathname

export interface CliRun {
  code: number | null
  stdout: string
  stderr: string
}

/** Runs `agentd <args>` as a child process, with `input` as its whole stdin; killed after `timeoutMs` if given. */
export function agentd(args: string[], options: { env?: Record<string, string>; input?: string; node?: string; timeoutMs?: number } = {}): Promise<CliRun> {
  const child = spawn(options.node ?? process.execPath, [BIN, ...args], {
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '', ...options.env },
    stdio: ['pipe', 'pipe', 'pipe']
  })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk) => (stdout += chunk))
  child.stderr.on('data', (chunk) => (stderr += chunk))
  child.stdin.end(options.input ?? '')
  const timer = options.timeoutMs === undefined ? undefined : setTimeout(() => child.kill('SIGKILL'), options.timeoutMs)
  return new Promise((resolve) => child.on('close', (code) => {
    clearTimeout(timer)
    resolve({ code, stdout, stderr })
  }))
}
