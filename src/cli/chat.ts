import { createInterface } from 'node:readline'
import { ApiFailure, type AgentdClient } from './client.ts'
import { classified, failureText, paint, printable, short } from './format.ts'

/** Lines of stdin, one at a time, whether a person types them or a pipe holds them all. */
class LineReader {
  readonly #queued: string[] = []
  readonly #waiting: Array<(line: string | null) => void> = []
  #ended = false

  constructor(input: NodeJS.ReadableStream) {
    const lines = createInterface({ input, terminal: false })
    lines.on('line', (line) => {
      const waiter = this.#waiting.shift()
      if (waiter) waiter(line)
      else this.#queued.push(line)
    })
    lines.on('close', () => {
      this.#ended = true
      for (const waiter of this.#waiting.splice(0)) waiter(null)
    })
  }

  /**
   * The next line, or null once stdin has ended or `signal` aborts. An aborted wait gives up its
   * place, so the line typed next goes to whoever asks next, not to a question that is gone.
   * `fresh` waits for a line that comes after the call, leaving those queued for later.
   */
  next(signal?: AbortSignal, fresh = false): Promise<string | null> {
    const line = fresh ? undefined : this.#queued.shift()
    if (line !== undefined) return Promise.resolve(line)
    if (this.#ended || signal?.aborted) return Promise.resolve(null)
    return new Promise((resolve) => {
      const waiter = (line: string | null) => {
        signal?.removeEventListener('abort', abandon)
        resolve(line)
      }
      const abandon = () => {
        this.#waiting.splice(this.#waiting.indexOf(waiter), 1)
        resolve(null)
      }
      signal?.addEventListener('abort', abandon, { once: true })
      this.#waiting.push(waiter)
    })
  }
}

const SPINNER = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏']

/** A spinner on stderr while tools run; a terminal only (a pipe gets no animation). */
class Spinner {
  #timer: NodeJS.Timeout | undefined

  start(label: string): void {
    this.stop()
    if (!process.stderr.isTTY) return
    let frame = 0
    this.#timer = setInterval(() => process.stderr.write(`\r${SPINNER[frame++ % SPINNER.length]} ${label}`), 80)
  }

  stop(): void {
    if (this.#timer === undefined) return
    clearInterval(this.#timer)
    this.#timer = undefined
    process.stderr.write('\r\x1b[K')
  }
}

export interface ChatOptions {
  sessionId?: string
  /** Tools of a new session (names); omitted = the server's defaults. */
  tools?: string[]
  /** Approval of a new session: every call, none, or the named tools. */
  approval?: { mode: 'auto' | 'always' } | { mode: 'tools'; tools: string[] }
  onBusy?: 'reject' | 'enqueue' | 'interrupt'
}

/**
 * `agentd chat`: each line of stdin is a message; the answer streams to stdout, tool calls and
 * classified errors print as one line each, approvals and client tools are asked on stdin.
 * Resolves with the exit code.
 */
export async function chat(client: AgentdClient, options: ChatOptions): Promise<number> {
  const out = process.stdout
  const dim = (text: string) => paint('dim', text)
  const say = (text: string) => out.write(`${text}\n`)
  const interactive = process.stdin.isTTY === true
  const lines = new LineReader(process.stdin)
  const spinner = new Spinner()

  let sessionId = options.sessionId
  try {
    if (sessionId) await client.request('GET', `/v1/sessions/${encodeURIComponent(sessionId)}`)
    else {
      const body: Record<string, unknown> = {}
      if (options.tools) body.tools = options.tools
      if (options.approval) body.approval = options.approval
      sessionId = (await client.request<{ id: string }>('POST', '/v1/sessions', body)).id
    }
  } catch (err) {
    process.stderr.write(`agentd: ${failureText(err)}\n`)
    return 1
  }
  const path = `/v1/sessions/${encodeURIComponent(sessionId)}`
  say(dim(`session ${sessionId} · ${client.baseUrl}${interactive ? ' · Ctrl+C interrupts a run, Ctrl+D quits' : ''}`))

  /** Whether the cursor is after text on its line: the model's answer, or a question. */
  let midLine = false
  /** A CR that ended the last chunk of text: the next one may start with the LF of its CRLF. */
  let heldCr = false
  const endLine = () => {
    if (heldCr) out.write(printable('\r'))
    heldCr = false
    if (midLine) out.write('\n')
    midLine = false
  }

  let active: AbortController | undefined
  /** Aborted by the first Ctrl+C of a run: takes back a question the run was waiting on. */
  let interrupting = new AbortController()
  process.on('SIGINT', () => {
    // The first Ctrl+C of a run interrupts it; another one (or one between runs) quits.
    if (!active || interrupting.signal.aborted) process.exit(130)
    interrupting.abort()
    spinner.stop()
    endLine()
    say(dim('(interrupting; Ctrl+C again quits)'))
    client.request('POST', `${path}/interrupt`).catch((err: unknown) => say(paint('red', failureText(err))))
  })

  /**
   * Asks a question on stdout and reads the answer from stdin (null at end of input, or once the
   * run is being interrupted: the interrupt settles the call, and an answer would be refused).
   */
  const ask = async (question: string): Promise<string | null> => {
    out.write(paint('yellow', question))
    midLine = true
    // On a terminal the answer is a line typed after the question: one typed ahead while the
    // answer streamed is the next message, not a "no" to a question its writer never saw.
    // Piped, the lines are the script's answers in order.
    const answer = await lines.next(interrupting.signal, interactive)
    // A terminal echoed the answer and its Enter; a pipe's answer is shown here.
    if (!interactive && !interrupting.signal.aborted) out.write(`${answer ?? ''}\n`)
    midLine = false
    return answer
  }

  /** Streams one run's events until its `done`; the stream resumes by itself after a drop. */
  async function follow(runId: string, after: number): Promise<void> {
    let tokens = 0
    active = new AbortController()
    const stream = client.follow(sessionId as string, {
      after,
      signal: active.signal,
      onReconnect: (err) => {
        spinner.stop()
        endLine()
        process.stderr.write(paint('yellow', `(connection lost: ${failureText(err)}; resuming)\n`, process.stderr))
      }
    })
    for await (const event of stream) {
      if (event.runId !== runId) continue
      const { data } = event
      const call = data.call as { id: string; name: string; input: unknown; state: string; durationMs?: number } | undefined
      switch (event.type) {
        case 'text_chunk': {
          spinner.stop()
          // printable() makes a CRLF a newline; one split over two chunks is one too.
          const text: string = `${heldCr ? '\r' : ''}${data.delta}`
          heldCr = text.endsWith('\r')
          out.write(printable(heldCr ? text.slice(0, -1) : text))
          midLine = true
          break
        }
        case 'think_chunk_start':
          endLine()
          say(dim('(thinking…)'))
          break
        case 'tool:start':
          endLine()
          say(`${paint('cyan', '⚙')} ${printable(call?.name ?? '')} ${dim(short(call?.input))}`)
          spinner.start(`running ${printable(call?.name ?? '')}`)
          break
        case 'permission_required': {
          spinner.stop()
          const answer = await ask(`Allow ${printable(call?.name ?? '')} ${short(call?.input)}? [y/n] `)
          if (interrupting.signal.aborted) break
          const decision = /^\s*y(es)?\s*$/i.test(answer ?? '') ? 'allow' : 'deny'
          if (answer === null) say(dim('(no input left: denied)'))
          await client.request('POST', `${path}/approvals/${encodeURIComponent(call?.id ?? '')}`, { decision })
            .catch((err: unknown) => say(paint('red', failureText(err))))
          break
        }
        case 'tool_result_required': {
          spinner.stop()
          const answer = (await ask(`Result for ${printable(call?.name ?? '')} ${short(call?.input)} (JSON or text; "error: …" fails it): `)) ?? ''
          if (interrupting.signal.aborted) break
          const failed = /^error:\s*/i.exec(answer)
          let body: { output: unknown } | { error: string }
          if (failed) body = { error: answer.slice(failed[0].length) || 'failed' }
          else {
            try {
              body = { output: JSON.parse(answer) }
            } catch {
              body = { output: answer }
            }
          }
          await client.request('POST', `${path}/tool-results/${encodeURIComponent(call?.id ?? '')}`, body)
            .catch((err: unknown) => say(paint('red', failureText(err))))
          break
        }
        case 'tool:error':
          spinner.stop()
          say(`${paint('red', '✗')} ${printable(call?.name ?? '')} ${classified(data.error)}`)
          for (const advice of data.error.recommendations ?? []) say(dim(`  → ${printable(advice)}`))
          break
        case 'tool:end':
          spinner.stop()
          if (call?.state === 'completed') say(`${paint('green', '✓')} ${printable(call.name)} ${dim(`${call.durationMs ?? 0} ms`)}`)
          else if (call?.state === 'denied') say(`${paint('red', '✗')} ${printable(call.name)} denied`)
          break
        case 'model_retry':
          endLine()
          say(paint('yellow', `↻ model retry ${data.attempt} in ${data.delayMs} ms (${data.code}${data.status ? `, HTTP ${data.status}` : ''})`))
          break
        case 'error':
          if (data.phase === 'tool') break
          endLine()
          say(paint('red', `✗ ${data.severity} in ${data.phase}: ${data.detail ? classified(data.detail) : printable(String(data.message))}`))
          for (const advice of data.detail?.recommendations ?? []) say(dim(`  → ${printable(advice)}`))
          break
        case 'token_usage':
          tokens += data.totalTokens ?? 0
          break
        case 'done':
          spinner.stop()
          endLine()
          say(dim(`— ${data.reason} · ${tokens} tokens · ${event.requestId ?? runId}`))
          active.abort()
          return
      }
    }
  }

  for (;;) {
    if (interactive) out.write(paint('bold', 'you> '))
    const content = await lines.next()
    if (content === null) {
      // Ctrl+D at the prompt: the shell's prompt comes next, on a line of its own.
      if (interactive) out.write('\n')
      break
    }
    if (content.trim() === '') continue
    if (!interactive) say(paint('bold', `you> ${content}`))
    try {
      const { lastSeq } = await client.request<{ lastSeq: number }>('GET', path)
      const sent = await client.request<{ run: { id: string } }>('POST', `${path}/messages`, { content, onBusy: options.onBusy ?? 'reject' })
      await follow(sent.run.id, lastSeq)
    } catch (err) {
      spinner.stop()
      // A session deleted meanwhile (by another client) refuses every later line: the chat ends.
      if (err instanceof ApiFailure && err.body.code === 'SESSION_NOT_FOUND') {
        process.stderr.write(`agentd: ${failureText(err)}\n`)
        return 1
      }
      say(paint('red', failureText(err)))
    } finally {
      active = undefined
      interrupting = new AbortController()
    }
  }
  return 0
}
