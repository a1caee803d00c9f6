import t from 'tap'
import { Type } from '@sinclair/typebox'
import { ToolFailure } from '../../src/tools/tool-errors.ts'
import { runTool } from '../../src/tools/runtime.ts'
import type { Tool } from '../../src/tools/types.ts'
import { runInWorker } from '../../src/tools/worker.ts'
import { makeWorkspace, tickCounter } from '../fixtures/tools/context.ts'

const runaway = new URL('../fixtures/tools/runaway.ts', import.meta.url)

t.test('a worker runs an export and returns its result', async (t) => {
  t.same(await runInWorker(runaway, 'echo', { a: [1, 2] }), { echoed: { a: [1, 2] } })
  await t.rejects(runInWorker(runaway, 'missing', null), /has no exported function missing/)
})

t.test('a ToolFailure thrown in the worker keeps its code', async (t) => {
  const err = await runInWorker(runaway, 'refuse', null).catch((e: unknown) => e)
  t.ok(err instanceof ToolFailure)
  t.match(err, { code: 'PERMISSION_DENIED', errorType: 'runtime', message: 'not allowed here', detail: { why: 'test' } })
})

const Params = Type.Object({ fn: Type.String(), length: Type.Optional(Type.Integer()) })
const workerTool: Tool<typeof Params> = {
  name: 'cpu_tool',
  description: 'runs a runaway export on a worker',
  parameters: Params,
  execute: (input, ctx) =>
    runInWorker(runaway, input.fn, { length: input.length ?? 0 }, { signal: ctx.signal, resourceLimits: { maxOldGenerationSizeMb: 64 } })
}

for (const [fn, what] of [
  ['spin', 'loops forever in JS'],
  ['backtrack', 'runs a catastrophic regular expression']
] as const) {
  t.test(`a tool that ${what} ends as TIMEOUT within its timeout + 1 s, the main thread ticking`, async (t) => {
    const ws = await makeWorkspace()
    t.teardown(ws.cleanup)
    const ticker = tickCounter(10)
    t.teardown(ticker.stop)
    const started = Date.now()
    const outcome = await runTool(workerTool, { fn, length: 40 }, ws.ctx(), { timeoutMs: 500, maxOutputBytes: 1000 })
    const elapsed = Date.now() - started
    t.match(outcome, { ok: false, error: { errorType: 'aborted', code: 'TIMEOUT' } })
    t.ok(elapsed < 1500, `ended after ${elapsed} ms`)
    t.ok(ticker.ticks() >= 10, `the event loop was not blocked (${ticker.ticks()} ticks of 10 ms)`)
  })
}

t.test('a tool that allocates without bound ends as a classified memory-limit error', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const ticker = tickCounter(10)
  t.teardown(ticker.stop)
  const started = Date.now()
  const outcome = await runTool(workerTool, { fn: 'allocate' }, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 1000 })
  const elapsed = Date.now() - started
  t.match(outcome, {
    ok: false,
    error: { errorType: 'runtime', code: 'UNKNOWN', detail: { reason: 'memory_limit', limitMb: 64 }, message: /memory limit \(64 MB\)/ }
  })
  t.ok(elapsed < 5000 + 1000, `ended after ${elapsed} ms`)
  t.ok(ticker.ticks() >= 3, `the event loop kept ticking (${ticker.ticks()} ticks)`)
  if (!outcome.ok) t.match(outcome.error.recommendations[0], /memory budget/)
})

t.test("runInWorker's own timeout and abort terminate the worker", async (t) => {
  const timedOut = await runInWorker(runaway, 'spin', null, { timeoutMs: 100 }).catch((e: unknown) => e)
  t.match(timedOut, { name: 'ToolFailure', code: 'TIMEOUT', errorType: 'aborted' })
  const controller = new AbortController()
  setTimeout(() => controller.abort(new Error('stop')), 100)
  await t.rejects(runInWorker(runaway, 'spin', null, { signal: controller.signal }), /stop/)
  await t.rejects(runInWorker(runaway, 'echo', null, { signal: AbortSignal.abort(new Error('before')) }), /before/)
})
