/** A `Retry-After` value (seconds, or an HTTP date) in milliseconds from `now`; null when absent or unusable. */
export function retryAfterMs(value: string | null | undefined, now = Date.now()): number | null {
  const text = value?.trim()
  if (!text) return null
  const seconds = Number(text)
  if (Number.isFinite(seconds)) return seconds >= 0 ? Math.round(seconds * 1000) : null
  const date = Date.parse(text)
  return Number.isNaN(date) ? null : Math.max(0, date - now)
}
