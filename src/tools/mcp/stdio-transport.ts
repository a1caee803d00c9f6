import { spawn, type ChildProcess } from 'node:child_process'
import { existsSync } from 'node:fs'
import { getDefaultEnvironment } from '@modelcontextprotocol/sdk/client/stdio.js'
import { ReadBuffer, serializeMessage } from '@modelcontextprotocol/sdk/shared/stdio.js'
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js'
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js'
import type { McpStdioServerConfig } from './config.ts'

export interface ProcessGroupStdioOptions {
  /** The largest JSON-RPC line accepted from the server; a longer one stops the server. */
  maxMessageBytes: number
  /** After SIGTERM to the group, how long before SIGKILL. */
  killGraceMs: number
  /** Each line the server writes to stderr (already cut to a sane length). */
  onStderr: (line: string) => void
}

/** Why the transport closed, when agentd closed it for a reason of its own. */
export type StdioCloseReason = 'message_too_large' | 'stopped'

/**
 * The MCP stdio transport with the server in its own process group. The SDK's
 * StdioClientTransport spawns the server in agentd's group and kills only that one process, so
 * whatever the server started (npx → node, a shell → its children) would outlive a restart or
 * shutdown; here the whole group is signalled, SIGTERM first, then SIGKILL.
 */
export class ProcessGroupStdioTransport implements Transport {
  onclose?: () => void
  onerror?: (error: Error) => void
  onmessage?: (message: JSONRPCMessage) => void

  /** Set when agentd ended the server itself; read by the connection to classify failed calls. */
  closeReason: StdioCloseReason | undefined
  /** How the process ended: exit code or signal. */
  exit: { code: number | null; signal: NodeJS.Signals | null } | undefined

  readonly #config: McpStdioServerConfig
  readonly #options: ProcessGroupStdioOptions
  readonly #buffer: ReadBuffer
  #child: ChildProcess | undefined
  #stderrTail = ''
  #closed = false

  constructor(config: McpStdioServerConfig, options: ProcessGroupStdioOptions) {
    this.#config = config
    this.#options = options
    this.#buffer = new ReadBuffer({ maxBufferSize: options.maxMessageBytes })
  }


  async start(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      const child = spawn(this.#config.command, this.#config.args, {
        env: { ...getDefaultEnvironment(), ...this.#config.env },
        cwd: this.#config.cwd,
        stdio: ['pipe', 'pipe', 'pipe'],
        detached: true,
        windowsHide: true
      })
      this.#child = child
      child.once('error', (err: NodeJS.ErrnoException) => {
        // spawn() reports a missing cwd as its command not found (spawn node ENOENT).
        const cwd = this.#config.cwd
        reject(err.code === 'ENOENT' && cwd !== undefined && !existsSync(cwd) ? new Error(`its cwd ${cwd} does not exist`, { cause: err }) : err)
        this.onerror?.(err)
        this.#finish()
      })
      child.once('spawn', () => resolve())
      child.once('exit', (code, signal) => {
        this.exit = { code, signal }
        // A server that died by itself may leave what it started in its group: nothing will talk
        // to those any more, and a restart would add more of them.
        if (child.pid !== undefined) signalGroup(child.pid, 'SIGKILL')
        // Its last stderr lines (why it died) may still be in the pipe; a child it left behind
        // can hold the pipe open, so this waits briefly, not for the pipe to close.
        const stderr = child.stderr
        if (!stderr || stderr.readableEnded) return this.#finish()
        const timer = setTimeout(() => this.#finish(), 100)
        stderr.once('end', () => {
          clearTimeout(timer)
          this.#finish()
        })
      })
      child.stdin?.on('error', (err) => this.onerror?.(err))
      child.stdout?.on('data', (chunk: Buffer) => this.#read(chunk))
      child.stdout?.on('error', (err) => this.onerror?.(err))
      child.stderr?.on('data', (chunk: Buffer) => this.#readStderr(chunk))
    })
  }

  #read(chunk: Buffer): void {
    try {
      this.#buffer.append(chunk)
    } catch {
      this.closeReason ??= 'message_too_large'
      this.onerror?.(new Error(`the server sent a message over ${this.#options.maxMessageBytes} bytes; it was stopped`))
      void this.close()
      return
    }
    for (;;) {
      try {
        const message = this.#buffer.readMessage()
        if (message === null) break
        this.onmessage?.(message)
      } catch (err) {
        // A line that is not JSON-RPC (a stray print) is reported and skipped, as the SDK does.
        this.onerror?.(err as Error)
      }
    }
  }

  #readStderr(chunk: Buffer): void {
    // Lines are passed on one by one; an endless line without a newline is cut, never buffered whole.
    const text = this.#stderrTail + chunk.toString('utf8')
    const lines = text.split('\n')
    this.#stderrTail = (lines.pop() ?? '').slice(-2000)
    for (const line of lines) if (line.trim() !== '') this.#options.onStderr(line.slice(0, 2000))
  }

  async send(message: JSONRPCMessage): Promise<void> {
    const stdin = this.#child?.stdin
    if (!stdin || this.#closed) throw new Error('the server process is not running')
    await new Promise<void>((resolve) => {
      if (stdin.write(serializeMessage(message))) resolve()
      else stdin.once('drain', resolve)
    })
  }

  /** Stops the server's whole process group: SIGTERM, then SIGKILL after the grace period. */
  async close(): Promise<void> {
    this.closeReason ??= 'stopped'
    const child = this.#child
    if (!child || this.exit || child.pid === undefined) {
      this.#finish()
      return
    }
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()))
    child.stdin?.end()
    signalGroup(child.pid, 'SIGTERM')
    const timer = setTimeout(() => signalGroup(child.pid as number, 'SIGKILL'), this.#options.killGraceMs)
    // The exit handler (start) kills what the leader left in the group.
    await exited
    clearTimeout(timer)
  }

  #finish(): void {
    if (this.#closed) return
    this.#closed = true
    this.#buffer.clear()
    this.onclose?.()
  }
}

function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal)
  } catch {
    // ESRCH: the group is already gone.
  }
}
