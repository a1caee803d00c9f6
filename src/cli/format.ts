import { styleText } from 'node:util'
import { ApiFailure, type AgentEvent } from './client.ts'

type Style = Parameters<typeof styleText>[0]

/** Colours on a terminal, plain text in a pipe or with NO_COLOR (styleText checks the stream). */
export const paint = (style: Style, text: string, stream: NodeJS.WriteStream = process.stdout) => styleText(style, text, { stream })

/** One line of at most `max` characters. */
export function short(value: unknown, max = 120): string {
  const text = (typeof value === 'string' ? value : JSON.stringify(value) ?? String(value)).replaceAll(/\s*\n\s*/g, ' ')
  return text.length > max ? `${text.slice(0, max - 1)}…` : text
}

/** The parts of a classified error (SPEC 5.1) a person acts on, on one line. */
export function classified(error: { errorType: string; code: string; message: string; retryable: boolean }): string {
  return `${error.errorType} ${error.code} (${error.retryable ? 'retryable' : 'not retryable'}): ${error.message}`
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

/** `#seq  time  type  summary`: one event per line. */
export function eventLine(event: AgentEvent): string {
  const time = event.at.slice(11, 23)
  return `#${event.seq}  ${time}  ${event.type.padEnd(20)}  ${summary(event)}`
}

/** An API failure as a person reads it: code, status, message, details, request ID. */
export function failureText(err: unknown): string {
  if (!(err instanceof ApiFailure)) return err instanceof Error ? err.message : String(err)
  const { body, status } = err
  const lines = [`${body.code}${status ? ` (HTTP ${status})` : ''}: ${body.message}`]
  if (body.details !== undefined) lines.push(`  details: ${short(body.details, 400)}`)
  if (body.requestId) lines.push(`  request: ${body.requestId}`)
  return lines.join('\n')
}
