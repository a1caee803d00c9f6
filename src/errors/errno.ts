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
