import type { TapTest } from './app.ts'

export interface RawAnswer {
  status: number
  /** Header names lower-cased. */
  headers: Record<string, string>
  body: string
}

/** Splits what a server wrote on a socket into status, headers and body (one answer, not chunked). */
export function parseRawAnswer(answer: string): RawAnswer {
  const end = answer.indexOf('\r\n\r\n')
  const head = end === -1 ? answer : answer.slice(0, end)
  const [statusLine = '', ...lines] = head.split('\r\n')
  const headers: Record<string, string> = {}
  for (const line of lines) {
    const colon = line.indexOf(':')
    if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim()
  }
  return { status: Number(/^HTTP\/1\.1 (\d{3}) /.exec(statusLine)?.[1]), headers, body: end === -1 ? '' : answer.slice(end + 4) }
}

/**
 * Checks that an answer written on the socket is the SPEC 5.2 envelope: its status line, a JSON
 * body whose error has `code` and `retryable`, and X-Request-Id equal to error.requestId.
 * Returns the envelope's `error`.
 */
export function assertRawEnvelope(t: TapTest, answer: string, status: number, code: string, retryable: boolean): any {
  t.match(answer, new RegExp(`^HTTP/1\\.1 ${status} `), `status line ${status}`)
  const { headers, body } = parseRawAnswer(answer)
  t.match(headers['content-type'], /^application\/json; charset=utf-8$/, `${status}: JSON`)
  t.equal(headers['content-length'], String(Buffer.byteLength(body)), `${status}: Content-Length is the body's`)
  t.equal(headers['connection'], 'close', `${status}: Connection: close`)
  t.equal(headers['x-content-type-options'], 'nosniff', `${status}: with the security headers`)
  let parsed: any
  try {
    parsed = JSON.parse(body)
  } catch {
    t.fail(`${status}: the body is JSON (${JSON.stringify(body.slice(0, 100))})`)
    return undefined
  }
  t.same(Object.keys(parsed), ['error'], `${status}: only the error key`)
  const error = parsed.error ?? {}
  t.equal(error.code, code, `${status}: ${code}`)
  t.equal(error.retryable, retryable, `${status}: retryable ${retryable}`)
  t.equal(typeof error.message, 'string', `${status}: a message`)
  t.ok(!Number.isNaN(Date.parse(error.timestamp)), `${status}: timestamp is a date`)
  t.ok(typeof error.requestId === 'string' && error.requestId.length > 0, `${status}: a requestId`)
  t.equal(headers['x-request-id'], error.requestId, `${status}: X-Request-Id is the envelope's requestId`)
  return error
}
