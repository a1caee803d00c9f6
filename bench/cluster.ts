/**
 * agentd as several processes on one PostgreSQL database, for `npm run bench -- throughput`:
 * BENCH_DATABASE_URL=postgres://… selects it, BENCH_PROCESSES=N (default 1) says how many. The
 * bench gets a schema of its own in that database, dropped after; its clients spread their
 * requests over the processes in turn, as a load balancer without session affinity would.
 */
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import pg from 'pg'
import { startChild, type ChildServer } from './child.ts'
import { AgentdClient, serviceFlags, type StreamedRun } from './harness.ts'

export interface ServiceCluster {
  /** What the bench prints about where agentd runs. */
  label: string
  servers: ChildServer[]
  client(connectionsEach: number): SpreadClient
  close(): Promise<void>
}

/** BENCH_DATABASE_URL and BENCH_PROCESSES, or null for the default single process on SQLite. */
export function clusterSettings(): { databaseUrl: string; processes: number } | null {
  const databaseUrl = process.env['BENCH_DATABASE_URL']
  if (!databaseUrl) return null
  const processes = Number(process.env['BENCH_PROCESSES'] ?? '1')
  if (!Number.isInteger(processes) || processes < 1) throw new Error('BENCH_PROCESSES must be a positive integer')
  return { databaseUrl, processes }
}

export async function startServiceCluster(modelUrl: string, settings: { databaseUrl: string; processes: number }): Promise<ServiceCluster> {
  const schema = `agentd_bench_${randomBytes(4).toString('hex')}`
  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: settings.databaseUrl })
    await client.connect()
    try {
      await client.query(sql)
    } finally {
      await client.end()
    }
  }
  await admin(`CREATE SCHEMA ${schema}`)
  const dir = mkdtempSync(join(tmpdir(), 'agentd-bench-'))
  // The schema through the server options, after any the URL brings (e.g. -c synchronous_commit=off).
  const url = new URL(settings.databaseUrl)
  url.searchParams.set('options', `${url.searchParams.get('options') ?? ''} -c search_path=${schema}`.trim())
  const servers: ChildServer[] = []
  try {
    // One after the other: the first applies the migrations.
    for (let i = 0; i < settings.processes; i++) {
      servers.push(await startChild('./service-process.ts', [modelUrl, dir], serviceFlags(), { BENCH_SERVICE_DATABASE_URL: url.toString() }))
    }
  } catch (err) {
    await Promise.all(servers.map((s) => s.close()))
    await admin(`DROP SCHEMA ${schema} CASCADE`)
    rmSync(dir, { recursive: true, force: true })
    throw err
  }
  return {
    label: `${settings.processes} agentd process${settings.processes > 1 ? 'es' : ''} on PostgreSQL`,
    servers,
    client: (connectionsEach) => new SpreadClient(servers.map((s) => new AgentdClient(s.url, connectionsEach))),
    async close() {
      await Promise.all(servers.map((s) => s.close()))
      await admin(`DROP SCHEMA ${schema} CASCADE`)
      rmSync(dir, { recursive: true, force: true })
    }
  }
}

/** Sends each request to the next process in turn: a session is made on one and its message posted to the next. */
export class SpreadClient {
  readonly #clients: AgentdClient[]
  #next = 0

  constructor(clients: AgentdClient[]) {
    this.#clients = clients
  }

  #pick(): AgentdClient {
    const client = this.#clients[this.#next % this.#clients.length] as AgentdClient
    this.#next++
    return client
  }

  createSession(body: object): Promise<string> {
    return this.#pick().createSession(body)
  }

  streamMessage(sessionId: string, content: string): Promise<StreamedRun> {
    return this.#pick().streamMessage(sessionId, content)
  }

  async close(): Promise<void> {
    await Promise.all(this.#clients.map((c) => c.close()))
  }
}
