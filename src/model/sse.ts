/** One server-sent event: its `event` field (null when it has none) and its `data` lines joined by "\n". */
export interface ServerSentEvent {
  event: string | null
  data: string
}

const LF = 10
const COLON = 58
const SPACE = 32

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

  /** Takes the next piece of the stream; returns the events it completes, in order. */
  decode(text: string): ServerSentEvent[] {
    const events: ServerSentEvent[] = []
    if (this.#skipLeadingLF) {
      this.#skipLeadingLF = false
      if (text.charCodeAt(0) === LF) text = text.slice(1)
    }
    const buffer = this.#rest === '' ? text : this.#rest + text
    let start = 0
    // Most servers end lines with \n alone: look for \r only when the text holds one.
    let cr = buffer.indexOf('\r')
    for (;;) {
      const lf = buffer.indexOf('\n', start)
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
    } else if (nameLength === 5 && buffer.startsWith('event', start)) {
      this.#event = value
    }
  }
}
