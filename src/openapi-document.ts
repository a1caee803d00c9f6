import { buildApp } from './app.ts'
import { loadConfig } from './config.ts'
import { createOpenAIProvider } from './model/provider.ts'

/**
 * The OpenAPI document exactly as the app serves it, built from a fixed configuration so that
 * it does not depend on the machine's environment. scripts/openapi.ts writes it to openapi/.
 */
export async function renderOpenApiDocument(): Promise<string> {
  const config = loadConfig({ AGENTD_DB: ':memory:', LOG_LEVEL: 'silent', OPENAI_BASE_URL: 'http://127.0.0.1:9/v1' })
  // Never called: building the document makes no model request.
  const model = createOpenAIProvider({ kind: 'openai', apiKey: 'unused', baseURL: 'http://127.0.0.1:9/v1' })
  const app = await buildApp({ config, model, logger: false })
  try {
    const res = await app.inject({ method: 'GET', url: '/openapi.json' })
    return `${JSON.stringify(res.json(), null, 2)}\n`
  } finally {
    await app.close()
    await model.close()
  }
}
