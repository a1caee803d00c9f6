/**
 * A `Retry-After` value (seconds, or an HTTP date) in milliseconds from `now`; null when absent or
 * unusable. A header sent twice arrives joined ("5, 5"): its first value counts.
 */
export function retryAfterMs(value: string | null | undefined, now = Date.now()): number | null {
  const text = value?.trim()
  if (!text) return null
  const seconds = /^-?\d+(?:\.\d+)?(?=\s*(?:,|$))/.exec(text)
  if (seconds) {
    const n = Number(seconds[0])
    return n >= 0 ? Math.round(n * 1000) : null
  }
  // Only the HTTP-date forms (RFC 9110): Date.parse reads almost anything ("wait 3600" is the year 3600).
  const date = httpDate.exec(text)
  const at = date ? Date.parse(date[0]) : NaN
  return Number.isNaN(at) ? null : Math.max(0, at - now)
}

/** IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT"), RFC 850 ("Sunday, 06-Nov-94 08:49:37 GMT") and asctime ("Sun Nov  6 08:49:37 1994"). */
const httpDate = /^(?:[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT|[A-Z][a-z]+, \d{2}-[A-Z][a-z]{2}-\d{2} \d{2}:\d{2}:\d{2} GMT|[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \d{4})/
