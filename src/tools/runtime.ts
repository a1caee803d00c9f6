import { performance } from 'node:perf_hooks'
import { classified } from '../errors/classified.ts'
import type { ClassifiedError } from '../schemas/common.ts'
import { checkToolInput } from './json-schema.ts'
import { truncateUtf8, truncationNote } from './output.ts'
import { classifyToolError, isLogicalFailure, toolInterrupted, toolTimeout, type ClassifyOptions, type ToolAdvisor } from './tool-errors.ts'
import type { Tool, ToolContext } from './types.ts'

export interface RunToolOptions {
  /** The call is stopped and reported as aborted/TIMEOUT after this long. */
  timeoutMs: number
  /** A result whose JSON is larger is cut to this many bytes, with a note. */
  maxOutputBytes: number
}

/** How one tool call ended: its (possibly cut) result, or its classified error. */
export type ToolOutcome =
  | { ok: true; result: unknown; truncated: boolean; durationMs: number }
  | { ok: false; error: ClassifiedError; durationMs: number }

type Settled = { kind: 'value'; value: unknown } | { kind: 'error'; error: unknown } | { kind: 'aborted' }

/**
 * Runs one tool call in isolation (SPEC 7): validates the arguments, runs `execute` with a signal
 * that fires on timeout or on the caller's abort, and settles by the deadline even if the tool
 * ignores its signal (its late result is dropped). Never throws; every failure comes back classified.
 */
export async function runTool(tool: Tool, rawInput: unknown, ctx: ToolContext, opts: RunToolOptions): Promise<ToolOutcome> {
  const started = performance.now()
  const elapsed = () => Math.round(performance.now() - started)
  const failed = (error: ClassifiedError): ToolOutcome => ({ ok: false, error, durationMs: elapsed() })

  const invalid = checkToolInput(tool.name, tool.parameters, rawInput)
  if (invalid) return failed(invalid)
  if (ctx.signal.aborted) return failed(toolInterrupted(tool.name))

  const controller = new AbortController()
  let timedOut = false
  const timer = setTimeout(() => {
    timedOut = true
    controller.abort(new DOMException(`${tool.name} timed out after ${opts.timeoutMs} ms`, 'TimeoutError'))
  }, opts.timeoutMs)
  const forwardAbort = () => controller.abort(ctx.signal.reason)
  ctx.signal.addEventListener('abort', forwardAbort, { once: true })
  const abortedSignal = new Promise<Settled>((resolve) => {
    controller.signal.addEventListener('abort', () => resolve({ kind: 'aborted' }), { once: true })
  })

  try {
    // new Promise also catches a synchronous throw from execute.
    const execution = new Promise<unknown>((resolve) => resolve(tool.execute(rawInput, { ...ctx, signal: controller.signal })))
    const settled = await Promise.race<Settled>([
      execution.then(
        (value) => ({ kind: 'value', value }),
        (error: unknown) => ({ kind: 'error', error })
      ),
      abortedSignal
    ])
    if (settled.kind === 'aborted') {
      return failed(timedOut ? toolTimeout(tool, opts.timeoutMs, rawInput) : toolInterrupted(tool.name))
    }
    if (settled.kind === 'error') {
      return failed(capDetail(classifyToolError(tool, settled.error, rawInput, { workspace: ctx.workspace }), opts.maxOutputBytes))
    }
    const answer = answerOutcome(tool, settled.value, opts.maxOutputBytes, rawInput, { workspace: ctx.workspace })
    return answer.ok ? { ...answer, durationMs: elapsed() } : failed(answer.error)
  } catch (err) {
    return failed(classifyToolError(tool, err, rawInput, { workspace: ctx.workspace }))
  } finally {
    clearTimeout(timer)
    ctx.signal.removeEventListener('abort', forwardAbort)
  }
}

type Capped = { ok: true; result: unknown; truncated: boolean } | { ok: false; error: ClassifiedError }

/**
 * What a tool answered, as its outcome: `{ok: false, …}` is its logical failure (classified, its
 * message and detail capped), anything else its result, cut to `maxBytes` with a note. A server
 * tool's return value (runTool) and a client tool's posted output go through it alike.
 */
export function answerOutcome(tool: ToolAdvisor, value: unknown, maxBytes: number, input?: unknown, options?: ClassifyOptions): Capped {
  if (isLogicalFailure(value)) return { ok: false, error: capDetail(classifyToolError(tool, value, input, options), maxBytes) }
  return capResult(value, maxBytes)
}

/**
 * Keeps a result within `maxBytes` of JSON. A string is cut directly; anything else too large
 * becomes the cut text of its JSON, since a partial object cannot be rebuilt faithfully.
 */
export function capResult(value: unknown, maxBytes: number): Capped {
  if (value === undefined) return { ok: true, result: null, truncated: false }
  if (typeof value === 'string') {
    const cut = truncateUtf8(value, maxBytes)
    return cut.truncated
      ? { ok: true, result: cut.text + truncationNote(Buffer.byteLength(cut.text), cut.bytes), truncated: true }
      : { ok: true, result: value, truncated: false }
  }
  let json: string | undefined
  try {
    json = JSON.stringify(value)
  } catch (err) {
    return {
      ok: false,
      error: classified({
        errorType: 'runtime',
        code: 'UNKNOWN',
        message: `The tool returned a result that cannot be turned into JSON: ${(err as Error).message}`,
        recommendations: ['This is a defect of the tool; try another approach.']
      })
    }
  }
  if (json === undefined) return { ok: true, result: null, truncated: false }
  const cut = truncateUtf8(json, maxBytes)
  if (!cut.truncated) return { ok: true, result: value, truncated: false }
  return { ok: true, result: cut.text + truncationNote(Buffer.byteLength(cut.text), cut.bytes), truncated: true }
}

/** A failure's message, advice and detail come from the tool (an MCP server's isError text, a webhook's answer, …): each capped like a result. */
export function capDetail(error: ClassifiedError, maxBytes: number): ClassifiedError {
  const message = truncateUtf8(error.message, maxBytes)
  if (message.truncated) error = { ...error, message: message.text + truncationNote(Buffer.byteLength(message.text), message.bytes) }
  const recommendations = capRecommendations(error.recommendations, maxBytes)
  if (recommendations !== error.recommendations) error = { ...error, recommendations }
  if (error.detail === undefined) return error
  const capped = capResult(error.detail, maxBytes)
  if (capped.ok && !capped.truncated) return error
  return { ...error, detail: { truncated: true, preview: capped.ok ? capped.result : null } }
}

export interface ConcurrencyLimiter {
  /** Runs `fn` once fewer than `max` calls of the same key are running; a queued call leaves the queue when `signal` fires. */
  run<T>(key: string, fn: () => Promise<T>, signal?: AbortSignal): Promise<T>
  /** Calls of `key` running now. */
  active(key: string): number
  /** Calls of `key` waiting for a slot. */
  queued(key: string): number
}

/** A per-key (per-session) limit on concurrent tool calls; keys do not wait for each other. */
export function createConcurrencyLimiter(max: number): ConcurrencyLimiter {
  if (!Number.isInteger(max) || max < 1) throw new RangeError(`max must be a positive integer, got ${max}`)
  const lanes = new Map<string, { active: number; waiting: Array<() => void> }>()

  const lane = (key: string) => {
    let l = lanes.get(key)
    if (!l) {
      l = { active: 0, waiting: [] }
      lanes.set(key, l)
    }
    return l
  }

  const release = (key: string) => {
    const l = lanes.get(key)
    if (!l) return
    const next = l.waiting.shift()
    if (next) next()
    else {
      l.active--
      if (l.active === 0) lanes.delete(key)
    }
  }

  const acquire = (key: string, signal?: AbortSignal): Promise<void> => {
    const l = lane(key)
    if (l.active < max) {
      l.active++
      return Promise.resolve()
    }
    return new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason)
        return
      }
      // A released slot passes straight to the next waiter, so `active` stays counted.
      const grant = () => {
        signal?.removeEventListener('abort', onAbort)
        resolve()
      }
      const onAbort = () => {
        const i = l.waiting.indexOf(grant)
        if (i >= 0) l.waiting.splice(i, 1)
        reject(signal?.reason)
      }
      signal?.addEventListener('abort', onAbort, { once: true })
      l.waiting.push(grant)
    })
  }

  return {
    async run<T>(key: string, fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
      await acquire(key, signal)
      try {
        return await fn()
      } finally {
        release(key)
      }
    },
    active: (key) => lanes.get(key)?.active ?? 0,
    queued: (key) => lanes.get(key)?.waiting.length ?? 0
  }
}

/** The recommendations that fit in maxBytes together, the last one cut with a note; the list itself when all fit. */
function capRecommendations(list: string[], maxBytes: number): string[] {
  let room = maxBytes
  for (const [i, advice] of list.entries()) {
    const cut = truncateUtf8(advice, room)
    if (cut.truncated) return [...list.slice(0, i), cut.text + truncationNote(Buffer.byteLength(cut.text), cut.bytes)]
    room -= cut.bytes
  }
  return list
}
