import { randomUUID } from 'node:crypto'
import type { Logger } from 'pino'
import { classified } from '../errors/classified.ts'
import { truncateUtf8 } from '../tools/output.ts'
import { capResult } from '../tools/runtime.ts'
import { toModelToolResult } from '../tools/tool-errors.ts'
import { retryDelayMs, sleep, type RetryPolicy } from '../agent/retry.ts'
import { toRunView } from '../routes/views.ts'
import type { ClassifiedError } from '../schemas/common.ts'
import type { EventChannel, NewEvent, RunRecord } from '../store/store.ts'
import { hookCovers, type HookDefinition, type HookEvent } from './config.ts'
import { HookClient, HookFailure } from './delivery.ts'

/** Emits one event of the run a tool hook serves (RunExecution.emit). */
export type HookEmit = (channel: EventChannel, type: string, data: Record<string, unknown>) => Promise<unknown>

/** The tool call a tool hook is asked about, and the run it belongs to. */
export interface ToolHookContext {
  sessionId: string
  runId: string
  requestId: string
  /** The ToolCallSnapshot of SPEC 4 (with result or error for postToolUse). */
  call: { id: string; name: string; input: unknown } & Record<string, unknown>
  signal: AbortSignal
  emit: HookEmit
}

/** What the preToolUse hooks decided: go on (maybe through an approval, maybe with new input), or an error for the model. */
export type PreToolUseVerdict =
  | { ok: true; ask: boolean; input?: unknown }
  | { ok: false; error: ClassifiedError }

export interface HookRunnerOptions {
  hooks: readonly HookDefinition[]
  /** Where runEnd failures are reported (they happen after the run's own events). */
  events: { append(event: NewEvent): Promise<unknown> }
  logger: Logger
  /** runEnd attempts after the first, and their backoff; default 5 retries from 1 s, capped at 30 s. */
  runEndRetry?: Partial<RetryPolicy>
  client?: HookClient
  /** Bytes of a postToolUse replacement the model gets (AGENTD_TOOL_MAX_OUTPUT_BYTES), cut with a note like any tool result. */
  maxOutputBytes?: number
}

const DECISIONS = new Set(['allow', 'deny', 'ask'])
const defaultRunEndRetry: RetryPolicy = { maxRetries: 5, baseMs: 1000, capMs: 30_000, maxWaitMs: Number.POSITIVE_INFINITY }

/**
 * The operator's hooks (SPEC 15): preToolUse may allow, deny, ask or rewrite a call, postToolUse
 * may replace what the model sees, runEnd hears of every finished run. A hook that fails in any
 * way is reported (log and monitor `warn`) and the call goes on by its onFailure: nothing a hook
 * does can crash or stall a run beyond the hook's own timeout.
 */
export class HookRunner {
  readonly #hooks: readonly HookDefinition[]
  readonly #events: HookRunnerOptions['events']
  readonly #log: Logger
  readonly #retry: RetryPolicy
  readonly #client: HookClient
  readonly #maxOutputBytes: number
  /** runEnd deliveries still trying; drain() waits for them, then stops them. */
  readonly #pending = new Set<Promise<void>>()
  readonly #stopping = new AbortController()

  constructor(options: HookRunnerOptions) {
    this.#hooks = options.hooks
    this.#events = options.events
    this.#log = options.logger
    this.#retry = { ...defaultRunEndRetry, ...options.runEndRetry }
    this.#client = options.client ?? new HookClient()
    this.#maxOutputBytes = options.maxOutputBytes ?? 100_000
  }

  /** True when some preToolUse hook covers the tool: its calls are screened before they run. */
  screens(toolName: string): boolean {
    return this.#matching('preToolUse', toolName).length > 0
  }

  /** True when some postToolUse hook covers the tool: its calls' outputs go to the hook before the model. */
  reviews(toolName: string): boolean {
    return this.#matching('postToolUse', toolName).length > 0
  }

  #matching(on: HookEvent, toolName?: string): HookDefinition[] {
    return this.#hooks.filter((hook) => hook.on === on && (toolName === undefined || hookCovers(hook, toolName)))
  }

  /**
   * Asks every preToolUse hook that covers the tool, in file order: the first deny wins, any ask
   * turns the call into an approval, and each `input` replaces the arguments the next hook (and
   * the tool) sees. Rewritten input is checked with `check` (the tool's schema).
   */
  async beforeToolUse(ctx: ToolHookContext, check: (input: unknown) => ClassifiedError | null): Promise<PreToolUseVerdict> {
    let input = ctx.call.input
    let rewritten = false
    let ask = false
    for (const hook of this.#matching('preToolUse', ctx.call.name)) {
      let answer: PreToolUseAnswer
      try {
        answer = preToolUseAnswer(await this.#client.deliver({
          hook, requestId: ctx.requestId, signal: ctx.signal,
          payload: { sessionId: ctx.sessionId, runId: ctx.runId, call: { ...ctx.call, input } }
        }))
      } catch (err) {
        if (!(err instanceof HookFailure)) throw err
        const decision = hook.onFailure === 'deny' ? 'deny' : 'allow'
        await this.#reportToolHookFailure(ctx, hook, err, decision === 'deny' ? 'the call is denied (onFailure: deny)' : 'the call goes on (onFailure: continue)')
        await ctx.emit('control', 'hook_decided', { hook: hook.name, callId: ctx.call.id, decision, reason: `the hook failed: ${err.message}` })
        if (decision === 'deny') return { ok: false, error: deniedByHook(ctx.call.name, hook, `the hook failed (${err.message}) and its onFailure is deny`) }
        continue
      }
      const decided: Record<string, unknown> = { hook: hook.name, callId: ctx.call.id, decision: answer.decision, reason: answer.reason ?? null }
      if (answer.input !== undefined && answer.decision !== 'deny') decided.input = answer.input
      await ctx.emit('control', 'hook_decided', decided)
      if (answer.decision === 'deny') return { ok: false, error: deniedByHook(ctx.call.name, hook, answer.reason ?? null) }
      if (answer.decision === 'ask') ask = true
      if (answer.input !== undefined) {
        input = answer.input
        rewritten = true
        const invalid = check(input)
        if (invalid) {
          const failure = new HookFailure('HOOK_INVALID_RESPONSE', `its input fails the parameters schema of ${ctx.call.name}`, false, { input })
          await this.#reportToolHookFailure(ctx, hook, failure, 'the call fails with VALIDATION_ERROR')
          return { ok: false, error: rewriteInvalid(ctx.call.name, hook, invalid) }
        }
      }
    }
    return rewritten ? { ok: true, ask, input } : { ok: true, ask }
  }

  /**
   * Lets every postToolUse hook that covers the tool replace `output`, what the model will read
   * (the result, or the error as the model sees it). A failed hook with onFailure deny withholds
   * the output: a redaction hook that is down must not let the secret through.
   */
  async afterToolUse(ctx: ToolHookContext, output: unknown): Promise<unknown> {
    let shown = output
    for (const hook of this.#matching('postToolUse', ctx.call.name)) {
      let answer: { output?: unknown }
      try {
        answer = postToolUseAnswer(await this.#client.deliver({
          hook, requestId: ctx.requestId, signal: ctx.signal,
          payload: { sessionId: ctx.sessionId, runId: ctx.runId, call: ctx.call, output: shown }
        }))
      } catch (err) {
        if (!(err instanceof HookFailure)) throw err
        const withhold = hook.onFailure === 'deny'
        await this.#reportToolHookFailure(ctx, hook, err, withhold ? 'the output is withheld from the model (onFailure: deny)' : 'the model gets the output unchanged (onFailure: continue)')
        await ctx.emit('control', 'hook_decided', {
          hook: hook.name, callId: ctx.call.id, decision: withhold ? 'withhold' : 'keep', reason: `the hook failed: ${err.message}`
        })
        if (withhold) return toModelToolResult(outputWithheld(ctx.call.name, hook, err.message))
        continue
      }
      const replaced = 'output' in answer
      await ctx.emit('control', 'hook_decided', { hook: hook.name, callId: ctx.call.id, decision: replaced ? 'replace' : 'keep', reason: null })
      if (replaced) {
        // A hook's answer may be as large as its delivery allows (1 MiB): the model reads it as a tool result, cut as one.
        const capped = capResult(answer.output, this.#maxOutputBytes)
        shown = capped.ok ? capped.result : toModelToolResult(capped.error)
      }
    }
    return shown
  }

  /**
   * Delivers the finished run to every runEnd hook, in the background: at least once while the
   * process lives, retried with full-jitter backoff, the same deliveryId on every attempt.
   */
  runEnd(run: RunRecord, tenant: string): void {
    // The run as the API shows it (README: `run: Run`).
    const view = toRunView(run)
    for (const hook of this.#matching('runEnd')) {
      const delivery = this.#deliverRunEnd(hook, run, { sessionId: run.sessionId, tenant, run: view })
      this.#pending.add(delivery)
      void delivery.finally(() => this.#pending.delete(delivery))
    }
  }

  async #deliverRunEnd(hook: HookDefinition, run: RunRecord, payload: Record<string, unknown>): Promise<void> {
    const deliveryId = randomUUID()
    // Lines about a run carry its request ID (SPEC 6), as the run's own do.
    const log = this.#log.child({ reqId: run.requestId, sessionId: run.sessionId, runId: run.id })
    for (let attempt = 0; ; attempt++) {
      try {
        await this.#client.deliver({ hook, payload, deliveryId, requestId: run.requestId, signal: this.#stopping.signal, ignoreAnswer: true })
        return
      } catch (err) {
        if (!(err instanceof HookFailure)) {
          log.warn({ hook: hook.name, deliveryId, attempts: attempt + 1 }, 'runEnd delivery stopped: the service is shutting down')
          return
        }
        const last = !err.retryable || attempt >= this.#retry.maxRetries
        const delayMs = last ? 0 : retryDelayMs(this.#retry, attempt, null)
        const consequence = last
          ? `giving up after ${attempt + 1} attempt${attempt === 0 ? '' : 's'}`
          : `retry ${attempt + 1} of ${this.#retry.maxRetries} in ${delayMs} ms`
        const detail = err.classify(hook)
        log.warn({ hook: hook.name, code: err.code, deliveryId, attempt: attempt + 1 }, `${detail.message}; ${consequence}`)
        await this.#events.append({
          sessionId: run.sessionId, runId: run.id, channel: 'monitor', type: 'error', at: new Date().toISOString(), requestId: run.requestId,
          data: { severity: 'warn', phase: 'system', message: `${detail.message}; ${consequence}`, detail: { ...detail, detail: { ...detail.detail, deliveryId, attempt: attempt + 1 } } }
        }).catch((appendErr: unknown) => log.warn({ err: appendErr }, 'could not record a runEnd hook failure (session deleted?)'))
        if (last) return
        try {
          await sleep(delayMs, this.#stopping.signal)
        } catch {
          log.warn({ hook: hook.name, deliveryId }, 'runEnd delivery stopped: the service is shutting down')
          return
        }
      }
    }
  }

  #drained: Promise<void> | null = null

  /** Gives runEnd deliveries in flight up to graceMs, then stops them and closes the connections; once. */
  drain(graceMs: number): Promise<void> {
    this.#drained ??= this.#drain(graceMs)
    return this.#drained
  }

  async #drain(graceMs: number): Promise<void> {
    if (this.#pending.size > 0 && graceMs > 0) {
      let timer: NodeJS.Timeout | undefined
      await Promise.race([Promise.all(this.#pending), new Promise((resolve) => (timer = setTimeout(resolve, graceMs)))])
      clearTimeout(timer)
    }
    this.#stopping.abort()
    await Promise.all(this.#pending)
    await this.#client.close()
  }

  async #reportToolHookFailure(ctx: ToolHookContext, hook: HookDefinition, failure: HookFailure, consequence: string): Promise<void> {
    const detail = failure.classify(hook)
    this.#log.warn({ hook: hook.name, code: failure.code, reqId: ctx.requestId, runId: ctx.runId, callId: ctx.call.id }, `${detail.message}; ${consequence}`)
    await ctx.emit('monitor', 'error', { severity: 'warn', phase: 'system', message: `${detail.message}; ${consequence}`, detail })
  }
}

interface PreToolUseAnswer {
  decision: 'allow' | 'deny' | 'ask'
  reason?: string
  input?: unknown
}

/** A preToolUse answer, or HookFailure saying what is wrong with it. */
function preToolUseAnswer(answer: unknown): PreToolUseAnswer {
  if (typeof answer !== 'object' || answer === null || Array.isArray(answer)) {
    throw new HookFailure('HOOK_INVALID_RESPONSE', 'it answered without a JSON object {decision, reason?, input?}', false)
  }
  const { decision, reason, input } = answer as Record<string, unknown>
  if (typeof decision !== 'string' || !DECISIONS.has(decision)) {
    throw new HookFailure('HOOK_INVALID_RESPONSE', `its decision ${JSON.stringify(decision) ?? 'undefined'} is not one of allow, deny, ask`, false, { decision })
  }
  if (reason !== undefined && reason !== null && typeof reason !== 'string') {
    throw new HookFailure('HOOK_INVALID_RESPONSE', 'its reason is not a string', false)
  }
  return { decision: decision as PreToolUseAnswer['decision'], ...(typeof reason === 'string' ? { reason: cutReason(reason) } : {}), ...(input !== undefined ? { input } : {}) }
}

/** Bytes of a hook's reason that are kept: as much as an approval's note. */
const MAX_REASON_BYTES = 4096

/**
 * A reason cut to MAX_REASON_BYTES with a note. It is repeated in hook_decided, in the
 * DENIED_BY_USER message and its detail, in every event that carries the call's error and in the
 * model's context: whole, one reason as long as the delivery allows (1 MiB) made megabytes of
 * events and a tool message the context had to cut mid-JSON.
 */
function cutReason(reason: string): string {
  const cut = truncateUtf8(reason, MAX_REASON_BYTES)
  return cut.truncated ? `${cut.text}… [reason cut: ${cut.bytes} bytes]` : reason
}

/** A postToolUse answer: empty (keep the output) or `{output}`; anything else is a HookFailure. */
function postToolUseAnswer(answer: unknown): { output?: unknown } {
  if (answer === null) return {}
  if (typeof answer !== 'object' || Array.isArray(answer)) {
    throw new HookFailure('HOOK_INVALID_RESPONSE', 'it answered without a JSON object {output?}', false)
  }
  const extra = Object.keys(answer).filter((key) => key !== 'output')
  if (extra.length > 0) throw new HookFailure('HOOK_INVALID_RESPONSE', `it answered with unknown keys (${extra.join(', ')}); expected {output?}`, false)
  return answer as { output?: unknown }
}

/** The error the model gets for a call a hook denied: DENIED_BY_USER, since the operator's policy speaks for the user. */
function deniedByHook(toolName: string, hook: HookDefinition, reason: string | null): ClassifiedError {
  return classified({
    errorType: 'aborted',
    code: 'DENIED_BY_USER',
    retryable: false,
    message: reason ? `A policy hook (${hook.name}) denied this call to ${toolName}: ${reason}` : `A policy hook (${hook.name}) denied this call to ${toolName}.`,
    recommendations: [
      reason ? `Respect the policy (${reason}); do not retry the same call.` : 'Do not retry the same call; ask the user how to go on.',
      'Choose another way to reach the goal, or explain to the user what the policy prevents.'
    ],
    detail: { deniedBy: 'hook', hook: hook.name, ...(reason ? { reason } : {}) }
  })
}

function rewriteInvalid(toolName: string, hook: HookDefinition, invalid: ClassifiedError): ClassifiedError {
  return {
    ...invalid,
    message: `The arguments the hook ${hook.name} gave ${toolName} fail its schema: ${invalid.message}`,
    detail: { ...invalid.detail, hook: hook.name }
  }
}

function outputWithheld(toolName: string, hook: HookDefinition, why: string): ClassifiedError {
  return classified({
    errorType: 'exception',
    code: 'UNKNOWN',
    retryable: true,
    message: `The output of ${toolName} is withheld: its review hook (${hook.name}) failed (${why})`,
    recommendations: [`${toolName} ran, but its output cannot be shown; do not repeat a call that changes state, and tell the user if the output is needed.`],
    detail: { reason: 'hook_failed', hook: hook.name }
  })
}
