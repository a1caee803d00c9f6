/**
 * A URL's user info (`user:password@`), which undici does not send by itself: agentd sends it as
 * Basic authorization (http_fetch, hook deliveries) and never shows it.
 */

/** `Basic …` for the URL's user info; null when it has none. A stray % (kept by the URL parser as is) is sent as written. */
export function basicAuthorization(url: URL): string | null {
  if (url.username === '' && url.password === '') return null
  const pair = `${decoded(url.username)}:${decoded(url.password)}`
  return `Basic ${Buffer.from(pair, 'utf8').toString('base64')}`
}

/** The URL without its user info, which may carry a password; the same URL when it has none. */
export function withoutCredentials(url: URL): URL {
  if (url.username === '' && url.password === '') return url
  const copy = new URL(url.href)
  copy.username = ''
  copy.password = ''
  return copy
}

function decoded(part: string): string {
  try {
    return decodeURIComponent(part)
  } catch {
    return part
  }
}
