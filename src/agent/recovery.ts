import type { ClassifiedError } from '../schemas/common.ts'
import type { RunRecord, SessionRecord } from '../store/store.ts'
import { classified } from '../errors/classified.ts'
import { now, RunContext, type RunDependencies } from './run-context.ts'
import { endRun, openCalls } from './run-end.ts'
import { sealCall } from './tool-call.ts'

/** The sealed result of a call that cannot finish any more (restart, fork). */
export function unfinishedCallError(toolName: string, because = 'the service stopped while it ran'): ClassifiedError {
  return classified({
    errorType: 'aborted', code: 'UNKNOWN', retryable: false,
    message: `${toolName} did not finish: ${because}`,
    recommendations: [`Its effects are unknown; check the state before calling ${toolName} again.`]
  })
}

/**
 * Ends a run whose owner is gone (a crash, kill -9, a peer that died) or could not record its end
 * (its store failed): announces it with run_recovered, seals every call that never got its
 * result, and fails the run. Resolves with whether the end was recorded (endRun), and the run as it ended.
 */
export async function abandonAfterRestart(session: SessionRecord, run: RunRecord, deps: RunDependencies): Promise<{ ended: boolean; run: RunRecord }> {
  const ctx = new RunContext(session, run, deps, new AbortController().signal)
  const { store } = deps
  const previousStatus = run.status
  ctx.step = run.steps
  try {
    // A run's own user message is never among those a summary stands for (it is the current turn).
    const { messages } = await store.listContextMessages(session.id)
    if (!messages.some((m) => m.id === run.messageId)) {
      await ctx.commit([{
        type: 'message',
        message: { id: run.messageId, sessionId: session.id, runId: run.id, role: 'user', content: run.input, createdAt: now() }
      }])
    }
    const open = await openCalls(ctx)
    await ctx.emit('monitor', 'run_recovered', { runId: run.id, previousStatus, sealedCalls: open.map((o) => o.call.id) })
    for (const { call, record } of open) await sealCall(ctx, record, unfinishedCallError(call.name), Date.parse(record.startedAt))
  } catch (err) {
    ctx.log.error({ err }, 'could not seal the calls of a recovered run')
  }
  const ended = await endRun(ctx, 'failed', 'failed', classified({
    errorType: 'exception', code: 'UNKNOWN', fatal: true, retryable: true,
    message: `The run was ended by recovery while it was ${previousStatus}: the process running it stopped, or could not store its end`,
    recommendations: ['Send the message again to continue; the conversation holds everything committed before the stop.']
  }))
  return { ended, run: ctx.run }
}
