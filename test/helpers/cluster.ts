import { join } from 'node:path'
import { startDevModel, type DevModel } from '../../src/model/dev-model.ts'
import { tempDir, type TapTest } from './app.ts'
import { schemaUrl, withSchema } from './postgres.ts'
import { startServer, until, type ServerProcess } from './server-process.ts'
import type { StreamedEvent } from './sse.ts'

export interface Cluster {
  /** The processes, started as real `src/server.ts` on their own ports, all on one database schema. */
  servers: ServerProcess[]
  devModel: DevModel
  env: Record<string, string>
  /** Starts one more process on the same database (or a process again, after a kill). */
  start(): Promise<ServerProcess>
  /** A JSON request to one process. */
  api(server: ServerProcess, method: string, path: string, body?: unknown, headers?: Record<string, string>): Promise<{ status: number; json: any }>
  /** The session's stored events, read through a process. */
  events(server: ServerProcess, sessionId: string): Promise<StreamedEvent[]>
  /** Polls until check returns a value. */
  until: typeof until
  /** Waits until the session has an event matching `match`; resolves with it. */
  eventOf(server: ServerProcess, sessionId: string, match: (e: StreamedEvent) => boolean, timeoutMs?: number, what?: string): Promise<StreamedEvent>
}

/** N agentd processes on one PostgreSQL schema (removed after), answering with one shared dev model. */
export async function startCluster(t: TapTest, count: number, env: Record<string, string> = {}): Promise<Cluster> {
  const schema = await withSchema(t)
  const devModel = await startDevModel({ host: '127.0.0.1', port: 0 })
  t.teardown(() => devModel.close())
  const dir = tempDir(t)
  const clusterEnv = {
    DATABASE_URL: schemaUrl(schema), AGENTD_WORKSPACES: join(dir, 'ws'), OPENAI_BASE_URL: devModel.url, OPENAI_API_KEY: 'test',
    // The tests poll every 10 ms for seconds; a rate limit would answer 429 before what they wait for comes.
    AGENTD_RUN_LEASE_MS: '1500', AGENTD_RATE_LIMIT_MAX: '0', ...env
  }
  const started: ServerProcess[] = []
  t.teardown(async () => {
    for (const server of started) server.child.kill('SIGKILL')
    await Promise.all(started.map((server) => server.exited))
  })
  const start = async () => {
    const server = await startServer(clusterEnv, 30_000)
    started.push(server)
    return server
  }
  // One at a time: the first applies the migrations, the others find them applied.
  const servers: ServerProcess[] = []
  for (let i = 0; i < count; i++) servers.push(await start())
  const api: Cluster['api'] = async (server, method, path, body, headers = {}) => {
    const res = await fetch(`${server.url}${path}`, {
      method,
      headers: { ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body)
    })
    return { status: res.status, json: await res.json().catch(() => null) }
  }
  const events: Cluster['events'] = async (server, sessionId) => {
    const res = await api(server, 'GET', `/v1/sessions/${sessionId}/events?limit=1000`, undefined, { accept: 'application/json' })
    if (res.status !== 200) throw new Error(`GET events of ${sessionId} answered ${res.status}: ${JSON.stringify(res.json)}`)
    return res.json.data
  }
  return {
    servers, devModel, env: clusterEnv, start, api, events, until,
    eventOf: (server, sessionId, match, timeoutMs = 10_000, what = 'event') =>
      until(async () => (await events(server, sessionId)).find(match), timeoutMs, what)
  }
}
