import { setTimeout as delay } from 'node:timers/promises'

/** An event as the API sends it (SPEC 4); the CLI reads only what it prints. */
export interface AgentEvent {
  seq: number
  sessionId: string
  runId: string | null
  channel: string
  type: string
  at: string
  requestId: string | null
  data: Record<string, any>
}

/** The error envelope's body (SPEC 5.2). */
export interface ErrorBody {
  code: string
  message: string
  details?: unknown
  retryable?: boolean
  requestId?: string
}

/** A non-2xx answer (with its envelope), or no answer at all (status 0). */
export class ApiFailure extends Error {
  readonly status: number
  readonly body: ErrorBody

  constructor(status: number, body: ErrorBody) {
    super(body.message)
    this.name = 'ApiFailure'
    this.status = status
    this.body = body
  }
}

/**
 * How long a followed stream may stay silent before it is taken for dead and reopened: three of
 * the pings the server sends every 15 s (SPEC 4). A connection that stops carrying anything
 * without being closed (a NAT that forgot it, a server host that lost power) is never ended by
 * the system, and would otherwise be read for ever.
 */
const STREAM_IDLE_MS = 45_000

/** A failure that retrying the same stream later cannot fix. */
const isFinal = (err: unknown) =>
  err instanceof ApiFailure && ([400, 401, 403, 404].includes(err.status) || ['INVALID_RESPONSE', 'REDIRECTED'].includes(err.body.code))

/**
 * A success that is not agentd's answer: the URL leads to something else (port 3000 is also a web
 * app dev server's default, and one answers every path with its page), which would otherwise
 * surface as a TypeError about a missing field, or as an event stream with no event in it.
 */
function notAgentd(baseUrl: string, response: Response, wanted: string): ApiFailure {
  const type = response.headers.get('content-type')?.split(';')[0] || 'no content type'
  return new ApiFailure(response.status, { code: 'INVALID_RESPONSE', message: `${baseUrl} answered with ${type}, not the ${wanted} of agentd's API: is it an agentd server?` })
}

/**
 * A redirect (a proxy sending http to https) is not followed but reported with the address to
 * use: fetch would turn the POST that creates a session into a GET of the session list, and drop
 * the API key on the way to another origin.
 */
function redirected(baseUrl: string, response: Response, path: string): ApiFailure {
  const location = response.headers.get('location') ?? ''
  const target = location.endsWith(path) ? location.slice(0, -path.length) : location
  return new ApiFailure(response.status, { code: 'REDIRECTED', message: `${baseUrl} sends requests to ${target || 'another address'}: give that address to --url` })
}

const isRedirect = (response: Response) => response.status >= 300 && response.status < 400

/** The HTTP API of one agentd server, as any client sees it: the CLI uses nothing else. */
export class AgentdClient {
  readonly baseUrl: string
  readonly #key: string | undefined

  constructor(baseUrl: string, key?: string) {
    this.baseUrl = baseUrl.replace(/\/+$/, '')
    this.#key = key || undefined
  }

  #headers(extra: Record<string, string> = {}): Record<string, string> {
    return { ...(this.#key ? { authorization: `Bearer ${this.#key}` } : {}), ...extra }
  }

  /** Sends one JSON request; resolves with the parsed body (null for 204) or throws ApiFailure. */
  async request<T = any>(method: string, path: string, body?: unknown): Promise<T> {
    const headers = this.#headers({ accept: 'application/json', ...(body === undefined ? {} : { 'content-type': 'application/json' }) })
    let response: Response
    try {
      response = await fetch(this.baseUrl + path, { method, headers, redirect: 'manual', ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
    } catch (err) {
      throw unreachable(this.baseUrl, err)
    }
    if (isRedirect(response)) throw redirected(this.baseUrl, response, path)
    if (response.status === 204) return null as T
    const text = await response.text()
    let parsed: any = null
    try {
      parsed = text ? JSON.parse(text) : null
    } catch {
      // Not JSON (a proxy's page): reported below with its status.
    }
    if (!response.ok) throw new ApiFailure(response.status, parsed?.error ?? { code: `HTTP_${response.status}`, message: text.slice(0, 200) || response.statusText })
    if (typeof parsed !== 'object' || parsed === null) throw notAgentd(this.baseUrl, response, 'JSON')
    return parsed as T
  }

  /** Every stored event of a session after `after`, page by page. */
  async *storedEvents(sessionId: string, after = 0): AsyncGenerator<AgentEvent> {
    for (;;) {
      const page = await this.request<{ data: AgentEvent[]; nextAfter: number }>('GET', `/v1/sessions/${encodeURIComponent(sessionId)}/events?after=${after}&limit=1000`)
      yield* page.data
      if (page.data.length === 0) return
      after = page.nextAfter
    }
  }

  /**
   * A session's events live, from after `after`, for as long as the caller iterates. A dropped
   * connection (server restart, network) is reopened with `Last-Event-ID` set to the last seq
   * received, so no event is missed or repeated. So is a stream that stays silent for `idleMs`,
   * not even a ping coming through. `onReconnect` is told of each drop, once: not again at every
   * attempt while the server stays away, only after a stream has opened again.
   */
  async *follow(
    sessionId: string,
    options: { after?: number; signal?: AbortSignal; onReconnect?: (err: unknown) => void; retryMs?: number; idleMs?: number } = {}
  ): AsyncGenerator<AgentEvent> {
    let last = options.after ?? 0
    const retryMs = options.retryMs ?? 1000
    let told = false
    const opened = () => {
      told = false
    }
    for (;;) {
      let dropped: unknown = new Error('the server ended the stream')
      try {
        for await (const event of this.#stream(sessionId, last, options.idleMs ?? STREAM_IDLE_MS, opened, options.signal)) {
          if (event.seq <= last) continue
          last = event.seq
          yield event
        }
      } catch (err) {
        if (options.signal?.aborted) return
        if (isFinal(err)) throw err
        dropped = err
      }
      if (options.signal?.aborted) return
      if (!told) options.onReconnect?.(dropped)
      told = true
      await delay(retryMs, undefined, options.signal ? { signal: options.signal } : {}).catch(() => {})
    }
  }

  /** One connection's events; `opened` is called once the server has accepted the stream. */
  async *#stream(sessionId: string, after: number, idleMs: number, opened: () => void, signal?: AbortSignal): AsyncGenerator<AgentEvent> {
    // The request is aborted once the network kept it waiting idleMs, for the answer's head or the
    // next chunk; the time the caller takes over an event (a question to the user) does not count.
    const path = `/v1/sessions/${encodeURIComponent(sessionId)}/events`
    const idle = new AbortController()
    let silence: NodeJS.Timeout | undefined
    const wait = () => {
      silence = setTimeout(() => idle.abort(new Error(`nothing received for ${idleMs / 1000} s, not even a ping`)), idleMs)
    }
    const heard = () => clearTimeout(silence)
    try {
      wait()
      let response: Response
      try {
        response = await fetch(`${this.baseUrl}${path}`, {
          headers: this.#headers({ accept: 'text/event-stream', 'last-event-id': String(after) }),
          redirect: 'manual',
          signal: signal ? AbortSignal.any([signal, idle.signal]) : idle.signal
        })
      } catch (err) {
        if (idle.signal.aborted) throw idle.signal.reason
        throw unreachable(this.baseUrl, err)
      }
      heard()
      if (isRedirect(response)) throw redirected(this.baseUrl, response, path)
      if (!response.ok || !response.body) {
        const body = (await response.json().catch(() => null)) as { error?: ErrorBody } | null
        throw new ApiFailure(response.status, body?.error ?? { code: `HTTP_${response.status}`, message: response.statusText })
      }
      if (!response.headers.get('content-type')?.startsWith('text/event-stream')) {
        await response.body.cancel()
        throw notAgentd(this.baseUrl, response, 'event stream')
      }
      opened()
      let buffer = ''
      const decoder = new TextDecoder()
      wait()
      for await (const chunk of response.body) {
        heard()
        buffer += decoder.decode(chunk, { stream: true }).replaceAll('\r\n', '\n')
        let end: number
        while ((end = buffer.indexOf('\n\n')) >= 0) {
          const frame = buffer.slice(0, end)
          buffer = buffer.slice(end + 2)
          const data = frame.split('\n').filter((line) => line.startsWith('data:')).map((line) => line.slice(5).trimStart()).join('\n')
          if (data) yield JSON.parse(data) as AgentEvent
        }
        wait()
      }
    } finally {
      heard()
    }
  }
}

function unreachable(baseUrl: string, err: unknown): ApiFailure {
  const cause = (err as { cause?: { code?: string } }).cause?.code ?? (err instanceof Error ? err.message : String(err))
  return new ApiFailure(0, { code: 'UNREACHABLE', message: `cannot reach ${baseUrl} (${cause})`, retryable: true })
}
