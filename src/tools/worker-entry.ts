import { parentPort, workerData } from 'node:worker_threads'
import type { ToolFailure } from './tool-errors.ts'
import type { WorkerReply } from './worker.ts'

// The thread runInWorker starts: imports the module, calls the export once, posts the outcome.
// ToolFailure is recognised by shape, not imported, to keep the thread's start-up light.
const { moduleUrl, exportName, input } = workerData as { moduleUrl: string; exportName: string; input: unknown }

let reply: WorkerReply
try {
  const mod = (await import(moduleUrl)) as Record<string, unknown>
  const fn = mod[exportName]
  if (typeof fn !== 'function') throw new Error(`${moduleUrl} has no exported function ${exportName}`)
  reply = { ok: true, result: await fn(input) }
} catch (err) {
  if (isToolFailure(err)) {
    const failure: Extract<WorkerReply, { ok: false }>['failure'] = { kind: 'tool_failure', code: err.code, errorType: err.errorType, message: err.message }
    if (err.detail !== undefined) failure.detail = err.detail
    reply = { ok: false, failure }
  } else {
    const e = err instanceof Error ? err : new Error(String(err))
    const code = (e as { code?: unknown }).code
    reply = { ok: false, failure: { kind: 'error', name: e.name, message: e.message, ...(typeof code === 'string' ? { code } : {}) } }
  }
}
parentPort?.postMessage(reply)

function isToolFailure(err: unknown): err is ToolFailure {
  return err instanceof Error && err.name === 'ToolFailure' && typeof (err as { code?: unknown }).code === 'string'
}
