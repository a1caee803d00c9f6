import createClient, { type Client } from 'openapi-fetch'
import type { components, paths } from './schema.ts'

export type { components, paths }
export type Schemas = components['schemas']
export type Session = Schemas['Session']
export type Run = Schemas['Run']
export type Message = Schemas['Message']
export type ErrorEnvelope = Schemas['ErrorEnvelope']

declare const toolProgress: unique symbol

/**
 * A tool's own `tool:<kind>` progress event. Its type is branded so that comparing an event's
 * type with a fixed name (`e.type === 'tool:start'`) never leaves this member in the union;
 * reach it with isToolProgress(e).
 */
export type ToolProgressEvent = Omit<Schemas['ToolProgressEvent'], 'type'> & {
  type: `tool:${string}` & { readonly [toolProgress]: true }
}

/** One event of a session, narrowed by `type`: `if (e.type === 'done') e.data.reason`. */
export type AgentdEvent = Schemas['CoreEvent'] | ToolProgressEvent

const FIXED_TOOL_TYPES = new Set(['tool:start', 'tool:end', 'tool:error'])

/** True for a tool's own progress event (any `tool:<kind>` but start, end and error). */
export const isToolProgress = (event: AgentdEvent): event is ToolProgressEvent =>
  event.type.startsWith('tool:') && !FIXED_TOOL_TYPES.has(event.type)

export interface ClientOptions {
  /** Where agentd listens, e.g. http://127.0.0.1:3000 */
  baseUrl: string
  /** An API key from AGENTD_API_KEYS; leave out when the server has none. */
  apiKey?: string
  /** A fetch to use instead of the global one. */
  fetch?: typeof globalThis.fetch
}

export interface StreamOptions {
  sessionId: string
  /** Start after this seq (the stream replays every stored event after it, then goes live). */
  after?: number
  /** End after the next `done` event (also when `channels` or `types` leave `done` out: it is then not yielded). */
  until?: 'done'
  channels?: Array<'progress' | 'control' | 'monitor'>
  types?: string[]
  /**
   * Aborting it ends the iteration quietly (as a `break` would), whenever it comes: while the
   * stream opens, while events arrive, or while waiting to reconnect.
   */
  signal?: AbortSignal
  /**
   * Reconnections in a row without an event before giving up; default 5. A dropped connection
   * counts, and so does an answer agentd marks retryable (503 while a process drains or its store
   * is out of reach, 429), which is retried after its Retry-After.
   */
  maxReconnects?: number
  /** Silence (no bytes, not even agentd's 15 s ping) after which the connection is taken for dead and resumed; default 45000. */
  idleTimeoutMs?: number
}

/** A non-2xx answer, with agentd's error envelope. */
export class AgentdError extends Error {
  readonly status: number
  readonly envelope: ErrorEnvelope | null
  constructor(status: number, envelope: ErrorEnvelope | null) {
    super(envelope ? `${envelope.error.code}: ${envelope.error.message}` : `HTTP ${status}`)
    this.name = 'AgentdError'
    this.status = status
    this.envelope = envelope
  }
}

export interface AgentdClient {
  /**
   * Every JSON operation, typed from the OpenAPI document (openapi-fetch). Typed for the
   * application/json answers: the text/event-stream ones go through `events`.
   */
  api: Client<paths, 'application/json'>
  /** A session's events as they come, resuming after a dropped connection from the last one received. */
  events(options: StreamOptions): AsyncGenerator<AgentdEvent, void, undefined>
}

/** The client: `api` for the JSON operations, `events` for the SSE stream. */
export function createAgentdClient(options: ClientOptions): AgentdClient {
  const headers: Record<string, string> = options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {}
  const api = createClient<paths, 'application/json'>({ baseUrl: options.baseUrl, headers, ...(options.fetch ? { fetch: options.fetch } : {}) })
  return { api, events: (stream) => streamEvents(options, headers, stream) }
}

interface Frame {
  event?: string
  data?: string
  retry?: number
}

/**
 * Reads SSE frames as chunks arrive, per the WHATWG rules (CRLF, LF or CR line ends). It keeps
 * state across chunks, so a CRLF split between two chunks is one line end, and each byte is read once.
 */
class FrameParser {
  #line = ''
  #frame: Frame = {}
  // The last chunk ended in CR: a LF opening the next one belongs to it.
  #afterCr = false

  feed(text: string): Frame[] {
    const frames: Frame[] = []
    const lineEnd = /\r\n|\r|\n/g
    lineEnd.lastIndex = this.#afterCr && text.startsWith('\n') ? 1 : 0
    let start = lineEnd.lastIndex
    this.#afterCr = false
    for (let match = lineEnd.exec(text); match; match = lineEnd.exec(text)) {
      const line = this.#line + text.slice(start, match.index)
      this.#line = ''
      start = lineEnd.lastIndex
      if (line === '') {
        if (Object.keys(this.#frame).length > 0) frames.push(this.#frame)
        this.#frame = {}
      } else this.#field(line)
    }
    this.#afterCr = text.endsWith('\r')
    this.#line += text.slice(start)
    return frames
  }

  #field(line: string): void {
    if (line.startsWith(':')) return
    const colon = line.indexOf(':')
    const field = colon === -1 ? line : line.slice(0, colon)
    const value = colon === -1 ? '' : line.slice(colon + 1).replace(/^ /, '')
    const frame = this.#frame
    if (field === 'data') frame.data = frame.data === undefined ? value : `${frame.data}\n${value}`
    else if (field === 'event') frame.event = value
    else if (field === 'retry' && /^\d+$/.test(value)) frame.retry = Number(value)
  }
}

/** The body as agentd's error envelope; null for anything else (a proxy's or gateway's own error page or JSON). */
function envelopeOf(body: unknown): ErrorEnvelope | null {
  const error = (body as { error?: { code?: unknown } } | null)?.error
  return typeof error?.code === 'string' ? (body as ErrorEnvelope) : null
}

/** A Retry-After in seconds (the form agentd sends), capped at a minute; null when absent or not a number. */
function retryAfterMs(header: string | null): number | null {
  if (header === null || !/^\d+$/.test(header.trim())) return null
  return Math.min(Number(header) * 1000, 60_000)
}

/** reader.read(), or a rejection after `ms` without bytes: a half-open connection would otherwise wait forever. */
function readWithin<T>(reader: ReadableStreamDefaultReader<T>, ms: number): ReturnType<ReadableStreamDefaultReader<T>['read']> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const silence = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no bytes for ${ms} ms: the connection is taken for dead`)), ms)
  })
  return Promise.race([reader.read(), silence]).finally(() => clearTimeout(timer))
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    const wake = () => { clearTimeout(timer); signal?.removeEventListener('abort', wake); resolve() }
    const timer = setTimeout(wake, ms)
    signal?.addEventListener('abort', wake, { once: true })
  })

async function* streamEvents(client: ClientOptions, auth: Record<string, string>, options: StreamOptions): AsyncGenerator<AgentdEvent, void, undefined> {
  const fetch = client.fetch ?? globalThis.fetch
  const { channels, types } = options
  const wanted = (event: AgentdEvent) =>
    (!channels?.length || channels.includes(event.channel)) && (!types?.length || types.includes(event.type))
  // With until=done the client must see `done` to know the run ended, and to resume past it: a
  // filter that leaves it out asks the server for it too, and the client drops it here.
  const untilDone = options.until === 'done'
  const query = new URLSearchParams()
  if (options.until) query.set('until', options.until)
  if (channels?.length) query.set('channels', (untilDone && !channels.includes('progress') ? [...channels, 'progress'] : channels).join(','))
  if (types?.length) query.set('types', (untilDone && !types.includes('done') ? [...types, 'done'] : types).join(','))
  const url = `${client.baseUrl}/v1/sessions/${encodeURIComponent(options.sessionId)}/events${query.size ? `?${query}` : ''}`
  // Resume point: sent as Last-Event-ID, moved on as events arrive; the URL stays the same on every reconnect.
  let lastSeq = options.after
  let retryMs = 2000
  let failures = 0
  const maxReconnects = options.maxReconnects ?? 5

  for (;;) {
    // Asked to stop (also during the wait before reconnecting): the caller's own doing, not an error.
    if (options.signal?.aborted) return
    let response: Response
    try {
      response = await fetch(url, {
        headers: { ...auth, accept: 'text/event-stream', ...(lastSeq === undefined ? {} : { 'last-event-id': String(lastSeq) }) },
        ...(options.signal ? { signal: options.signal } : {})
      })
    } catch (err) {
      if (options.signal?.aborted) return
      if (++failures > maxReconnects) throw err
      await sleep(retryMs, options.signal)
      continue
    }
    if (!response.ok || !response.body) {
      if (options.signal?.aborted) return
      const envelope = envelopeOf(await response.json().catch(() => null))
      // "Try again later" (a draining process behind a load balancer, a store out of reach, a
      // rate limit) is a reconnection like any other; anything else is the caller's to handle.
      if (!envelope?.error.retryable || options.signal?.aborted || ++failures > maxReconnects) throw new AgentdError(response.status, envelope)
      await sleep(retryAfterMs(response.headers.get('retry-after')) ?? retryMs, options.signal)
      continue
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader()
    const parser = new FrameParser()
    let cause: unknown = null
    try {
      for (;;) {
        const { value, done } = await readWithin(reader, options.idleTimeoutMs ?? 45_000)
        if (done) break
        for (const frame of parser.feed(value)) {
          if (frame.retry !== undefined) retryMs = frame.retry
          // Frames without data (the opening retry, pings) are not events.
          if (frame.data === undefined || frame.event === undefined) continue
          // Frames read in the same chunk as the one the caller aborted at are not handed out.
          if (options.signal?.aborted) return
          const event = JSON.parse(frame.data) as AgentdEvent
          lastSeq = event.seq
          failures = 0
          if (wanted(event)) yield event
          if (untilDone && event.type === 'done') return
        }
      }
    } catch (err) {
      cause = err
    } finally {
      await reader.cancel().catch(() => {})
    }
    if (options.signal?.aborted) return
    if (++failures > maxReconnects) throw cause ?? new Error(`the event stream ended ${failures} times in a row without an event`)
    // The server ended the stream (shutdown) or the connection dropped: resume after the last event.
    await sleep(retryMs, options.signal)
  }
}
