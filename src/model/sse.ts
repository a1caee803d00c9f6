/** One server-sent event: its `event` field (null when it has none) and its `data` lines joined by "\n". */
export interface ServerSentEvent {
  event: string | null
  data: string
}

const LF = 10
const COLON = 58
const SPACE = 32

/**
 * The longest event, or line not ended yet, that a model stream may send, in UTF-16 code units.
 * OpenAI's chunks are a few hundred bytes; a whole answer or a tool call's arguments in one chunk
 * is rarely a megabyte. A server that sends more without ending its event is not speaking SSE:
 * held on to, its line would take the process's memory, a gigabyte a minute.
 */
export const MAX_EVENT_CHARS = 8 * 1024 * 1024

/** A model stream's event (or line) went past MAX_EVENT_CHARS; the call fails as INVALID_RESPONSE. */
export class StreamEventTooLarge extends Error {
  constructor() {
    super(`The model sent a stream event longer than ${MAX_EVENT_CHARS / 1024 / 1024} MiB without ending it`)
    this.name = 'StreamEventTooLarge'
  }
}

/**
 * Splits a text stream into server-sent events the way the openai SDK's SSE decoder does: lines end
 * with \n, \r\n or \r (also when a \r\n pair is split between two reads), `:` starts a comment, a
 * blank line ends an event, `data:` lines are joined with "\n", `event:` names the event, other
 * fields are ignored, and one space after the colon is dropped. It scans the decoded text in place
 * instead of copying bytes between buffers; decoding UTF-8 (a character split between two reads)
 * is the caller's (dispatcher-fetch.ts joins it with a StringDecoder).
 */
export class ServerSentEventDecoder {
  /** The start of a line not yet ended. */
  #rest = ''
  #event: string | null = null
  #data: string | null = null
  /** The last text ended with \r: a \n opening the next one belongs to the same line end. */
  #skipLeadingLF = false

  /** Takes the next piece of the stream; returns the events it completes, in order. Throws StreamEventTooLarge. */
  decode(text: string): ServerSentEvent[] {
    const events: ServerSentEvent[] = []
    if (this.#skipLeadingLF) {
      this.#skipLeadingLF = false
      if (text.charCodeAt(0) === LF) text = text.slice(1)
    }
    // A line not ended yet holds no line end: the search starts in the new text, and a piece
    // without one only lengthens the line (searching the whole line again at every piece would
    // cost the square of its length).
    const from = this.#rest.length
    if (from > 0 && text.indexOf('\n') === -1 && text.indexOf('\r') === -1) {
      this.#rest += text
      if (this.#rest.length > MAX_EVENT_CHARS) throw new StreamEventTooLarge()
      return events
    }
    const buffer = from === 0 ? text : this.#rest + text
    let start = 0
    // Most servers end lines with \n alone: look for \r only when the text holds one.
    let cr = buffer.indexOf('\r', from)
    for (;;) {
      const lf = buffer.indexOf('\n', start === 0 ? from : start)
      let end = lf
      let next = lf + 1
      if (cr !== -1 && cr < start) cr = buffer.indexOf('\r', start)
      if (cr !== -1 && (lf === -1 || cr < lf)) {
        end = cr
        next = cr + 1
        if (next === buffer.length) this.#skipLeadingLF = true
        else if (buffer.charCodeAt(next) === LF) next++
      }
      if (end === -1) break
      this.#line(buffer, start, end, events)
      start = next
    }
    this.#rest = start === 0 ? buffer : buffer.slice(start)
    if (this.#rest.length > MAX_EVENT_CHARS) throw new StreamEventTooLarge()
    return events
  }

  /** The stream ended: its last line and event count even without the line end or blank line after them. */
  end(): ServerSentEvent[] {
    const events: ServerSentEvent[] = []
    if (this.#rest !== '') this.#line(this.#rest, 0, this.#rest.length, events)
    this.#rest = ''
    this.#line('', 0, 0, events)
    return events
  }

  #line(buffer: string, start: number, end: number, events: ServerSentEvent[]): void {
    if (start === end) {
      // As the SDK does: a blank line with nothing before it keeps even an empty `event:` for the next event.
      if (this.#data === null && !this.#event) return
      events.push({ event: this.#event, data: this.#data ?? '' })
      this.#event = null
      this.#data = null
      return
    }
    if (buffer.charCodeAt(start) === COLON) return
    let colon = buffer.indexOf(':', start)
    if (colon === -1 || colon >= end) colon = end
    let valueStart = colon + 1
    if (valueStart < end && buffer.charCodeAt(valueStart) === SPACE) valueStart++
    const value = valueStart < end ? buffer.slice(valueStart, end) : ''
    const nameLength = colon - start
    if (nameLength === 4 && buffer.startsWith('data', start)) {
      this.#data = this.#data === null ? value : `${this.#data}\n${value}`
      if (this.#data.length > MAX_EVENT_CHARS) throw new StreamEventTooLarge()
    } else if (nameLength === 5 && buffer.startsWith('event', start)) {
      this.#event = value
    }
  }
}
