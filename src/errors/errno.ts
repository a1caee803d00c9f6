// Node's errno codes and undici's UND_ERR_* codes, grouped once for every classifier that reads
// them: a tool's raw throw (tools/tool-errors.ts) and a model call's transport failure
// (model/model-errors.ts). Codes, never message text, decide (STYLE habit 5).

/** What kind of failure an errno or undici code names. */
export type ErrnoFamily = 'not_found' | 'permission' | 'timeout' | 'network' | 'filesystem'

const families: ReadonlyMap<string, ErrnoFamily> = new Map(
  Object.entries({
    not_found: ['ENOENT'],
    permission: ['EACCES', 'EPERM'],
    timeout: ['ETIMEDOUT', 'ESOCKETTIMEDOUT', 'UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT'],
    network: [
      'ECONNREFUSED', 'ECONNRESET', 'ECONNABORTED', 'EPIPE', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'ENETDOWN',
      'UND_ERR_SOCKET', 'UND_ERR_CLOSED', 'UND_ERR_DESTROYED', 'UND_ERR_CONNECT'
    ],
    filesystem: ['EISDIR', 'ENOTDIR', 'EEXIST', 'ENOTEMPTY', 'ENOSPC', 'EMFILE', 'ENFILE', 'EROFS', 'ELOOP', 'EBUSY', 'EIO']
  } satisfies Record<ErrnoFamily, string[]>).flatMap(([family, codes]) => codes.map((code) => [code, family as ErrnoFamily] as const))
)

/** The family of an errno or undici code; undefined for a code no classifier maps. */
export function errnoFamily(code: string | undefined): ErrnoFamily | undefined {
  return code === undefined ? undefined : families.get(code)
}

/** The string `code` of a thrown value (`ENOENT`, `UND_ERR_SOCKET`, …), if it has one. */
export function errnoOf(err: unknown): string | undefined {
  const code = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined
  return typeof code === 'string' ? code : undefined
}

/** `err` and its `cause`s, outermost first (fetch wraps a socket's error in `TypeError: fetch failed`); at most 8, no cycle. */
export function causeChain(err: unknown): object[] {
  const chain: object[] = []
  let current: unknown = err
  while (typeof current === 'object' && current !== null && !chain.includes(current) && chain.length < 8) {
    chain.push(current)
    current = (current as { cause?: unknown }).cause
  }
  return chain
}

// OpenSSL's certificate verification results as Node names them, besides those starting with CERT_.
const certificateCodes = new Set([
  'DEPTH_ZERO_SELF_SIGNED_CERT', 'SELF_SIGNED_CERT_IN_CHAIN', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY', 'UNABLE_TO_DECRYPT_CERT_SIGNATURE', 'UNABLE_TO_DECODE_ISSUER_PUBLIC_KEY', 'UNABLE_TO_GET_CRL',
  'ERROR_IN_CERT_NOT_BEFORE_FIELD', 'ERROR_IN_CERT_NOT_AFTER_FIELD', 'INVALID_CA', 'PATH_LENGTH_EXCEEDED', 'INVALID_PURPOSE', 'HOSTNAME_MISMATCH'
])

/**
 * The alerts a TLS peer sends when it will not talk to this client as configured (no protocol
 * version or cipher in common, a certificate it refuses or requires, a name it does not serve), as
 * OpenSSL names them in Node's error codes: `ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE` (OpenSSL 3),
 * `ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION`, `ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED`, … Alerts a
 * broken or busy peer may send once (internal_error, bad_record_mac, decode_error) are not among them.
 */
const refusingAlert = /^ERR_SSL_(?:SSL\/TLS|SSLV3|TLSV1|TLSV13)_ALERT_(?:HANDSHAKE_FAILURE|PROTOCOL_VERSION|INSUFFICIENT_SECURITY|BAD_CERTIFICATE|UNSUPPORTED_CERTIFICATE|CERTIFICATE_REVOKED|CERTIFICATE_EXPIRED|CERTIFICATE_UNKNOWN|UNKNOWN_CA|ACCESS_DENIED|CERTIFICATE_REQUIRED|UNRECOGNIZED_NAME|NO_APPLICATION_PROTOCOL)$/

/** OpenSSL's own refusals, on this side: the peer offers only what it will not accept. */
const refusedHere = new Set([
  'ERR_SSL_WRONG_VERSION_NUMBER', 'ERR_SSL_UNSUPPORTED_PROTOCOL', 'ERR_SSL_NO_PROTOCOLS_AVAILABLE', 'ERR_SSL_DH_KEY_TOO_SMALL',
  'ERR_SSL_EE_KEY_TOO_SMALL', 'ERR_SSL_CA_MD_TOO_WEAK', 'ERR_SSL_UNSAFE_LEGACY_RENEGOTIATION_DISABLED'
])

/**
 * The code of a TLS failure in `err` or its cause chain that no retry can fix: a certificate that is
 * self-signed, expired, from an unknown CA or for another host (`DEPTH_ZERO_SELF_SIGNED_CERT`,
 * `CERT_HAS_EXPIRED`, `ERR_TLS_CERT_ALTNAME_INVALID`, …), an https URL whose port speaks plain
 * HTTP (`ERR_SSL_WRONG_VERSION_NUMBER`), a peer that refuses the handshake as this client makes it
 * (an alert such as `ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE`), or a peer this client refuses (a
 * protocol or key it will not use). A handshake timeout is not one.
 */
export function tlsFailureOf(err: unknown): string | undefined {
  for (const e of causeChain(err)) {
    const code = errnoOf(e)
    if (code === undefined || code === 'ERR_TLS_HANDSHAKE_TIMEOUT') continue
    if (code.startsWith('CERT_') || code.startsWith('ERR_TLS_') || certificateCodes.has(code) || refusedHere.has(code) || refusingAlert.test(code)) {
      return code
    }
  }
  return undefined
}
