/**
 * Child process entry: agentd itself, built with buildApp on a SQLite file in the given folder
 * (real persistence), on SQLite `:memory:` with BENCH_SERVICE_SQLITE=memory, or, from
 * bench/cluster.ts, on PostgreSQL; logging off (unless BENCH_LOG_LEVEL), on 127.0.0.1 and a free port.
 * `node bench/service-process.ts <model base URL> <data folder>`; the bench removes the folder.
 *
 * For the latency bench, and for trying a change to the store without making it:
 * - BENCH_SERVICE_WATCH=1: it watches its own event loop, GC and SQLite statements
 *   (bench/service-watch.ts) and answers the bench's questions: 'sample' (what it saw since the
 *   last one), 'profile' then 'profiled' (one phase of the bench profiled, CPU or heap);
 * - BENCH_SQLITE_PRAGMAS="wal_autocheckpoint=10000; …": pragmas run right after the store's own;
 * - BENCH_SERVICE_STORE=<module>: a variant of the SQLite store (a module exporting SqliteStore,
 *   constructed with the file's path), opened as src/store/index.ts opens the store;
 * - BENCH_LOG_LEVEL=info (or any pino level): agentd logs as a deployment does, one JSON line per
 *   event written synchronously as pino writes to stdout, here to agentd.log in the data folder
 *   (so that the bench's own output stays readable): what logging costs a deployment.
 */
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import pino from 'pino'
import { buildApp } from '../src/app.ts'
import { loadConfig } from '../src/config.ts'
import { createOpenAIProvider } from '../src/model/provider.ts'
import type { Store } from '../src/store/store.ts'
import { serveChild } from './child.ts'
import { startProfile, watchService } from './service-watch.ts'

const [modelUrl, dir] = process.argv.slice(2)
if (!modelUrl || !dir) throw new Error('usage: service-process.ts <model base URL> <data folder>')
const memory = process.env['BENCH_SERVICE_SQLITE'] === 'memory'
// Before the store opens: the watch times the store's statements.
const watch = process.env['BENCH_SERVICE_WATCH'] ? watchService(memory || process.env['BENCH_SERVICE_DATABASE_URL'] ? null : join(dir, 'agentd.db-wal')) : null
// After the store's own pragmas: its first exec that sets journal_mode.
const pragmas = process.env['BENCH_SQLITE_PRAGMAS']
if (pragmas) {
  const exec = DatabaseSync.prototype.exec
  DatabaseSync.prototype.exec = function (this: DatabaseSync, sql: string) {
    exec.call(this, sql)
    if (sql.includes('journal_mode')) exec.call(this, pragmas.split(';').filter((p) => p.trim()).map((p) => `PRAGMA ${p.trim()};`).join(' '))
  }
}
let profiler: Awaited<ReturnType<typeof startProfile>> | null = null
const logLevel = process.env['BENCH_LOG_LEVEL']

const config = loadConfig({
  AGENTD_DB: memory ? ':memory:' : join(dir, 'agentd.db'),
  AGENTD_WORKSPACES: join(dir, 'workspaces'),
  OPENAI_BASE_URL: modelUrl,
  OPENAI_API_KEY: 'bench',
  LOG_LEVEL: logLevel ?? 'silent',
  // The bench is one client that, on purpose, sends thousands of requests a minute and holds
  // 100 streams (10 000 idle ones in idle-streams.ts) open.
  AGENTD_RATE_LIMIT_MAX: '0',
  AGENTD_MAX_ACTIVE_RUNS_PER_TENANT: '100000',
  AGENTD_MAX_STREAMS_PER_KEY: '100000',
  AGENTD_MAX_STREAMS: '100000',
  AGENTD_MAX_SESSIONS_PER_TENANT: '100000000',
  // Set by bench/cluster.ts: one of several processes on PostgreSQL instead of the SQLite file.
  ...(process.env['BENCH_SERVICE_DATABASE_URL'] ? { DATABASE_URL: process.env['BENCH_SERVICE_DATABASE_URL'] } : {})
})
const model = createOpenAIProvider({ kind: 'dev', apiKey: 'bench', baseURL: modelUrl })
const variant = process.env['BENCH_SERVICE_STORE']
const store = variant
  ? new ((await import(variant)) as { SqliteStore: new (path: string) => Store & { migrate(): Promise<void> } }).SqliteStore(config.db)
  : undefined
await store?.migrate()
const logger = logLevel ? { logger: { level: logLevel, stream: pino.destination({ dest: join(dir, 'agentd.log'), sync: true }) } } : {}
const app = await buildApp({ config, model, ...logger, ...(store ? { store } : {}) })
watch?.watchPublished(app.agentd.bus)
await app.listen({ host: '127.0.0.1', port: 0 })
const address = app.server.address()
if (!address || typeof address === 'string') throw new Error('no address')

serveChild(`http://127.0.0.1:${address.port}`, async () => {
  await app.close()
  await store?.close()
  await model.close()
}, watch ? {
  sample: () => watch.sample(),
  // One phase of the bench profiled: 'profile' with 'cpu' or 'heap' starts, 'profiled' with a file name stops and writes it.
  profile: async (kind) => {
    profiler = await startProfile(kind === 'heap' ? 'heap' : 'cpu')
  },
  profiled: async (file) => {
    if (!profiler || !file) throw new Error('profiled <file> comes after profile')
    await profiler.stop(file)
    profiler = null
  }
} : {})
// BENCH_ELU=1: the share of time agentd's event loop is busy, every 2 s on stderr (1.00 = its one thread is the limit).
if (process.env['BENCH_ELU']) {
  let last = performance.eventLoopUtilization()
  setInterval(() => {
    const now = performance.eventLoopUtilization()
    console.error(`ELU ${performance.eventLoopUtilization(now, last).utilization.toFixed(2)}`)
    last = now
  }, 2000).unref()
}
