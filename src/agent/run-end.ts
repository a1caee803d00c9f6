import type { ClassifiedError } from '../schemas/common.ts'
import { unansweredCalls } from '../store/history.ts'
import { isSessionGone, type MessageToolCall, type RunStatus, type StoreWrite, type ToolCallRecord } from '../store/store.ts'
import { toolInterrupted } from '../tools/tool-errors.ts'
import { now, type RunContext, type RunPhase } from './run-context.ts'
import { sealCall } from './tool-call.ts'
import { isFinal } from './wait-for-run.ts'

export type DoneReason = 'completed' | 'interrupted' | 'failed' | 'max_steps'

/**
 * Records the end of the run as one unit of work: `leading` (a final answer), its error (if any),
 * its final status, then done.
 */
export async function closeRun(
  ctx: RunContext, status: RunStatus, reason: DoneReason, error: ClassifiedError | null, phase: RunPhase, leading: StoreWrite[] = []
): Promise<void> {
  const writes: StoreWrite[] = [...leading]
  if (error) {
    ctx.run.error = error
    writes.push(
      { type: 'run', id: ctx.run.id, patch: { error } },
      ctx.event('monitor', 'error', { severity: 'error', phase, message: error.message, detail: error })
    )
  }
  writes.push(...ctx.statusChange(status), ctx.event('progress', 'done', { step: ctx.step, reason, runId: ctx.run.id }))
  await ctx.commit(writes)
}

/**
 * Ends the run after a failure or interrupt, sealing its open calls; a store that fails here too
 * is logged, never thrown. Resolves with whether the end was recorded (or had nothing left to
 * record, its session gone): a run whose end was not stays unfinished in the store, and its
 * coordinator has it ended by the recovery once the store answers again (RunCoordinator.release).
 */
export async function endRun(
  ctx: RunContext, status: RunStatus, reason: DoneReason, error: ClassifiedError | null, phase: RunPhase = 'system'
): Promise<boolean> {
  try {
    // A unit whose answer was lost (its connection dropped after COMMIT went out) may have been
    // committed all the same: a run the store holds as ended has its done, and gets no second one.
    await ctx.settle()
    const stored = await ctx.deps.store.getRun(ctx.session.id, ctx.run.id)
    if (stored !== null && isFinal(stored.status)) {
      Object.assign(ctx.run, stored)
      return true
    }
    await sealOpenCalls(ctx)
    await closeRun(ctx, status, reason, error, phase)
    return true
  } catch (err) {
    const gone = isSessionGone(err)
    if (!gone) ctx.log.error({ err, status, reason }, 'could not record the end of the run')
    ctx.run.status = status
    ctx.run.error = error
    ctx.run.endedAt ??= now()
    return gone
  }
}

/** After an interrupt mid-step: every call of this run without a tool message gets one. */
export async function sealOpenCalls(ctx: RunContext): Promise<void> {
  for (const { call, record } of await openCalls(ctx)) {
    await sealCall(ctx, record, toolInterrupted(call.name), Date.parse(record.startedAt))
  }
}

/** This run's tool calls that have no tool message yet, with their stored state (or a new one). */
export async function openCalls(ctx: RunContext): Promise<Array<{ call: MessageToolCall; record: ToolCallRecord }>> {
  const { store } = ctx.deps
  // The run's units still on their way are its answers too: read back once they have landed.
  await ctx.settle()
  // The run's own messages are never among those a summary stands for (its user message is the current turn).
  const { messages } = await store.listContextMessages(ctx.session.id)
  const open: Array<{ call: MessageToolCall; record: ToolCallRecord }> = []
  for (const call of unansweredCalls(messages, ctx.run.id)) {
    const existing = await store.getToolCall(ctx.session.id, call.id)
    open.push({
      call,
      record: existing ?? {
        id: call.id, sessionId: ctx.session.id, runId: ctx.run.id, step: ctx.step, name: call.name,
        input: call.arguments, state: 'pending', startedAt: now(), endedAt: null, durationMs: null
      }
    })
  }
  return open
}
