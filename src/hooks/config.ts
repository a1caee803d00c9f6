import { readFileSync } from 'node:fs'
import { namePatternCovers } from '../tools/tool-set.ts'

export type HookEvent = 'preToolUse' | 'postToolUse' | 'runEnd'
export type HookOnFailure = 'continue' | 'deny'

/** One hook of AGENTD_HOOKS_CONFIG, with its defaults filled in. */
export interface HookDefinition {
  /** How events, logs and hook_decided name it: the file's `name`, else `<on>#<index>`. */
  name: string
  on: HookEvent
  url: string
  /** Tool names (a trailing `*` matches a prefix) the hook sees; null = every tool. Tool hooks only. */
  tools: readonly string[] | null
  /** Per delivery attempt. */
  timeoutMs: number
  /** What a tool call does when the hook fails: go on as if allowed, or be denied. */
  onFailure: HookOnFailure
  /** HMAC-SHA256 key of X-Agentd-Signature; null sends no signature. */
  secret: string | null
}

/** A hooks file that cannot be used; the message is one line naming the place and the problem. */
export class HooksConfigError extends Error {}

const EVENTS: readonly HookEvent[] = ['preToolUse', 'postToolUse', 'runEnd']
const KEYS = new Set(['name', 'on', 'url', 'tools', 'timeoutMs', 'onFailure', 'secret'])
const DEFAULT_TIMEOUT_MS = 5000
const MAX_TIMEOUT_MS = 60_000
const NAME = /^[A-Za-z0-9._:-]{1,64}$/
const TOOL_PATTERN = /^[A-Za-z0-9_-]{1,128}\*?$|^\*$/

/** Reads and checks the JSON hooks file of AGENTD_HOOKS_CONFIG; throws HooksConfigError. */
export function loadHooksFile(path: string): HookDefinition[] {
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch (err) {
    throw new HooksConfigError(`cannot read the file (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`)
  }
  let parsed: unknown
  try {
    parsed = JSON.parse(text)
  } catch (err) {
    throw new HooksConfigError(`the file is not JSON: ${(err as Error).message}`)
  }
  return parseHooks(parsed)
}

/** Checks a parsed hooks document `{"hooks": [...]}`; throws HooksConfigError at the first problem. */
export function parseHooks(document: unknown): HookDefinition[] {
  if (!isObject(document) || !Array.isArray(document.hooks)) {
    throw new HooksConfigError('expected a JSON object {"hooks": [...]}')
  }
  const extra = Object.keys(document).filter((key) => key !== 'hooks')
  if (extra.length > 0) throw new HooksConfigError(`unknown top-level key "${extra[0]}"; expected only "hooks"`)
  const hooks = document.hooks.map((raw, index) => parseHook(raw, index))
  const seen = new Set<string>()
  for (const hook of hooks) {
    if (seen.has(hook.name)) throw new HooksConfigError(`two hooks are named "${hook.name}"; names must be unique`)
    seen.add(hook.name)
  }
  return hooks
}

function parseHook(raw: unknown, index: number): HookDefinition {
  const at = `hooks[${index}]`
  const fail = (field: string, problem: string): never => {
    throw new HooksConfigError(`${at}.${field} ${problem}`)
  }
  if (!isObject(raw)) throw new HooksConfigError(`${at} must be an object {on, url, ...}`)
  for (const key of Object.keys(raw)) {
    if (!KEYS.has(key)) fail(key, `is not a hook setting; expected ${[...KEYS].join(', ')}`)
  }
  const on = raw.on
  if (typeof on !== 'string' || !EVENTS.includes(on as HookEvent)) fail('on', `must be one of ${EVENTS.join(', ')}`)
  const event = on as HookEvent
  if (typeof raw.url !== 'string') fail('url', 'must be an http(s) URL')
  let url: URL | null = null
  try {
    url = new URL(raw.url as string)
  } catch {
    fail('url', 'must be an http(s) URL')
  }
  if (url?.protocol !== 'http:' && url?.protocol !== 'https:') fail('url', 'must be an http(s) URL')
  if (raw.name !== undefined && (typeof raw.name !== 'string' || !NAME.test(raw.name))) {
    fail('name', 'must be 1 to 64 characters of A-Z a-z 0-9 . _ : -')
  }
  let tools: string[] | null = null
  if (raw.tools !== undefined) {
    if (event === 'runEnd') fail('tools', 'applies to preToolUse and postToolUse hooks only')
    if (!Array.isArray(raw.tools) || raw.tools.length === 0 || !raw.tools.every((t) => typeof t === 'string' && TOOL_PATTERN.test(t))) {
      fail('tools', 'must be a non-empty list of tool names (a trailing * matches a prefix)')
    }
    tools = raw.tools as string[]
  }
  const timeoutMs = raw.timeoutMs ?? DEFAULT_TIMEOUT_MS
  if (typeof timeoutMs !== 'number' || !Number.isInteger(timeoutMs) || timeoutMs < 50 || timeoutMs > MAX_TIMEOUT_MS) {
    fail('timeoutMs', `must be an integer of milliseconds from 50 to ${MAX_TIMEOUT_MS}`)
  }
  const onFailure = raw.onFailure ?? 'continue'
  if (onFailure !== 'continue' && onFailure !== 'deny') fail('onFailure', 'must be "continue" or "deny"')
  if (event === 'runEnd' && raw.onFailure !== undefined) fail('onFailure', 'applies to preToolUse and postToolUse hooks only (runEnd is retried)')
  if (raw.secret !== undefined && (typeof raw.secret !== 'string' || raw.secret.length < 16)) {
    fail('secret', 'must be a string of 16 or more characters')
  }
  return {
    name: (raw.name as string | undefined) ?? `${event}#${index}`,
    on: event,
    url: (url as URL).href,
    tools,
    timeoutMs: timeoutMs as number,
    onFailure: onFailure as HookOnFailure,
    secret: (raw.secret as string | undefined) ?? null
  }
}

/** Whether a tool hook sees calls to this tool. */
export function hookCovers(hook: HookDefinition, toolName: string): boolean {
  if (hook.tools === null) return true
  return hook.tools.some((pattern) => namePatternCovers(pattern, toolName))
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}
