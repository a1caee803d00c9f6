import pino from 'pino'
import t from 'tap'
import { LocalRunCoordinator } from '../../src/agent/local-run-coordinator.ts'
import { RunManager } from '../../src/agent/run-manager.ts'
import { LocalEventBus } from '../../src/events/event-bus.ts'
import { EventLog } from '../../src/events/event-log.ts'
import { createModelError } from '../../src/model/model-errors.ts'
import type { ModelProvider, ModelRequest, ModelStreamPart } from '../../src/model/types.ts'
import { emptyUsage } from '../../src/schemas/common.ts'
import { SqliteStore } from '../../src/store/sqlite.ts'
import type { EventRecord, SessionRecord } from '../../src/store/store.ts'
import { NO_TRACING } from '../../src/telemetry/tracing.ts'
import type { ExecuteTool, SessionToolSet } from '../../src/tools/tool-set.ts'
import type { Tool } from '../../src/tools/types.ts'
import type { TapTest } from '../helpers/app.ts'

/**
 * The run loop on its own: a scripted in-process model (a list of turns) and the in-process
 * ports, with no HTTP in between. The HTTP tests (test/routes, test/agent/tool-calls) cover the
 * same behaviour through the API against the dev model server.
 */
type Turn = ModelStreamPart[] | Error | ((signal: AbortSignal, request: ModelRequest) => AsyncIterable<ModelStreamPart>)

function scriptedModel(turns: Turn[]): ModelProvider & { requests: ModelRequest[] } {
  const requests: ModelRequest[] = []
  return {
    kind: 'dev',
    requests,
    async * stream(request, options) {
      requests.push(structuredClone(request))
      // A turn that is a function answers every request from then on (it may look at the request).
      const next = typeof turns[0] === 'function' ? turns[0] : turns.shift()
      const turn = next ?? [{ type: 'text', delta: 'default' }, { type: 'finish', finishReason: 'stop', usage: null }]
      if (turn instanceof Error) throw turn
      if (typeof turn === 'function') {
        yield * turn(options.signal, request)
        return
      }
      yield * turn
    },
    async close() {}
  }
}

const text = (delta: string): ModelStreamPart[] => [{ type: 'text', delta }, { type: 'finish', finishReason: 'stop', usage: { inputTokens: 3, outputTokens: 2, totalTokens: 5 } }]

/** One tool, `echo`, run in process: its executor answers with the input. */
const echoTools: SessionToolSet = {
  names: ['echo'],
  definitions: [{ type: 'function', function: { name: 'echo', parameters: { type: 'object' } } }],
  get: (name) => (name === 'echo' ? { kind: 'server', name, tool: { name, description: 'echo', parameters: {} as never, execute: async () => ({}) } } as never : undefined)
}

/** The tools a harness offers and how it runs them; by default `echo`, answering with its input. */
interface HarnessTools {
  tools: SessionToolSet
  execute: ExecuteTool
}

async function harness(t: TapTest, turns: Turn[], session: Partial<SessionRecord> = {}, tools?: HarnessTools) {
  const store = new SqliteStore(':memory:')
  await store.migrate()
  const bus = new LocalEventBus()
  const events = new EventLog(store, bus)
  const coordinator = new LocalRunCoordinator({ store, bus })
  const model = scriptedModel(turns)
  const runs = new RunManager({
    store, events, coordinator, model, logger: pino({ level: 'silent' }),
    retryPolicy: { baseMs: 1, capMs: 2, maxRetries: 2, maxWaitMs: 60_000 }, maxSteps: 5, maxActiveRunsPerTenant: 10, contextTokens: 100_000, tracing: NO_TRACING,
    resolveTools: async () => tools?.tools ?? echoTools,
    toolExecutor: async () => tools?.execute ?? (async (call) => ({ ok: true, result: { echoed: call.input } }))
  })
  t.teardown(async () => {
    await runs.drain(0)
    await coordinator.close()
    await store.close()
  })
  const now = new Date().toISOString()
  const record: SessionRecord = {
    id: 'ses_LOOP', tenant: 't', createdAt: now, updatedAt: now, status: 'idle', model: 'm', instructions: 'Be brief.', tools: null,
    approval: { mode: 'auto' }, limits: {}, metadata: {}, lastSeq: 0, usage: emptyUsage(), forkedFrom: null, ...session
  }
  await store.createSession(record)
  const seen: EventRecord[] = []
  bus.subscribe(record.id, (event) => seen.push(event))
  const send = (content: string, onBusy: 'reject' | 'enqueue' | 'interrupt' = 'reject') =>
    runs.submit({ session: record, content, onBusy, requestId: 'req_test' })
  return { store, bus, runs, model, session: record, seen, send }
}

t.test('a tool call and its answer: the model sees the tool result, events come in seq order', async (t) => {
  const h = await harness(t, [
    [{ type: 'tool_call', id: 'x', name: 'echo', arguments: '{"a":1}' }, { type: 'finish', finishReason: 'tool_calls', usage: null }],
    text('done')
  ])
  const { run } = await h.send('go')
  const ended = await h.runs.waitFor(h.session.id, run.id)
  t.match(ended, { status: 'completed', steps: 2 })
  t.same(h.seen.map((e) => e.seq), h.seen.map((_, i) => i + 1), 'published gap-free, in order')
  t.same(h.seen.map((e) => e.type), [
    'state_changed', 'token_usage', 'tool:start', 'tool_executed', 'tool:end', 'step_complete',
    'text_chunk_start', 'text_chunk', 'text_chunk_end', 'token_usage', 'step_complete', 'state_changed', 'done'
  ])
  const second = h.model.requests[1]?.messages ?? []
  t.match(second.at(-1), { role: 'tool', content: JSON.stringify({ echoed: { a: 1 } }) }, 'the tool result goes back to the model')
  t.match(second[0], { role: 'system', content: 'Be brief.' })
})

t.test('a retryable model error is retried with a model_retry event; a fatal one fails the run', async (t) => {
  const h = await harness(t, [
    createModelError('SERVER_ERROR', 'upstream 503', { status: 503 }),
    text('after retry'),
    createModelError('AUTHENTICATION_ERROR', 'bad key', { status: 401 })
  ])
  const first = await h.send('a')
  t.match(await h.runs.waitFor(h.session.id, first.run.id), { status: 'completed' })
  t.match(h.seen.find((e) => e.type === 'model_retry')?.data, { attempt: 1, code: 'SERVER_ERROR', status: 503 })
  const second = await h.send('b')
  const failed = await h.runs.waitFor(h.session.id, second.run.id)
  t.match(failed, { status: 'failed', error: { code: 'AUTHENTICATION_ERROR', fatal: true, retryable: false } })
  t.match(h.seen.at(-1), { type: 'done', data: { reason: 'failed' } })
})

t.test('runs are answered in the order accepted; interrupt cancels every earlier run, the newest wins', async (t) => {
  // Hangs until interrupted, but answers the third message.
  const model = (signal: AbortSignal, request: ModelRequest) => (async function * () {
    if (request.messages.at(-1)?.content === '3') {
      yield * text('third')
      return
    }
    yield { type: 'text', delta: 'working' } as ModelStreamPart
    await new Promise((_, reject) => {
      if (signal.aborted) reject(signal.reason)
      signal.addEventListener('abort', () => reject(signal.reason), { once: true })
    })
  })()
  const h = await harness(t, [model])
  const first = await h.send('1')
  const [second, third] = await Promise.all([h.send('2', 'interrupt'), h.send('3', 'interrupt')])
  const ended = await Promise.all([first, second, third].map(({ run }) => h.runs.waitFor(h.session.id, run.id)))
  t.same(ended.map((r) => r?.status), ['cancelled', 'cancelled', 'completed'], 'the older interrupt is cancelled by the newer one')
  const done = h.seen.filter((e) => e.type === 'done').map((e) => e.runId)
  t.same(done, [first.run.id, second.run.id, third.run.id], 'and every run ends in the order it was accepted')
})

t.test('an approval and a client result reach the call that waits; others are NOT_AWAITING', async (t) => {
  const h = await harness(t, [
    [{ type: 'tool_call', id: 'x', name: 'echo', arguments: '{}' }, { type: 'finish', finishReason: 'tool_calls', usage: null }],
    text('ok')
  ], { approval: { mode: 'always' } })
  const { run } = await h.send('go')
  const paused = await h.runs.waitFor(h.session.id, run.id, { untilPause: true })
  t.equal(paused?.status, 'awaiting_approval', 'waiting until a pause answers at the pause')
  const callId = h.seen.find((e) => e.type === 'permission_required')?.data.call as { id: string }
  await t.rejects(h.runs.decide(h.session.id, 'call_other', { decision: 'allow', note: null }), { code: 'NOT_AWAITING' })
  await t.rejects(h.runs.submitToolResult(h.session.id, callId.id, { output: 1 }), { code: 'NOT_AWAITING' }, 'an approval is not a client result')
  await h.runs.decide(h.session.id, callId.id, { decision: 'allow', note: 'fine' })
  t.match(await h.runs.waitFor(h.session.id, run.id), { status: 'completed' })
  t.match(h.seen.find((e) => e.type === 'permission_decided')?.data, { decision: 'allow', note: 'fine' })
})

t.test('after a restart, a run left running is failed with its calls sealed and a queued one runs', async (t) => {
  const h = await harness(t, [text('recovered answer')])
  const now = new Date().toISOString()
  const base = { sessionId: h.session.id, requestId: 'req_old', steps: 1, usage: emptyUsage(), error: null, createdAt: now, endedAt: null }
  await h.store.commit([
    { type: 'newRun', run: { ...base, id: 'run_A', status: 'running', messageId: 'msg_A', input: 'a', startedAt: now } },
    { type: 'message', message: { id: 'msg_A', sessionId: h.session.id, runId: 'run_A', role: 'user', content: 'a', createdAt: now } },
    { type: 'message', message: { id: 'msg_A2', sessionId: h.session.id, runId: 'run_A', role: 'assistant', content: null, createdAt: now, toolCalls: [{ id: 'call_open', name: 'echo', arguments: '{}' }] } },
    { type: 'newRun', run: { ...base, id: 'run_B', status: 'queued', messageId: 'msg_B', input: 'b', startedAt: null, steps: 0 } }
  ])
  t.same(await h.runs.recover(), { requeued: 1, failed: 1 })
  t.match(await h.runs.waitFor(h.session.id, 'run_A'), { status: 'failed', error: { errorType: 'exception', retryable: true } })
  t.match(await h.runs.waitFor(h.session.id, 'run_B'), { status: 'completed' })
  const recovered = h.seen.filter((e) => e.type === 'run_recovered').map((e) => e.data)
  // run_B never started (it waited its turn): it was not active, and gets no run_recovered (SPEC 8).
  t.match(recovered, [{ runId: 'run_A', previousStatus: 'running', sealedCalls: ['call_open'] }])
  t.equal(recovered.length, 1)
  const messages = await h.store.listMessages(h.session.id)
  t.ok(messages.some((m) => m.role === 'tool' && m.toolCallId === 'call_open'), 'the open call has its sealed answer')
})

t.test('a call sealed by a takeover from a peer whose clock runs ahead has a duration of 0, never a negative one', async (t) => {
  const h = await harness(t, [])
  const now = new Date().toISOString()
  const ahead = new Date(Date.now() + 10 * 60_000).toISOString()
  await h.store.commit([
    { type: 'newRun', run: { id: 'run_A', sessionId: h.session.id, requestId: 'req_old', status: 'running', steps: 1, usage: emptyUsage(), error: null, messageId: 'msg_A', input: 'a', createdAt: now, startedAt: now, endedAt: null } },
    { type: 'message', message: { id: 'msg_A', sessionId: h.session.id, runId: 'run_A', role: 'user', content: 'a', createdAt: now } },
    { type: 'message', message: { id: 'msg_A2', sessionId: h.session.id, runId: 'run_A', role: 'assistant', content: null, createdAt: now, toolCalls: [{ id: 'call_open', name: 'echo', arguments: '{}' }] } },
    { type: 'toolCall', call: { id: 'call_open', sessionId: h.session.id, runId: 'run_A', step: 1, name: 'echo', input: {}, state: 'executing', startedAt: ahead, endedAt: null, durationMs: null } }
  ])
  t.same(await h.runs.recover(), { requeued: 0, failed: 1 })
  const end = h.seen.find((e) => e.type === 'tool:end')?.data.call as { state: string; durationMs: number }
  t.match(end, { state: 'sealed', durationMs: 0 })
  t.equal((await h.store.getToolCall(h.session.id, 'call_open'))?.durationMs, 0, 'and so is the stored call')
})

t.test('a clock set back during a step gives durations of 0, never negative ones', async (t) => {
  const realNow = Date.now
  t.teardown(() => { Date.now = realNow })
  const h = await harness(t, [
    [{ type: 'tool_call', id: 'x', name: 'echo', arguments: '{}' }, { type: 'finish', finishReason: 'tool_calls', usage: null }],
    text('done')
  ], {}, {
    tools: echoTools,
    execute: async () => {
      // The wall clock steps back an hour (NTP) while the call runs.
      Date.now = () => realNow() - 3_600_000
      return { ok: true, result: {} }
    }
  })
  const { run } = await h.send('go')
  t.match(await h.runs.waitFor(h.session.id, run.id), { status: 'completed' })
  const durations = h.seen.filter((e) => ['step_complete', 'tool_executed'].includes(e.type)).map((e) => [e.type, e.data.durationMs])
  t.equal(durations.length, 3)
  for (const [type, ms] of durations) t.ok(typeof ms === 'number' && ms >= 0, `${type} lasted ${ms} ms`)
})

/** `peek` only reads (Tool.readOnly); `poke` may write. Both are run by `execute`. */
function peekAndPoke(execute: ExecuteTool): HarnessTools {
  const tool = (name: string, readOnly: boolean): Tool => ({ name, description: name, parameters: {} as never, execute: async () => ({}), ...(readOnly ? { readOnly } : {}) })
  const byName = new Map([['peek', tool('peek', true)], ['poke', tool('poke', false)]])
  return {
    tools: {
      names: [...byName.keys()],
      definitions: [...byName.keys()].map((name) => ({ type: 'function' as const, function: { name, parameters: { type: 'object' } } })),
      get: (name) => {
        const found = byName.get(name)
        return found ? { kind: 'server', name, tool: found } : undefined
      }
    },
    execute
  }
}

const callTools = (...names: string[]): ModelStreamPart[] => [
  ...names.map((name, i): ModelStreamPart => ({ type: 'tool_call', id: `c${i}`, name, arguments: '{}' })),
  { type: 'finish', finishReason: 'tool_calls', usage: null }
]

t.test('a read-only tool runs before its start is stored, and its start commits with its answer; a tool that may write runs once its start is stored', async (t) => {
  const storedWhenRun = new Map<string, string | null>()
  let store: SqliteStore | undefined
  const h = await harness(t, [callTools('peek', 'poke'), text('done')], {}, peekAndPoke(async (call) => {
    const stored = await store?.getToolCall(call.sessionId, call.id)
    storedWhenRun.set(call.name, stored?.state ?? null)
    return { ok: true, result: { ran: call.name } }
  }))
  store = h.store
  const { run } = await h.send('go')
  t.match(await h.runs.waitFor(h.session.id, run.id), { status: 'completed', steps: 2 })
  t.same(Object.fromEntries(storedWhenRun), { peek: null, poke: 'executing' }, 'what the store held of each call while it ran')
  t.same(h.seen.map((e) => e.seq), h.seen.map((_, i) => i + 1), 'published gap-free, in order')
  t.same(h.seen.map((e) => e.type), [
    'state_changed', 'token_usage', 'tool:start', 'tool_executed', 'tool:end', 'tool:start', 'tool_executed', 'tool:end', 'step_complete',
    'text_chunk_start', 'text_chunk', 'text_chunk_end', 'token_usage', 'step_complete', 'state_changed', 'done'
  ])
  const messages = await h.store.listMessages(h.session.id)
  t.same(messages.map((m) => m.role), ['user', 'assistant', 'tool', 'tool', 'assistant'], 'every answer after the call that asked for it')
  const calls = await Promise.all(messages[1]?.toolCalls?.map((c) => h.store.getToolCall(h.session.id, c.id)) ?? [])
  t.match(calls, [{ name: 'peek', state: 'completed', result: { ran: 'peek' } }, { name: 'poke', state: 'completed', result: { ran: 'poke' } }])
})

t.test('a read-only tool interrupted while it runs: its call is stored with its start and its sealed answer', async (t) => {
  let running: (callId: string) => void = () => undefined
  const started = new Promise<string>((resolve) => { running = resolve })
  const h = await harness(t, [callTools('peek')], {}, peekAndPoke((call, signal) => {
    running(call.id)
    return new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason), { once: true }))
  }))
  const { run } = await h.send('go')
  const runningId = await started
  t.equal(await h.store.getToolCall(h.session.id, runningId), null, 'nothing of the call is stored while it runs')
  t.notOk((await h.store.listMessages(h.session.id)).some((m) => m.role === 'assistant'), 'nor the step that asked for it')
  await h.runs.interrupt(h.session.id)
  t.match(await h.runs.waitFor(h.session.id, run.id), { status: 'cancelled' })
  const messages = await h.store.listMessages(h.session.id)
  t.same(messages.map((m) => m.role), ['user', 'assistant', 'tool'])
  const callId = messages[1]?.toolCalls?.[0]?.id ?? ''
  t.equal(callId, runningId)
  t.match(messages[2], { toolCallId: callId }, 'the call has its sealed answer')
  t.match(await h.store.getToolCall(h.session.id, callId), { name: 'peek', state: 'sealed', error: { errorType: 'aborted' } })
  const types = h.seen.map((e) => e.type)
  t.ok(types.indexOf('tool:start') < types.indexOf('tool:end') && types.indexOf('tool:end') < types.indexOf('done'), `start, end, then done: ${types.join(' ')}`)
})

t.test('a run that ends alone sends its answer\'s text before its end is stored; with another run going, both are stored together', async (t) => {
  // Holds a run until released when its message is 'hold'; any other gets a two-part answer, a
  // few ms later, as a model server would: by then the run's start is committed.
  let release: () => void = () => undefined
  const released = new Promise<void>((resolve) => { release = resolve })
  const model = (_signal: AbortSignal, request: ModelRequest) => (async function * () {
    if (request.messages.at(-1)?.content === 'hold') await released
    await new Promise((resolve) => setTimeout(resolve, 5))
    yield { type: 'text', delta: 'hel' } as ModelStreamPart
    yield * text('lo')
  })()
  const h = await harness(t, [model])
  // What the store holds of the run at the moment its first text_chunk is published.
  const statusAtText: Array<Promise<string | undefined>> = []
  t.teardown(h.bus.subscribe(h.session.id, (event) => {
    if (event.type !== 'text_chunk' || statusAtText.length > 0) return
    // The store reads at once: the promise carries what was committed at publication.
    statusAtText.push(h.store.getRun(h.session.id, event.runId ?? '').then((run) => run?.status))
  }))

  const alone = await h.send('go')
  t.match(await h.runs.waitFor(h.session.id, alone.run.id), { status: 'completed' })
  t.equal(await statusAtText[0], 'running', 'alone: the text went out in a commit of its own, before the run\'s end')
  t.same(h.seen.filter((e) => e.runId === alone.run.id).map((e) => e.type), [
    'state_changed', 'text_chunk_start', 'text_chunk', 'text_chunk', 'text_chunk_end', 'token_usage', 'step_complete', 'state_changed', 'done'
  ], 'and the events keep their order')

  // Another session's run holds on while this one answers: the text and the end share a commit.
  const other = { ...h.session, id: 'ses_OTHER' }
  await h.store.createSession(other)
  const held = await h.runs.submit({ session: other, content: 'hold', onBusy: 'reject', requestId: 'req_hold' })
  statusAtText.length = 0
  const busy = await h.send('go again')
  t.match(await h.runs.waitFor(h.session.id, busy.run.id), { status: 'completed' })
  t.equal(await statusAtText[0], 'completed', 'with another run going: committed with the run\'s end')
  release()
  t.match(await h.runs.waitFor(other.id, held.run.id), { status: 'completed' })
  t.same(h.seen.map((e) => e.seq), h.seen.map((_, i) => i + 1), 'published gap-free, in order')
})
