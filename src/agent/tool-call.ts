import { isDeepStrictEqual } from 'node:util'
import { newId } from '../ids.ts'
import { jsonDepth, MAX_JSON_DEPTH } from '../json-depth.ts'
import { wellFormedText } from '../whole-chars.ts'
import type { ClassifiedError } from '../schemas/common.ts'
import type { MessageRecord, MessageToolCall, StoreWrite, ToolCallRecord } from '../store/store.ts'
import { classified, classifyException } from '../errors/classified.ts'
import { classifyToolError, deniedByUser, toModelToolResult, toolInterrupted, toolNotFound } from '../tools/tool-errors.ts'
import type { ToolHookContext } from '../hooks/hooks.ts'
import { checkToolInput } from '../tools/json-schema.ts'
import { namePatternCovers, type ExecuteTool, type SessionTool, type SessionToolSet, type ToolOutcome } from '../tools/tool-set.ts'
import type { ApprovalDecision, ClientToolResult } from './run-coordinator.ts'
import { msSince, now, type RunContext } from './run-context.ts'

export type { ExecuteTool, ToolOutcome } from '../tools/tool-set.ts'

/** What a run's tool calls need besides the context: its tools and how to wait for people and clients. */
export interface ToolCallHooks {
  tools: SessionToolSet
  executeTool: ExecuteTool
  waitForApproval(call: ToolCallRecord, signal: AbortSignal): Promise<ApprovalDecision>
  waitForToolResult(call: ToolCallRecord, signal: AbortSignal): Promise<ClientToolResult>
}

/** Thrown when the run was interrupted during a call (which is sealed by then). */
export class CallInterrupted extends Error {
  constructor() {
    super('interrupted')
  }
}

/** A tool call about to start: its record, and the writes that announce it, which the caller commits before runToolCall. */
export interface ToolCallStart {
  call: MessageToolCall
  record: ToolCallRecord
  parsed: ParsedArguments
  startedAt: number
  /**
   * The call goes straight to the runtime: a server tool with valid arguments that no preToolUse
   * hook screens and no approval holds. Its `executing` state is among `writes`, so it takes no
   * commit of its own.
   */
  direct: boolean
  /**
   * Direct, the tool only reads (Tool.readOnly) and no postToolUse hook covers it: the caller may
   * keep `writes` for the call's answer (RunContext.commitWithNext) and run it at once. A crash
   * before they commit leaves nothing behind, neither the call nor the step that asked for it.
   */
  readOnly: boolean
  writes: StoreWrite[]
}

/**
 * Prepares one tool call: its pending record and `tool:start`. The caller commits `writes` (the
 * loop puts the first call's in the step's own unit of work), then runs the call with runToolCall;
 * a read-only call's may wait for its answer's unit instead (`readOnly`).
 */
export function startToolCall(ctx: RunContext, hooks: ToolCallHooks, step: number, call: MessageToolCall, cut = false): ToolCallStart {
  const startedAt = Date.now()
  const parsed = parseArguments(call.arguments, cut)
  const record: ToolCallRecord = {
    id: call.id, sessionId: ctx.session.id, runId: ctx.run.id, step, name: call.name,
    input: parsed.ok ? parsed.value : call.arguments, state: 'pending', startedAt: new Date(startedAt).toISOString(),
    endedAt: null, durationMs: null
  }
  const writes = [saveCall(record), ctx.event('progress', 'tool:start', { call: snapshot(record) })]
  const tool = hooks.tools.get(call.name)
  const direct = parsed.ok && tool?.kind === 'server' &&
    !ctx.deps.hooks?.screens(call.name) && !approvalNeeded(ctx, call.name, false)
  if (direct) {
    record.state = 'executing'
    writes.push(saveCall(record))
  }
  // A call no hook hears of: a postToolUse hook is told of a call only once its start is stored.
  const readOnly = direct && tool?.kind === 'server' && tool.tool.readOnly === true && !ctx.deps.hooks?.reviews(call.name)
  return { call, record, parsed, startedAt, direct, readOnly, writes }
}

/**
 * Commits a call's start (with `writes`, what goes with it: the step's own unit for its first
 * call) before the call runs; a read-only call's is kept for its answer's unit instead, and the
 * call runs at once (Decisions, "What a run waits for").
 */
export async function commitStart(ctx: RunContext, start: ToolCallStart, writes: StoreWrite[] = start.writes): Promise<void> {
  if (start.readOnly) ctx.commitWithNext(writes)
  else await ctx.commit(writes)
}

/**
 * Runs one tool call, whose start (startToolCall) is committed, through approval, the client or
 * the runtime, and returns the tool message that answers it. The call's final state, its events
 * and its answer commit as one unit of work, handed over without waiting (RunContext.commitSoon).
 */
export async function runToolCall(ctx: RunContext, hooks: ToolCallHooks, start: ToolCallStart): Promise<MessageRecord> {
  const { call, record, parsed, startedAt } = start
  const tool = hooks.tools.get(call.name)
  const span = ctx.trace.startToolCall(call.name, call.id, tool !== undefined)

  let outcome: ToolOutcome
  try {
    const screened = tool && parsed.ok ? await preToolUse(ctx, record, tool) : null
    const approval = tool && parsed.ok && screened?.ok !== false ? await approve(ctx, hooks, record, screened?.ask ?? false) : null
    if (!tool) {
      outcome = { ok: false, error: toolNotFound(call.name, hooks.tools.names) }
    } else if (!parsed.ok) {
      outcome = { ok: false, error: invalidArguments(call.name, parsed.message, parsed.cut) }
    } else if (screened?.ok === false) {
      outcome = { ok: false, error: screened.error }
    } else if (approval?.decision === 'deny') {
      outcome = { ok: false, error: deniedByUser(call.name, approval.note) }
    } else if (tool.kind === 'client') {
      // The input a preToolUse hook may have rewritten.
      const invalid = tool.check(record.input)
      outcome = invalid ? { ok: false, error: invalid } : await awaitClient(ctx, hooks, record, tool)
    } else {
      if (!start.direct) {
        record.state = 'executing'
        await ctx.commit([saveCall(record)])
      }
      outcome = await hooks.executeTool(record, ctx.signal, (type, data) =>
        ctx.emit('progress', `tool:${type}`, { callId: record.id, name: record.name, ...data }))
    }
  } catch (err) {
    if (ctx.signal.aborted) {
      span.end({ ok: false, error: toolInterrupted(call.name) })
      await sealCall(ctx, record, toolInterrupted(call.name), startedAt)
      throw err
    }
    outcome = { ok: false, error: classifyException(err, 'tool') }
  }
  span.end(outcome)
  if (ctx.signal.aborted && !outcome.ok && outcome.error.errorType === 'aborted') {
    await sealCall(ctx, record, outcome.error, startedAt)
    throw new CallInterrupted()
  }

  record.endedAt = now()
  record.durationMs = msSince(startedAt)
  if (outcome.ok) {
    record.state = 'completed'
    record.result = outcome.result
  } else {
    record.state = outcome.error.code === 'DENIED_BY_USER' ? 'denied' : 'failed'
    record.error = outcome.error
  }
  // postToolUse hooks may replace what the model reads; the call keeps its own result.
  const shown = await postToolUse(ctx, record, outcome.ok ? outcome.result : toModelToolResult(outcome.error))
  const message = toolMessage(ctx.session.id, ctx.run.id, record.id, shown)
  const writes: StoreWrite[] = []
  if (outcome.ok) {
    writes.push(saveCall(record), ctx.event('monitor', 'tool_executed', { call: snapshot(record), durationMs: record.durationMs, ok: true }))
  } else {
    writes.push(
      saveCall(record),
      ctx.event('progress', 'tool:error', { call: snapshot(record), error: outcome.error }),
      ctx.event('monitor', 'error', { severity: 'warn', phase: 'tool', message: outcome.error.message, detail: outcome.error }),
      ctx.event('monitor', 'tool_executed', { call: snapshot(record), durationMs: record.durationMs, ok: false })
    )
  }
  writes.push(ctx.event('progress', 'tool:end', { call: snapshot(record) }), { type: 'message', message })
  // The next model call, which reads this answer, goes out while it is committed.
  ctx.commitSoon(writes)
  return message
}

/** The operator's preToolUse hooks; a rewritten input replaces the call's input (its schema checked again). */
async function preToolUse(ctx: RunContext, record: ToolCallRecord, tool: SessionTool) {
  if (!ctx.deps.hooks) return null
  const check = (input: unknown) => {
    if (tool.kind === 'client') return tool.check(input)
    // A schema the runtime's check passes through (an MCP tool's allOf or pattern) is checked
    // whole by the tool: a rewrite it refuses is the hook's mistake, not the model's.
    const invalid = checkToolInput(tool.name, tool.tool.parameters, input)
    if (invalid) return invalid
    const whole = tool.tool.checkInput?.(input)
    return whole ? classifyToolError(tool.tool, whole, input) : null
  }
  const verdict = await ctx.deps.hooks.beforeToolUse(hookContext(ctx, record), check)
  if (verdict.ok && verdict.input !== undefined) record.input = verdict.input
  return verdict
}

async function postToolUse(ctx: RunContext, record: ToolCallRecord, output: unknown): Promise<unknown> {
  return ctx.deps.hooks ? ctx.deps.hooks.afterToolUse(hookContext(ctx, record), output) : output
}

function hookContext(ctx: RunContext, record: ToolCallRecord): ToolHookContext {
  return {
    sessionId: ctx.session.id, runId: ctx.run.id, requestId: ctx.run.requestId, signal: ctx.signal,
    call: { ...snapshot(record), id: record.id, name: record.name, input: record.input },
    emit: (channel, type, data) => ctx.emit(channel, type, data)
  }
}

/** Waits for a person's decision when the session's approval policy (or a hook's ask) covers this call; allows it otherwise. */
async function approve(ctx: RunContext, hooks: ToolCallHooks, record: ToolCallRecord, askedByHook: boolean): Promise<ApprovalDecision> {
  if (!approvalNeeded(ctx, record.name, askedByHook)) return { decision: 'allow', note: null }
  record.state = 'approval_required'
  await ctx.commit([
    saveCall(record), ...ctx.statusChange('awaiting_approval'), ctx.event('control', 'permission_required', { call: snapshot(record) })
  ])
  const { decision, note } = await hooks.waitForApproval(record, ctx.signal)
  await ctx.commit([ctx.event('control', 'permission_decided', { callId: record.id, decision, note }), ...ctx.statusChange('running')])
  return { decision, note }
}

// approval.tools takes patterns as a hook's tools do: `github__*`, taken as a literal name, matched no
// tool, and the calls it was meant to hold ran unasked.
function approvalNeeded(ctx: RunContext, toolName: string, askedByHook: boolean): boolean {
  const { approval } = ctx.session
  return askedByHook || approval.mode === 'always' || (approval.mode === 'tools' && (approval.tools ?? []).some((pattern) => namePatternCovers(pattern, toolName)))
}

async function awaitClient(
  ctx: RunContext, hooks: ToolCallHooks, record: ToolCallRecord, tool: Extract<SessionTool, { kind: 'client' }>
): Promise<ToolOutcome> {
  record.state = 'executing'
  await ctx.commit([
    saveCall(record), ...ctx.statusChange('awaiting_tool_result'), ctx.event('control', 'tool_result_required', { call: snapshot(record) })
  ])
  const answer = await hooks.waitForToolResult(record, ctx.signal)
  await ctx.setStatus('running')
  return clientOutcome(tool, answer)
}

/** A client tool call's outcome from what the client posted: its output as the tool's (outcomeOf), or the error it reported. */
export function clientOutcome(tool: Extract<SessionTool, { kind: 'client' }>, answer: ClientToolResult): ToolOutcome {
  if ('error' in answer) {
    return {
      ok: false,
      error: classified({
        errorType: 'runtime', code: 'UNKNOWN', message: `The client's ${tool.name} failed: ${answer.error}`,
        recommendations: [`The client reported an error from ${tool.name}; check its input or try another way.`]
      })
    }
  }
  return tool.outcomeOf(answer.output)
}

/**
 * Whether a stored call ended with this outcome (runToolCall stores a call's outcome so): completed
 * with the same result, as the store gives it back (JSON), or failed with the same error message.
 */
export function endedWith(call: ToolCallRecord, outcome: ToolOutcome): boolean {
  if (outcome.ok) return call.state === 'completed' && isDeepStrictEqual(call.result, JSON.parse(JSON.stringify(outcome.result) ?? 'null'))
  return call.state === 'failed' && call.error?.message === outcome.error.message
}

/** Gives an unfinished call its final, sealed result so the history never holds a call without an answer. */
export async function sealCall(ctx: RunContext, record: ToolCallRecord, error: ClassifiedError, startedAt: number): Promise<void> {
  record.state = 'sealed'
  record.error = error
  record.endedAt = now()
  record.durationMs = msSince(startedAt)
  await ctx.commit([
    saveCall(record),
    { type: 'message', message: toolMessage(ctx.session.id, ctx.run.id, record.id, toModelToolResult(error)) },
    ctx.event('progress', 'tool:end', { call: snapshot(record) })
  ])
}

/** The call's current state as a write (the record is copied when the write is prepared). */
function saveCall(record: ToolCallRecord): StoreWrite {
  return { type: 'toolCall', call: { ...record } }
}

type ParsedArguments = { ok: true; value: unknown } | { ok: false; message: string; cut?: boolean }

/**
 * The model's arguments text as a value; text that is not JSON, or nests too deep to store, is
 * refused (the raw text is kept as the call's input). `cut`: the answer ended at the model's
 * output limit (finish_reason `length`), so JSON that does not parse was most likely cut there.
 */
function parseArguments(text: string, cut = false): ParsedArguments {
  if (text.trim() === '') return { ok: true, value: {} }
  if (jsonDepth(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH) {
    return { ok: false, message: `they nest arrays and objects deeper than ${MAX_JSON_DEPTH} levels` }
  }
  try {
    return { ok: true, value: JSON.parse(text) }
  } catch (err) {
    if (cut) return { ok: false, cut, message: `they are not whole JSON: your answer was cut at your output limit before they ended (${(err as Error).message}), so the call was not run` }
    return { ok: false, message: `they are not valid JSON: ${(err as Error).message}` }
  }
}

function invalidArguments(toolName: string, reason: string, cut = false): ClassifiedError {
  return classified({
    errorType: 'validation', code: 'VALIDATION_ERROR',
    message: `The arguments of ${toolName} were refused: ${reason}`,
    recommendations: cut
      ? [
          `Call ${toolName} again with shorter arguments: your output limit cannot hold these whole (split large content into smaller parts, over several calls).`,
          'Make fewer tool calls in one answer, and keep your text before them short: they share the same output limit.'
        ]
      : [`Call ${toolName} again with its arguments as one JSON object matching its parameters schema (nested at most ${MAX_JSON_DEPTH} levels deep).`],
    ...(cut ? { detail: { reason: 'output_truncated' } } : {})
  })
}

/**
 * A tool message answering one call; content is the result as the model will read it. A text
 * result's lone surrogates (an MCP server's or webhook's `\ud83d` escape) become U+FFFD, as the
 * store keeps them: the run's next request carries this message as it is, and a strict server
 * refused it. JSON text escapes them itself.
 */
export function toolMessage(sessionId: string, runId: string, callId: string, content: unknown): MessageRecord {
  return {
    id: newId('msg'), sessionId, runId, role: 'tool', toolCallId: callId,
    content: typeof content === 'string' ? wellFormedText(content) : JSON.stringify(content ?? null), createdAt: now()
  }
}

/** The ToolCallSnapshot of SPEC 4. */
export function snapshot(call: ToolCallRecord): Record<string, unknown> {
  const view: Record<string, unknown> = {
    id: call.id, name: call.name, input: call.input, state: call.state, startedAt: call.startedAt,
    endedAt: call.endedAt, durationMs: call.durationMs
  }
  if (call.result !== undefined) view.result = call.result
  if (call.error !== undefined) view.error = call.error
  return view
}
