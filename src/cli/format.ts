import { styleText } from 'node:util'
import { ApiFailure, type AgentEvent } from './client.ts'

type Style = Parameters<typeof styleText>[0]

/** Colours on a terminal, plain text in a pipe or with NO_COLOR (styleText checks the stream). */
export const paint = (style: Style, text: string, stream: NodeJS.WriteStream = process.stdout) => styleText(style, text, { stream })

/**
 * Characters a terminal acts on instead of showing: C0 controls but tab and newline (ESC starts
 * escape sequences, CR rewrites a line), DEL, C1 controls, and the bidirectional overrides and
 * isolates that reorder what is shown.
 */
const UNPRINTABLE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g

/**
 * Text from the service as a terminal may print it: every character of UNPRINTABLE shown as its
 * `\uXXXX` escape (CRLF is a newline). What the CLI prints is the model's text, tool inputs and
 * error messages, which a model, a page it fetched or a hostile tool can fill with escape
 * sequences that would rewrite an approval question, hide text or set the clipboard (OSC 52).
 */
export function printable(text: string): string {
  return text.replaceAll('\r\n', '\n').replace(UNPRINTABLE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)
}

/** Text from the service on one printable line: line breaks and what surrounds them become one space. */
export const oneLine = (text: string) => printable(text).replaceAll(/\s*\n\s*/g, ' ')

/** One printable line of at most `max` characters. */
export function short(value: unknown, max = 120): string {
  const text = oneLine(typeof value === 'string' ? value : JSON.stringify(value) ?? String(value))
  if (text.length <= max) return text
  // Not between the two halves of a surrogate pair (an emoji): a lone half prints as "�".
  const cut = text.slice(0, max - 1)
  return `${/[\ud800-\udbff]$/.test(cut) ? cut.slice(0, -1) : cut}…`
}

/** The parts of a classified error (SPEC 5.1) a person acts on, on one printable line. */
export function classified(error: { errorType: string; code: string; message: string; retryable: boolean }): string {
  return printable(`${error.errorType} ${error.code} (${error.retryable ? 'retryable' : 'not retryable'}): ${error.message}`)
}

/** What an event says, in a few words after its type (the `events` command's line). */
export function summary(event: AgentEvent): string {
  const { data } = event
  const call = data.call as { name: string; input: unknown; state: string; durationMs?: number | null } | undefined
  switch (event.type) {
    case 'text_chunk':
    case 'think_chunk':
      return JSON.stringify(data.delta ?? '')
    case 'text_chunk_end':
    case 'think_chunk_end':
      return short(data.text ?? '')
    case 'tool:start':
    case 'permission_required':
    case 'tool_result_required':
      return `${call?.name} ${short(call?.input)}`
    case 'tool:end':
    case 'tool_executed':
      return `${call?.name} ${call?.state}${typeof call?.durationMs === 'number' ? ` ${call.durationMs} ms` : ''}`
    case 'tool:error':
      return `${call?.name} ${classified(data.error)}`
    case 'permission_decided':
      return `${data.callId} ${data.decision}${data.note ? ` (${data.note})` : ''}`
    case 'state_changed':
      return `${data.from} → ${data.to}`
    case 'token_usage':
      return `${data.inputTokens} in, ${data.outputTokens} out, ${data.totalTokens} total`
    case 'model_retry':
      return `attempt ${data.attempt} in ${data.delayMs} ms (${data.code}${data.status ? `, HTTP ${data.status}` : ''})`
    case 'error':
      return `${data.severity} in ${data.phase}: ${data.detail ? classified(data.detail) : data.message}`
    case 'done':
      return `${data.reason} (${event.runId})`
    default:
      return short(data)
  }
}

/**
 * `#seq  time  type  summary`: one printable event per line. A message of several lines (a
 * client's, a webhook's or an MCP server's error) is joined into one.
 */
export function eventLine(event: AgentEvent): string {
  const time = event.at.slice(11, 23)
  return oneLine(`#${event.seq}  ${time}  ${event.type.padEnd(20)}  ${summary(event)}`)
}

/** An API failure as a person reads it: code, status, message, details, request ID. */
export function failureText(err: unknown): string {
  if (!(err instanceof ApiFailure)) {
    // fetch's own messages say little without their cause: "terminated (other side closed)".
    const cause = err instanceof Error && err.cause instanceof Error ? ` (${err.cause.message})` : ''
    return printable(err instanceof Error ? `${err.message}${cause}` : String(err))
  }
  const { body, status } = err
  const lines = [`${body.code}${status ? ` (HTTP ${status})` : ''}: ${body.message}`]
  if (body.details !== undefined) lines.push(`  details: ${short(body.details, 400)}`)
  if (body.requestId) lines.push(`  request: ${body.requestId}`)
  return printable(lines.join('\n'))
}
