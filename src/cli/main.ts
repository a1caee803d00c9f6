import { parseArgs } from 'node:util'
import { chat } from './chat.ts'
import { AgentdClient, type AgentEvent } from './client.ts'
import { eventLine, failureText, oneLine, paint } from './format.ts'

const USAGE = `Usage: agentd <command> [options]

Commands:
  serve                          run the service (the same as npm start; configured by the environment)
  chat [--session <id>]          talk to an agent: each line is a message; answers stream, approvals ask y/n
       [--tools a,b] [--approval auto|always] [--ask a,b] [--on-busy reject|enqueue|interrupt]
                                 (a new session; --ask names the tools that need approval)
  sessions [ls] [--limit <n>]    list sessions, newest first
  sessions rm <id>...            delete sessions
  events <id> [--follow] [--json] [--after <seq>]
                                 print a session's events; --follow keeps streaming (resumes after a drop)

Options:
  --url <url>    the service (AGENTD_URL; default http://127.0.0.1:3000)
  --key <key>    an API key (AGENTD_API_KEY)
  --json         print JSON (one object per line)
  -h, --help     this text`

/** Flags every command accepts; unknown ones are an error, not silently ignored. */
const OPTIONS = {
  url: { type: 'string' },
  key: { type: 'string' },
  session: { type: 'string' },
  tools: { type: 'string' },
  approval: { type: 'string' },
  ask: { type: 'string' },
  'on-busy': { type: 'string' },
  limit: { type: 'string' },
  after: { type: 'string' },
  follow: { type: 'boolean', short: 'f' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' }
} as const

/** A mistake in the command line: printed as one line with a pointer to --help, exit 2. */
class UsageError extends Error {}

function oneOf<T extends string>(name: string, value: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(value)) throw new UsageError(`--${name} must be one of ${allowed.join(', ')}, not "${value}"`)
  return value as T
}

function count(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined
  if (!/^\d+$/.test(value)) throw new UsageError(`--${name} must be a whole number, not "${value}"`)
  return Number(value)
}

/**
 * The service's base URL, checked here: fetch reads `localhost:3000` as a URL of the scheme
 * "localhost:" and fails with "fetch failed", which would be reported as a service that cannot be
 * reached while it is up and only the scheme is missing.
 */
function serviceUrl(from: string, value: string): string {
  const url = URL.parse(value)
  if (url?.protocol !== 'http:' && url?.protocol !== 'https:') {
    throw new UsageError(`${from} must be an http:// or https:// URL such as http://127.0.0.1:3000, not "${value}"`)
  }
  return value
}

/**
 * The API key, checked here: one copied with a curly quote or a line break in it made fetch fail
 * before sending, reported as a service that cannot be reached, with the key in the message.
 * Headers carry bytes (U+0000 to U+00FF) but NUL, CR and LF; what surrounds the key is trimmed.
 */
function apiKey(from: string, value: string | undefined): string | undefined {
  if (!value) return undefined
  const trimmed = value.trim()
  const bad = /[\0\r\n]|[^\0-\xff]/u.exec(trimmed)
  if (bad) {
    const code = (bad[0].codePointAt(0) ?? 0).toString(16).toUpperCase().padStart(4, '0')
    throw new UsageError(`${from} holds a character an HTTP header cannot carry (U+${code} at position ${bad.index + 1}): was it copied with a curly quote or a line break?`)
  }
  return trimmed
}

/** Words past what a command takes are a mistake, not dropped: `agentd chat "hello"` sent nothing. */
function noMoreWords(command: string, words: string[], hint = ''): void {
  if (words.length > 0) throw new UsageError(`${command} takes no words after it (${words.map((word) => JSON.stringify(word)).join(' ')})${hint}`)
}

/** A comma list of names. */
const names = (list: string) => list.split(',').map((name) => name.trim()).filter(Boolean)

/** The most sessions the API gives in one page. */
const SESSION_PAGE = 100

/** The newest `limit` sessions, read a page at a time: --limit is how many to list, not a page size. */
async function listSessions(client: AgentdClient, limit: number, json: boolean): Promise<void> {
  let shown = 0
  let cursor: string | null = null
  do {
    const query = new URLSearchParams({ limit: String(Math.min(SESSION_PAGE, limit - shown)) })
    if (cursor) query.set('cursor', cursor)
    const page: { data: Array<Record<string, any>>; nextCursor: string | null } = await client.request('GET', `/v1/sessions?${query}`)
    for (const session of page.data) {
      if (json) process.stdout.write(`${JSON.stringify(session)}\n`)
      else process.stdout.write(`${oneLine(`${session.id}  ${String(session.status).padEnd(20)}  ${session.model}  ${session.createdAt}  ${session.usage.totalTokens} tokens`)}\n`)
    }
    shown += page.data.length
    cursor = page.nextCursor
  } while (cursor && shown < limit)
  if (!json && shown === 0) process.stdout.write(paint('dim', 'no sessions\n'))
  if (!json && cursor) process.stdout.write(paint('dim', `(more: --limit ${limit * 2})\n`))
}

async function printEvents(client: AgentdClient, sessionId: string, options: { follow: boolean; json: boolean; after: number }): Promise<void> {
  const print = (event: AgentEvent) => process.stdout.write(`${options.json ? JSON.stringify(event) : eventLine(event)}\n`)
  if (!options.follow) {
    for await (const event of client.storedEvents(sessionId, options.after)) print(event)
    return
  }
  const stream = client.follow(sessionId, {
    after: options.after,
    onReconnect: (err) => process.stderr.write(paint('yellow', `(connection lost: ${failureText(err)}; resuming)\n`, process.stderr))
  })
  for await (const event of stream) print(event)
}

/** Runs one command line; resolves with the exit code, or undefined for `serve`, which keeps running. */
export async function main(argv: string[]): Promise<number | undefined> {
  // `agentd events … | head` closes the pipe early: that is the reader being done, not a failure.
  process.stdout.on('error', (err: NodeJS.ErrnoException) => process.exit(err.code === 'EPIPE' ? 0 : 1))
  let parsed
  try {
    parsed = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true })
  } catch (err) {
    process.stderr.write(`agentd: ${(err as Error).message}\n${paint('dim', 'agentd --help lists the commands and options', process.stderr)}\n`)
    return 2
  }
  const { values, positionals } = parsed
  const [command, ...rest] = positionals
  if (values.help || command === undefined || command === 'help') {
    process.stdout.write(`${USAGE}\n`)
    return command === undefined && !values.help ? 2 : 0
  }
  if (command === 'serve') {
    await import('../server.ts')
    return undefined
  }

  try {
    const url = values.url !== undefined ? serviceUrl('--url', values.url) : serviceUrl('AGENTD_URL', process.env.AGENTD_URL || 'http://127.0.0.1:3000')
    const key = values.key !== undefined ? apiKey('--key', values.key) : apiKey('AGENTD_API_KEY', process.env.AGENTD_API_KEY)
    const client = new AgentdClient(url, key)
    switch (command) {
      case 'chat':
        noMoreWords('chat', rest, ': it reads the messages from stdin, one a line')
        // The API cannot change an existing session's tools or approval: ignoring these with
        // --session would chat on under the session's own approval, tools running unasked.
        for (const name of ['tools', 'approval', 'ask'] as const) {
          if (values.session && values[name] !== undefined) {
            throw new UsageError(`--${name} sets up a new session; an existing one (--session) keeps its own tools and approval`)
          }
        }
        if (values.approval !== undefined && values.ask !== undefined) {
          throw new UsageError('--approval and --ask are alternatives: one approval mode or the tools that need approval')
        }
        return await chat(client, {
          ...(values.session ? { sessionId: values.session } : {}),
          ...(values.tools !== undefined ? { tools: names(values.tools) } : {}),
          ...(values.approval ? { approval: { mode: oneOf('approval', values.approval, ['auto', 'always'] as const) } } : {}),
          ...(values.ask !== undefined ? { approval: { mode: 'tools', tools: names(values.ask) } } : {}),
          ...(values['on-busy'] ? { onBusy: oneOf('on-busy', values['on-busy'], ['reject', 'enqueue', 'interrupt'] as const) } : {})
        })
      case 'sessions': {
        const [action = 'ls', ...ids] = rest
        if (action === 'ls') {
          noMoreWords('sessions ls', ids)
          await listSessions(client, count('limit', values.limit) ?? 20, values.json === true)
        } else if (action === 'rm') {
          if (ids.length === 0) throw new UsageError('sessions rm needs at least one session id')
          // Like rm: one ID that cannot be deleted is reported, and the others still are.
          let failed = false
          for (const id of ids) {
            try {
              await client.request('DELETE', `/v1/sessions/${encodeURIComponent(id)}`)
              process.stdout.write(`deleted ${id}\n`)
            } catch (err) {
              process.stderr.write(`agentd: ${failureText(err)}\n`)
              failed = true
            }
          }
          return failed ? 1 : 0
        } else throw new UsageError(`unknown sessions action "${action}" (ls or rm)`)
        return 0
      }
      case 'events': {
        const [sessionId] = rest
        if (!sessionId) throw new UsageError('events needs a session id')
        if (rest.length > 1) throw new UsageError(`events takes one session id, not ${rest.length}`)
        await printEvents(client, sessionId, { follow: values.follow === true, json: values.json === true, after: count('after', values.after) ?? 0 })
        return 0
      }
      default:
        throw new UsageError(`unknown command "${command}"`)
    }
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`agentd: ${err.message}\n${paint('dim', 'agentd --help lists the commands and options', process.stderr)}\n`)
      return 2
    }
    process.stderr.write(`agentd: ${failureText(err)}\n`)
    return 1
  }
}
