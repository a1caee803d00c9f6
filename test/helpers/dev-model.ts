import { startDevModel, type DevModel } from '../../src/model/dev-model.ts'
import { createOpenAIProvider, type OpenAIProviderOptions } from '../../src/model/provider.ts'
import type { ModelProvider } from '../../src/model/types.ts'

interface Teardown {
  teardown(fn: () => unknown): void
}

/** Starts a dev model on a free port and a provider pointed at it (short timeouts); both close when the test ends. */
export async function startTestDevModel(
  t: Teardown,
  providerOptions: OpenAIProviderOptions = {}
): Promise<{ devModel: DevModel; provider: ModelProvider }> {
  const devModel = await startDevModel({ host: '127.0.0.1', port: 0 })
  const provider = createOpenAIProvider({
    kind: 'dev',
    apiKey: 'test-key',
    baseURL: devModel.url,
    connectTimeoutMs: 1000,
    headersTimeoutMs: 2000,
    bodyTimeoutMs: 2000,
    ...providerOptions
  })
  t.teardown(async () => {
    await devModel.close()
    await provider.close()
  })
  return { devModel, provider }
}
