import { ErrorCode, McpError } from '@modelcontextprotocol/sdk/types.js'

/**
 * A Streamable HTTP server answers a request with an event stream that should carry the
 * request's answer. One that ends the stream without it (a worker that died behind a proxy that
 * ends the response cleanly) and without an event ID to resume from leaves the SDK's request
 * waiting for good: it reports nothing, and a tool call waited for its timeout, to fail as
 * TIMEOUT. Such a stream gets a JSON-RPC error answer appended at its end (ConnectionClosed,
 * which classifyCallFailure makes connection_lost), so that the request fails at once.
 *
 * `init` is the request the SDK sent; anything but a POST of one JSON-RPC request answered
 * with an event stream is given back as it came.
 */
export function withMissingAnswer(init: RequestInit | undefined, response: Response): Response {
  const id = requestId(init)
  if (id === undefined || !response.body || !(response.headers.get('content-type') ?? '').startsWith('text/event-stream')) return response
  const watch = new AnswerWatch(id)
  const decoder = new TextDecoder()
  const body = response.body.pipeThrough(new TransformStream<Uint8Array, Uint8Array>({
    transform(chunk, controller) {
      controller.enqueue(chunk)
      if (!watch.settled) watch.push(decoder.decode(chunk, { stream: true }))
    },
    flush(controller) {
      watch.end()
      if (watch.settled) return
      const error = { code: ErrorCode.ConnectionClosed, message: 'the server ended its answer to the request without a result', data: { reason: ANSWER_ENDED } }
      controller.enqueue(new TextEncoder().encode(`\n\ndata: ${JSON.stringify({ jsonrpc: '2.0', id, error })}\n\n`))
    }
  }))
  return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers })
}

const ANSWER_ENDED = 'agentd_answer_ended'

/** The request's failure is the error withMissingAnswer appended: the answer ended, which says nothing yet of the server. */
export function answerEnded(err: unknown): boolean {
  return err instanceof McpError && err.code === ErrorCode.ConnectionClosed &&
    typeof err.data === 'object' && err.data !== null && (err.data as { reason?: unknown }).reason === ANSWER_ENDED
}

/** The ID of the JSON-RPC request a POST carries (the SDK sends one message as JSON text); undefined for a notification, a response or a batch. */
function requestId(init: RequestInit | undefined): string | number | undefined {
  if (init?.method !== 'POST' || typeof init.body !== 'string') return undefined
  try {
    const message = JSON.parse(init.body) as { id?: unknown; method?: unknown }
    const { id, method } = message ?? {}
    return typeof method === 'string' && (typeof id === 'string' || typeof id === 'number') ? id : undefined
  } catch {
    return undefined
  }
}

/**
 * Reads the event stream's lines as they pass, for two things: the answer to the request (an
 * event whose data is a JSON-RPC response with its ID), and an `id:` field, after which the SDK
 * resumes a stream that ends by asking the server for the rest (Last-Event-ID). Either settles
 * it. A line not ended yet is only appended to until its line end comes, so a long one (a large
 * result) is scanned once, not again at every piece.
 */
class AnswerWatch {
  readonly #id: string | number
  #rest = ''
  #data: string[] = []
  settled = false

  constructor(id: string | number) {
    this.#id = id
  }

  push(text: string): void {
    if (!text.includes('\n')) {
      this.#rest += text
      return
    }
    const buffer = this.#rest + text
    let start = 0
    for (let end = buffer.indexOf('\n'); end !== -1 && !this.settled; end = buffer.indexOf('\n', start)) {
      this.#line(buffer.slice(start, buffer.charCodeAt(end - 1) === CR ? end - 1 : end))
      start = end + 1
    }
    this.#rest = buffer.slice(start)
  }

  end(): void {
    if (this.#rest !== '') this.#line(this.#rest)
    this.#line('')
  }

  #line(line: string): void {
    if (line === '') {
      if (this.#data.length > 0) this.#event(this.#data.join('\n'))
      this.#data = []
    } else if (line.startsWith('data:')) {
      this.#data.push(line.slice(line.startsWith('data: ') ? 6 : 5))
    } else if (line.startsWith('id:') && line.slice(3).trim() !== '') {
      this.settled = true
    }
  }

  #event(data: string): void {
    try {
      const message = JSON.parse(data) as { id?: unknown; result?: unknown; error?: unknown } | null
      if (message?.id === this.#id && (message.result !== undefined || message.error !== undefined)) this.settled = true
    } catch {
      // Not JSON: the SDK reports it; it is not the answer.
    }
  }
}

const CR = 13
