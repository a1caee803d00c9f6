import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto'

/** How long a stream token is good for unless the caller asks for less or more (SPEC 14). */
export const STREAM_TOKEN_TTL_MS = 5 * 60 * 1000
export const STREAM_TOKEN_MAX_TTL_MS = 60 * 60 * 1000

/** The short, non-secret ID of an API key that logs, limits and tokens name it by. */
export const keyIdOf = (key: string) => createHash('sha256').update(key).digest('hex').slice(0, 12)

/** Who a valid token speaks for. */
export interface StreamTokenGrant {
  tenant: string
  keyId: string
}

interface Claims {
  /** tenant */
  t: string
  /** key ID */
  k: string
  /** session ID */
  s: string
  /** expiry, ms since the epoch */
  e: number
}

/**
 * Short-lived tokens that let a client which cannot send `Authorization` (a browser's
 * EventSource) read one session's events: `base64url(claims).base64url(HMAC-SHA256)`, keyed by
 * a secret derived from the API key that asked for it. Nothing is stored, so every process that
 * has the same AGENTD_API_KEYS accepts the token, and removing the key revokes its tokens.
 */
export class StreamTokens {
  readonly #secrets = new Map<string, Buffer>()

  /** apiKeys: key → tenant, as AGENTD_API_KEYS configures them. */
  constructor(apiKeys: ReadonlyMap<string, string>) {
    for (const key of apiKeys.keys()) this.#secrets.set(keyIdOf(key), createHmac('sha256', key).update('agentd stream token v1').digest())
    // Without keys the events route needs no token; the tokens issued anyway (so that one client
    // works either way) are signed with a secret of this process alone.
    if (apiKeys.size === 0) this.#secrets.set('anonymous', randomBytes(32))
  }

  /** A token for `sessionId`, good for ttlMs; null when keyId is not a configured key. */
  issue(grant: StreamTokenGrant, sessionId: string, ttlMs: number, now = Date.now()): { token: string; expiresAt: string } | null {
    const secret = this.#secrets.get(grant.keyId)
    if (!secret) return null
    const claims: Claims = { t: grant.tenant, k: grant.keyId, s: sessionId, e: now + ttlMs }
    const payload = Buffer.from(JSON.stringify(claims)).toString('base64url')
    return { token: `${payload}.${sign(secret, payload)}`, expiresAt: new Date(claims.e).toISOString() }
  }

  /** The grant of a token that is well signed, unexpired and bound to `sessionId`; else null. */
  verify(token: string, sessionId: string, now = Date.now()): StreamTokenGrant | null {
    const [payload, signature, extra] = token.split('.')
    if (!payload || !signature || extra !== undefined) return null
    let claims: Partial<Claims>
    try {
      claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as Partial<Claims>
    } catch {
      return null
    }
    const secret = typeof claims.k === 'string' ? this.#secrets.get(claims.k) : undefined
    if (!secret || !equal(sign(secret, payload), signature)) return null
    if (claims.s !== sessionId || typeof claims.e !== 'number' || claims.e <= now || typeof claims.t !== 'string') return null
    return { tenant: claims.t, keyId: claims.k as string }
  }
}

const sign = (secret: Buffer, payload: string) => createHmac('sha256', secret).update(payload).digest('base64url')

function equal(a: string, b: string): boolean {
  const x = Buffer.from(a)
  const y = Buffer.from(b)
  return x.length === y.length && timingSafeEqual(x, y)
}

/** The one route that takes `?token=`. */
export const TOKEN_PATH = /^\/v1\/sessions\/([^/]+)\/events$/

/**
 * The URL with any `token` query value replaced, for log lines: a token is a credential. Names
 * are compared decoded, as the query parser reads them: `?%74oken=` is a token too.
 */
export function redactStreamToken(url: string): string {
  const start = url.indexOf('?')
  if (start === -1) return url
  const query = url.slice(start + 1)
  if (!/token|%/i.test(query)) return url
  const pairs = query.split('&').map((pair) => {
    const eq = pair.indexOf('=')
    return eq !== -1 && decodedName(pair.slice(0, eq)).toLowerCase() === 'token' ? `${pair.slice(0, eq)}=[redacted]` : pair
  })
  return `${url.slice(0, start + 1)}${pairs.join('&')}`
}

function decodedName(name: string): string {
  try {
    return decodeURIComponent(name.replace(/\+/g, ' '))
  } catch {
    return name
  }
}
