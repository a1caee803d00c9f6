/**
 * Child process entry: agentd itself, built with buildApp on a SQLite file in the given folder
 * (real persistence), on SQLite `:memory:` with BENCH_SERVICE_SQLITE=memory, or, from
 * bench/cluster.ts, on PostgreSQL; logging off, on 127.0.0.1 and a free port.
 * `node bench/service-process.ts <model base URL> <data folder>`; the bench removes the folder.
 */
import { join } from 'node:path'
import { buildApp } from '../src/app.ts'
import { loadConfig } from '../src/config.ts'
import { createOpenAIProvider } from '../src/model/provider.ts'
import { serveChild } from './child.ts'

const [modelUrl, dir] = process.argv.slice(2)
if (!modelUrl || !dir) throw new Error('usage: service-process.ts <model base URL> <data folder>')

const config = loadConfig({
  AGENTD_DB: process.env['BENCH_SERVICE_SQLITE'] === 'memory' ? ':memory:' : join(dir, 'agentd.db'),
  AGENTD_WORKSPACES: join(dir, 'workspaces'),
  OPENAI_BASE_URL: modelUrl,
  OPENAI_API_KEY: 'bench',
  LOG_LEVEL: 'silent',
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
const app = await buildApp({ config, model })
await app.listen({ host: '127.0.0.1', port: 0 })
const address = app.server.address()
if (!address || typeof address === 'string') throw new Error('no address')

serveChild(`http://127.0.0.1:${address.port}`, async () => {
  await app.close()
  await model.close()
})
// BENCH_ELU=1: the share of time agentd's event loop is busy, every 2 s on stderr (1.00 = its one thread is the limit).
if (process.env['BENCH_ELU']) {
  let last = performance.eventLoopUtilization()
  setInterval(() => {
    const now = performance.eventLoopUtilization()
    console.error(`ELU ${performance.eventLoopUtilization(now, last).utilization.toFixed(2)}`)
    last = now
  }, 2000).unref()
}
