import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { FastifyInstance } from 'fastify'
import type { RetryPolicy } from '../../src/agent/retry.ts'
import { buildApp, type AppOptions } from '../../src/app.ts'
import { loadConfig } from '../../src/config.ts'
import { startDevModel, type DevModel } from '../../src/model/dev-model.ts'
import { createOpenAIProvider } from '../../src/model/provider.ts'
import type { Store } from '../../src/store/store.ts'

import type { Test } from 'tap'
import type { BuiltPlugins } from '@tapjs/test'

/** The type of a tap subtest's `t`. */
export type TapTest = Test & BuiltPlugins
type Tap = { teardown(fn: () => unknown): void }

export interface TestApp {
  app: FastifyInstance
  devModel: DevModel
  /** A temporary folder removed after the test. */
  dir: string
}

/** A temporary folder that the test removes when it ends. */
export function tempDir(t: Tap, prefix = 'agentd-test-'): string {
  const dir = mkdtempSync(join(tmpdir(), prefix))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

/**
 * The whole service on an in-memory (or given) store, talking to a real dev model over HTTP.
 * Everything is closed when the test ends.
 */
export async function buildTestApp(
  t: Tap,
  options: { env?: Record<string, string>; store?: Store; devModel?: DevModel; logLines?: string[]; retryPolicy?: Partial<RetryPolicy>; app?: Partial<AppOptions> } = {}
): Promise<TestApp> {
  const dir = tempDir(t)
  const devModel = options.devModel ?? (await startDevModel({ host: '127.0.0.1', port: 0 }))
  if (!options.devModel) t.teardown(() => devModel.close())
  const config = loadConfig({
    AGENTD_DB: ':memory:',
    AGENTD_WORKSPACES: join(dir, 'workspaces'),
    OPENAI_BASE_URL: devModel.url,
    OPENAI_API_KEY: 'test-key',
    LOG_LEVEL: 'silent',
    ...options.env
  })
  const model = createOpenAIProvider({ kind: 'dev', apiKey: 'test-key', baseURL: devModel.url, bodyTimeoutMs: 1000, headersTimeoutMs: 1000 })
  const logger = options.logLines
    ? { level: 'info', stream: { write: (line: string) => options.logLines?.push(line) } }
    : false
  const app = await buildApp({ config, model, logger, retryPolicy: { baseMs: 5, capMs: 20, ...options.retryPolicy }, ...options.app, ...(options.store ? { store: options.store } : {}) })
  t.teardown(async () => {
    await app.close()
    await model.close()
  })
  return { app, devModel, dir }
}

/** Listens on an ephemeral loopback port (for SSE and other real-socket tests); returns the base URL. */
export async function listen(app: FastifyInstance): Promise<string> {
  await app.listen({ host: '127.0.0.1', port: 0 })
  const address = app.server.address()
  if (!address || typeof address === 'string') throw new Error('no address')
  return `http://127.0.0.1:${address.port}`
}

/** Creates a session through the API (no tools unless given) and returns its id. */
export async function createSession(ctx: TestApp, body: object = { tools: [] }): Promise<string> {
  const res = await ctx.app.inject({ method: 'POST', url: '/v1/sessions', payload: body })
  if (res.statusCode !== 201) throw new Error(`session not created: ${res.body}`)
  return res.json().id
}

/** Posts a message with ?wait=true and returns the answer's body: the finished run and the assistant message. */
export async function sendAndWait(ctx: TestApp, sessionId: string, content: string) {
  const res = await ctx.app.inject({ method: 'POST', url: `/v1/sessions/${sessionId}/messages?wait=true`, payload: { content } })
  return res.json()
}
