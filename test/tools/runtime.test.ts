import t from 'tap'
import { Type } from '@sinclair/typebox'
import { ToolFailure } from '../../src/tools/tool-errors.ts'
import { capResult, createConcurrencyLimiter, runTool } from '../../src/tools/runtime.ts'
import type { Tool } from '../../src/tools/types.ts'
import { makeWorkspace, tickCounter } from '../fixtures/tools/context.ts'

const Params = Type.Object({ n: Type.Integer() }, { additionalProperties: false })
const limits = { timeoutMs: 300, maxOutputBytes: 1000 }

function tool(execute: Tool<typeof Params>['execute']): Tool<typeof Params> {
  return { name: 'probe', description: 'test tool', parameters: Params, execute }
}

t.test('a successful call returns the result and its duration', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const outcome = await runTool(tool(async (input, ctx) => ({ doubled: input.n * 2, workspace: ctx.workspace })), { n: 21 }, ws.ctx(), limits)
  t.same(outcome, { ok: true, result: { doubled: 42, workspace: ws.root }, truncated: false, durationMs: outcome.durationMs })
  t.type(outcome.durationMs, 'number')
})

t.test('arguments that fail the schema are a validation error and execute is never called', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  let called = false
  const outcome = await runTool(tool(async () => (called = true)), { n: 'seven' }, ws.ctx(), limits)
  t.equal(called, false)
  t.equal(outcome.ok, false)
  if (outcome.ok) return
  t.equal(outcome.error.errorType, 'validation')
  t.equal(outcome.error.code, 'VALIDATION_ERROR')
  t.match(outcome.error.recommendations[0], 'Field "n" must be integer; got "seven".')
})

t.test('a throw is runtime, a ToolFailure keeps its code, {ok:false} is logical', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const thrown = await runTool(tool(async () => { throw new Error(`broke in ${ws.root}/x`) }), { n: 1 }, ws.ctx(), limits)
  t.match(thrown, { ok: false, error: { errorType: 'runtime', code: 'UNKNOWN', message: 'broke in x', retryable: true, fatal: false } })

  const syncThrow = await runTool(tool(() => { throw new Error('sync') }), { n: 1 }, ws.ctx(), limits)
  t.match(syncThrow, { ok: false, error: { errorType: 'runtime', message: 'sync' } }, 'a synchronous throw is caught too')

  const failure = await runTool(tool(async () => { throw new ToolFailure('RATE_LIMITED', 'slow down') }), { n: 1 }, ws.ctx(), limits)
  t.match(failure, { ok: false, error: { errorType: 'runtime', code: 'RATE_LIMITED', message: 'slow down' } })

  const logical = await runTool(tool(async () => ({ ok: false, code: 'NOT_FOUND', error: 'no such thing', path: 'a.txt' })), { n: 1 }, ws.ctx(), limits)
  t.match(logical, { ok: false, error: { errorType: 'logical', code: 'NOT_FOUND', message: 'no such thing', detail: { path: 'a.txt' } } })
})

t.test("the tool's own advice reaches the model, also for the timeout the runtime reports for it", async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const advised = (execute: Tool<typeof Params>['execute']): Tool<typeof Params> => ({
    ...tool(execute),
    recommend: ({ code, input }) => (code === 'TIMEOUT' || code === 'RATE_LIMITED' ? [`${code} on n=${(input as { n: number }).n}`] : undefined)
  })
  const limited = await runTool(advised(async () => { throw new ToolFailure('RATE_LIMITED', 'slow down') }), { n: 3 }, ws.ctx(), limits)
  t.match(limited, { ok: false, error: { code: 'RATE_LIMITED', recommendations: ['RATE_LIMITED on n=3'] } })
  const hung = await runTool(advised(() => new Promise(() => {})), { n: 4 }, ws.ctx(), { timeoutMs: 50, maxOutputBytes: 1000 })
  t.match(hung, { ok: false, error: { code: 'TIMEOUT', recommendations: ['TIMEOUT on n=4'] } })
  const other = await runTool(advised(async () => { throw new ToolFailure('CONFIG_ERROR', 'not set up') }), { n: 5 }, ws.ctx(), limits)
  t.match(other, { ok: false, error: { code: 'CONFIG_ERROR', recommendations: [/not configured on this server/] } }, 'the general advice where the tool has none')
})

t.test('a tool that hangs ignoring its signal ends as TIMEOUT by its deadline, the event loop ticking', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const ticker = tickCounter(10)
  t.teardown(ticker.stop)
  let sawAbort = false
  const started = Date.now()
  const outcome = await runTool(
    tool((_input, ctx) => {
      ctx.signal.addEventListener('abort', () => (sawAbort = true))
      return new Promise(() => {})
    }),
    { n: 1 },
    ws.ctx(),
    limits
  )
  const elapsed = Date.now() - started
  t.match(outcome, { ok: false, error: { errorType: 'aborted', code: 'TIMEOUT', retryable: false, detail: { timeoutMs: 300 } } })
  t.ok(elapsed >= 290 && elapsed < 300 + 1000, `settled after ${elapsed} ms`)
  t.ok(sawAbort, 'the tool’s signal fired')
  t.ok(ticker.ticks() >= 5, `the main thread kept ticking (${ticker.ticks()} ticks)`)
})

t.test('a late result after the timeout is dropped', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const outcome = await runTool(
    tool(() => new Promise((resolve, reject) => setTimeout(() => reject(new Error('too late')), 400))),
    { n: 1 },
    { ...ws.ctx() },
    { timeoutMs: 50, maxOutputBytes: 100 }
  )
  t.match(outcome, { ok: false, error: { code: 'TIMEOUT' } })
  await new Promise((r) => setTimeout(r, 400))
})

t.test("the caller's abort stops the call as aborted", async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const caller = new AbortController()
  setTimeout(() => caller.abort(), 30)
  const outcome = await runTool(tool(() => new Promise(() => {})), { n: 1 }, ws.ctx(caller.signal), { timeoutMs: 5000, maxOutputBytes: 100 })
  t.match(outcome, { ok: false, error: { errorType: 'aborted', code: 'UNKNOWN', detail: { reason: 'interrupted' } } })
  t.ok(outcome.durationMs < 1000)

  const already = await runTool(tool(async () => 'ran'), { n: 1 }, ws.ctx(AbortSignal.abort()), limits)
  t.match(already, { ok: false, error: { errorType: 'aborted' } }, 'an already aborted call does not run')
})

t.test('results are capped with a note', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const big = 'é'.repeat(5000)
  const outcome = await runTool(tool(async () => big), { n: 1 }, ws.ctx(), limits)
  t.equal(outcome.ok, true)
  if (!outcome.ok) return
  t.equal(outcome.truncated, true)
  const text = outcome.result as string
  t.ok(text.startsWith('é'.repeat(500)), 'the kept part is whole characters')
  t.match(text, /\[output truncated: showing the first 1000 of 10000 bytes\]$/)

  const object = capResult({ items: Array.from({ length: 500 }, (_, i) => i) }, 100)
  t.equal(object.ok && object.truncated, true)
  t.match(object.ok && object.result, /^\{"items":\[0,1,2/)

  t.same(capResult({ small: true }, 100), { ok: true, result: { small: true }, truncated: false })
  t.same(capResult(undefined, 100), { ok: true, result: null, truncated: false })
  const circular: Record<string, unknown> = {}
  circular['self'] = circular
  t.match(capResult(circular, 100), { ok: false, error: { errorType: 'runtime', code: 'UNKNOWN' } })
})

t.test('the detail of a logical failure is capped too', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const outcome = await runTool(tool(async () => ({ ok: false, error: 'failed', stdout: 'x'.repeat(5000) })), { n: 1 }, ws.ctx(), limits)
  t.match(outcome, { ok: false, error: { errorType: 'logical', detail: { truncated: true } } })
})

t.test('the concurrency limiter runs at most max calls per key, keys independently', async (t) => {
  const limiter = createConcurrencyLimiter(2)
  let running = 0
  let peak = 0
  const job = async () => {
    running++
    peak = Math.max(peak, running)
    await new Promise((r) => setTimeout(r, 20))
    running--
    return 'done'
  }
  const other = limiter.run('ses_b', async () => limiter.active('ses_a'))
  const results = await Promise.all([...Array.from({ length: 5 }, () => limiter.run('ses_a', job)), other])
  t.same(results.slice(0, 5), ['done', 'done', 'done', 'done', 'done'])
  t.equal(peak, 2)
  t.equal(limiter.active('ses_a'), 0)

  const blocker = limiter.run('ses_c', () => new Promise((r) => setTimeout(r, 50)))
  void limiter.run('ses_c', () => new Promise((r) => setTimeout(r, 50)))
  const queuedAbort = new AbortController()
  const queued = limiter.run('ses_c', async () => 'ran', queuedAbort.signal)
  t.equal(limiter.queued('ses_c'), 1)
  queuedAbort.abort(new Error('gave up'))
  await t.rejects(queued, /gave up/)
  t.equal(limiter.queued('ses_c'), 0)
  await blocker
  t.throws(() => createConcurrencyLimiter(0), RangeError)
})
