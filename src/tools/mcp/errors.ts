import { ErrorCode, McpError } from '@modelcontextprotocol/sdk/types.js'
import { StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { ToolFailure } from '../tool-errors.ts'
import { answerEnded } from './http-answers.ts'

/**
 * How MCP failures map onto agentd's taxonomy (SPEC 11). The MCP tools own these reasons and
 * recommendations; the runtime only turns the ToolFailure into a ClassifiedError.
 */

/** The server is not connected (starting, down, waiting for its next restart): exception, retryable. */
export function serverUnavailable(server: string, tool: string, state: string, lastError: string | null, retryInMs: number | null): ToolFailure {
  const when = retryInMs === null ? 'soon' : `in about ${Math.max(1, Math.ceil(retryInMs / 1000))} s`
  return new ToolFailure('IO_ERROR', `The MCP server "${server}" is ${state}${lastError ? `: ${lastError}` : ''}.`, {
    reason: 'server_unavailable', server, tool, state, ...(lastError ? { lastError } : {})
  }, {
    errorType: 'exception',
    retryable: true,
    recommendations: [
      `agentd restarts the MCP server "${server}" by itself (next attempt ${when}); retry ${tool} later, or continue without it.`,
      'If it stays down, tell the user that the tool is unavailable; the operator sees its state in GET /v1/tools.'
    ]
  })
}

/** The server's tool list changed and no longer has this tool, which the run still offered. */
export function toolWithdrawn(server: string, tool: string): ToolFailure {
  return new ToolFailure('CONFIG_ERROR', `The MCP server "${server}" no longer offers ${tool}: its tool list changed during the run.`, {
    reason: 'tool_withdrawn', server, tool
  }, {
    recommendations: [`Do not call ${tool} again; continue without it or with another tool the session offers.`]
  })
}

/** The connection ended while the call was in flight (process died, HTTP stream cut). */
export function connectionLost(server: string, tool: string, why: string, cause: unknown): ToolFailure {
  return new ToolFailure('IO_ERROR', `The MCP server "${server}" went away during the call: ${why}.`, {
    reason: 'connection_lost', server, tool
  }, {
    errorType: 'exception',
    retryable: true,
    cause,
    recommendations: [
      `The server is being restarted; retry ${tool} in a few seconds. Its effects, if any, may be partial: check before repeating a change.`
    ]
  })
}

/** The server sent a message larger than agentd accepts; it was stopped (and will be restarted). */
export function messageTooLarge(server: string, tool: string, maxBytes: number): ToolFailure {
  return new ToolFailure('OUTPUT_TOO_LARGE', `The MCP server "${server}" sent a message over ${maxBytes} bytes and was stopped.`, {
    reason: 'message_too_large', server, tool, maxBytes
  }, {
    recommendations: [`Ask ${tool} for less at once (a narrower path, a range, paging), if its parameters allow it.`]
  })
}

/** An `isError: true` result: the tool ran and reported a failure, in its own words (logical). */
export function toolReportedError(tool: string, text: string): Record<string, unknown> {
  return {
    ok: false,
    error: text === '' ? `${tool} reported an error without a message.` : text,
    code: 'UNKNOWN',
    reason: 'tool_error',
    recommendations: [`${tool} ran and reported this error; read it, correct the arguments or the request, then retry or try another approach.`]
  }
}

/** A result whose `content` is neither a list of blocks nor one block or text, with no structuredContent: a fault of the server. */
export function unreadableResult(server: string, tool: string, content: unknown): ToolFailure {
  const kind = content === null ? 'null' : typeof content === 'object' ? 'an object that is not a content block' : `a ${typeof content}`
  return new ToolFailure('IO_ERROR', `The MCP server "${server}" answered ${tool} with a result agentd cannot read: its content is ${kind}, not a list of content blocks.`, {
    reason: 'invalid_result', server, tool
  }, {
    retryable: false,
    recommendations: [`${tool}'s server answered in a form MCP does not allow, which is a fault of the server: do not retry, go on without ${tool} and tell the user.`]
  })
}

/** A failure thrown by the SDK's callTool: JSON-RPC errors by code, HTTP errors by status, anything else as runtime. */
export function classifyCallFailure(server: string, tool: string, err: unknown): ToolFailure {
  if (err instanceof ToolFailure) return err
  if (err instanceof McpError) {
    const detail = { reason: 'jsonrpc_error', server, tool, jsonRpcCode: err.code, ...(err.data === undefined ? {} : { data: err.data }) }
    const message = `The MCP server "${server}" answered ${tool} with JSON-RPC error ${err.code}: ${err.message}`
    switch (err.code) {
      case ErrorCode.InvalidParams:
        return new ToolFailure('VALIDATION_ERROR', message, detail, {
          recommendations: [`The server refused the arguments; call ${tool} again with arguments that match its parameters schema.`]
        })
      case ErrorCode.MethodNotFound:
        return new ToolFailure('CONFIG_ERROR', message, detail, {
          recommendations: [`The server does not offer ${tool} (any more); do not retry it, continue without it.`]
        })
      case ErrorCode.ConnectionClosed:
        return connectionLost(server, tool, answerEnded(err) ? 'it ended its answer without a result' : 'the connection closed', err)
      case ErrorCode.RequestTimeout:
        return new ToolFailure('TIMEOUT', message, detail, {
          recommendations: [`Call ${tool} with a smaller request so it finishes in time.`]
        })
      default:
        return new ToolFailure('UNKNOWN', message, detail, {
          errorType: 'runtime',
          recommendations: [`${tool} failed inside its server; retry once, and if it fails again try another approach.`]
        })
    }
  }
  if (err instanceof StreamableHTTPError) {
    const status = err.code
    const detail = { reason: 'http_error', server, tool, ...(status === undefined ? {} : { status }) }
    if (status === 401 || status === 403) {
      return new ToolFailure('PERMISSION_DENIED', `The MCP server "${server}" refused agentd's credentials (HTTP ${status}).`, detail, {
        recommendations: ['The server needs other credentials; do not retry, tell the user the tool is unavailable.']
      })
    }
    if (status === 429) {
      return new ToolFailure('RATE_LIMITED', `The MCP server "${server}" is rate limiting (HTTP 429).`, detail, {
        recommendations: [`Wait before calling ${tool} again, and make fewer calls.`]
      })
    }
    return connectionLost(server, tool, err.message, err)
  }
  if (isNetworkFailure(err)) return connectionLost(server, tool, `it cannot be reached (${(err as Error).message})`, err)
  return new ToolFailure('UNKNOWN', `${tool} failed: ${err instanceof Error ? err.message : String(err)}`, { reason: 'client_error', server, tool }, {
    errorType: 'runtime',
    cause: err,
    recommendations: [`Retry ${tool} once; if it fails again, try another approach.`]
  })
}

/** fetch() reports an unreachable host as a TypeError whose cause carries the errno. */
function isNetworkFailure(err: unknown): boolean {
  if (!(err instanceof Error)) return false
  const cause = (err as { cause?: { code?: unknown } }).cause
  return err.name === 'TypeError' && typeof cause?.code === 'string'
}
