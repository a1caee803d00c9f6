import closeWithGrace from 'close-with-grace'
import { buildApp } from './app.ts'
import { ConfigError, loadConfig, type Config } from './config.ts'
import { startDevModel, type DevModel } from './model/dev-model.ts'
import { createOpenAIProvider } from './model/provider.ts'

function readConfig(): Readonly<Config> {
  try {
    return loadConfig()
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err
    for (const problem of err.problems) process.stderr.write(`agentd: configuration error: ${problem}\n`)
    process.exit(1)
  }
}

/** Start-up failed for a reason outside the configuration (store, port): one line, exit 1. */
function cannotStart(err: unknown): never {
  const code = (err as { code?: string } | null)?.code
  const message = err instanceof Error ? err.message : String(err)
  process.stderr.write(`agentd: cannot start: ${message}${code && !message.includes(code) ? ` (${code})` : ''}\n`)
  process.exit(1)
}

const config = readConfig()

let devModel: DevModel | undefined
if (config.useDevModel) devModel = await startDevModel({ host: '127.0.0.1', port: 0 })
const model = createOpenAIProvider({
  kind: devModel ? 'dev' : 'openai',
  apiKey: devModel ? 'dev-model' : config.openai.apiKey,
  baseURL: devModel ? devModel.url : config.openai.baseURL,
  bodyTimeoutMs: config.modelTimeoutMs,
  headersTimeoutMs: config.modelTimeoutMs
})

const app = await buildApp({
  config,
  model,
  logger: { level: config.logLevel }
}).catch(cannotStart)
if (devModel) {
  app.log.warn(
    { devModelUrl: devModel.url },
    'no model provider configured (OPENAI_API_KEY / OPENAI_BASE_URL unset): answering with the built-in dev model'
  )
}

// An unhandled rejection is a bug to log, not a reason to drop every session in flight.
process.on('unhandledRejection', (reason) => app.log.error({ err: reason }, 'unhandled promise rejection'))

closeWithGrace(
  { delay: config.shutdownGraceMs + 5000, skip: ['unhandledRejection'], logger: false },
  async ({ signal, err }) => {
    if (err) app.log.fatal({ err }, 'uncaught exception: draining and exiting')
    else app.log.info({ signal }, 'signal received: draining')
    await app.agentd.drain(config.shutdownGraceMs)
    await app.close()
    await model.close()
    await devModel?.close()
    app.log.info('stopped')
  }
)

await app.listen({ host: config.host, port: config.port }).catch(async (err: unknown) => {
  await app.close()
  cannotStart(err)
})
