import { spawn, type ChildProcess } from 'node:child_process'
import { existsSync } from 'node:fs'
import { getDefaultEnvironment } from '@modelcontextprotocol/sdk/client/stdio.js'
import { deserializeMessage, serializeMessage } from '@modelcontextprotocol/sdk/shared/stdio.js'
import type { Transport } from '@modelcontextprotocol/sdk/shared/transport.js'
import { ErrorCode, type JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js'
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
  /** The start of a line whose newline has not come yet. */
  #partial: Buffer[] = []
  #partialBytes = 0
  #child: ChildProcess | undefined
  #stderrTail = ''
  #closed = false

  constructor(config: McpStdioServerConfig, options: ProcessGroupStdioOptions) {
    this.#config = config
    this.#options = options
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

  /**
   * Splits stdout into JSON-RPC lines. The start of an unfinished line is kept as a list of
   * chunks and joined once, when its newline arrives: the SDK's ReadBuffer joins and searches
   * the whole buffer again on every 64 KiB chunk, seconds of the main thread for one 16 MiB line.
   */
  #read(chunk: Buffer): void {
    let start = 0
    for (let end = chunk.indexOf(NEWLINE); end !== -1 && !this.#closed; end = chunk.indexOf(NEWLINE, start)) {
      const tail = chunk.subarray(start, end)
      const line = this.#partial.length === 0 ? tail : Buffer.concat([...this.#partial, tail])
      this.#partial = []
      this.#partialBytes = 0
      start = end + 1
      if (line.length > this.#options.maxMessageBytes) return this.#tooLarge()
      this.#deliver(line)
    }
    if (start === chunk.length || this.#closed) return
    this.#partialBytes += chunk.length - start
    if (this.#partialBytes > this.#options.maxMessageBytes) return this.#tooLarge()
    this.#partial.push(chunk.subarray(start))
  }

  #deliver(line: Buffer): void {
    const text = line.toString('utf8').replace(/\r$/, '')
    let message: JSONRPCMessage
    try {
      message = deserializeMessage(text)
    } catch (err) {
      // A line that is not JSON-RPC (a stray print) is reported and skipped, as the SDK does;
      // but a malformed answer to a request ends that request now, not at its timeout.
      this.onerror?.(err as Error)
      const id = malformedAnswerId(text)
      if (id !== undefined) {
        this.onmessage?.({ jsonrpc: '2.0', id, error: { code: ErrorCode.InternalError, message: 'the server sent an answer that is not valid JSON-RPC' } })
      }
      return
    }
    this.onmessage?.(message)
  }

  #tooLarge(): void {
    this.#partial = []
    this.#partialBytes = 0
    this.closeReason ??= 'message_too_large'
    this.onerror?.(new Error(`the server sent a message over ${this.#options.maxMessageBytes} bytes; it was stopped`))
    void this.close()
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
    this.#partial = []
    this.onclose?.()
  }
}

const NEWLINE = 0x0a

/** The id of a line that is meant as a JSON-RPC answer (an id, a result or an error, no method) but is not a valid one. */
function malformedAnswerId(text: string): string | number | undefined {
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return undefined
  }
  if (typeof value !== 'object' || value === null || 'method' in value || !('result' in value || 'error' in value)) return undefined
  const id = (value as { id?: unknown }).id
  return typeof id === 'string' || typeof id === 'number' ? id : undefined
}

function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal)
  } catch {
    // ESRCH: the group is already gone.
  }
}
