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
 * The code of a TLS failure in `err` or its cause chain that no retry can fix: a certificate that is
 * self-signed, expired, from an unknown CA or for another host (`DEPTH_ZERO_SELF_SIGNED_CERT`,
 * `CERT_HAS_EXPIRED`, `ERR_TLS_CERT_ALTNAME_INVALID`, …), or an https URL whose port speaks plain
 * HTTP (`ERR_SSL_WRONG_VERSION_NUMBER`). A handshake timeout is not one.
 */
export function tlsFailureOf(err: unknown): string | undefined {
  for (const e of causeChain(err)) {
    const code = errnoOf(e)
    if (code === undefined || code === 'ERR_TLS_HANDSHAKE_TIMEOUT') continue
    if (code.startsWith('CERT_') || code.startsWith('ERR_TLS_') || certificateCodes.has(code) || code === 'ERR_SSL_WRONG_VERSION_NUMBER') return code
  }
  return undefined
}
