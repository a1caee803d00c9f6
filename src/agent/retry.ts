import { setTimeout as delay } from 'node:timers/promises'
import type { ModelError } from '../model/types.ts'
import type { ClassifiedError } from '../schemas/common.ts'

/** SPEC 5.1: how often and how long the service waits before calling the model again. */
export interface RetryPolicy {
  maxRetries: number
  baseMs: number
  capMs: number
  /**
   * How long one model call may wait in all between its retries, Retry-After included. A run
   * has a client waiting (wait=true, a stream): a provider that asks for longer fails the run at
   * once, with the delay it asked for, instead of holding that client.
   */
  maxWaitMs: number
}

/** 3 retries, exponential backoff from 1 s, capped at 10 s; at most 60 s of waiting per model call. */
export const defaultRetryPolicy: Readonly<RetryPolicy> = Object.freeze({ maxRetries: 3, baseMs: 1000, capMs: 10_000, maxWaitMs: 60_000 })

/**
 * Delay before retry number `attempt` (0 for the first retry): full jitter,
 * `random() * min(cap, base * 2 ** attempt)`, unless the provider sent a Retry-After, which wins.
 */
export function retryDelayMs(
  policy: RetryPolicy,
  attempt: number,
  retryAfterMs: number | null,
  random: () => number = Math.random
): number {
  if (retryAfterMs !== null && retryAfterMs >= 0) return retryAfterMs
  return Math.floor(random() * Math.min(policy.capMs, policy.baseMs * 2 ** attempt))
}

/**
 * The run's error when the next retry would wait past the policy's maxWaitMs (already waited
 * `waitedMs`, next delay `delayMs`); null when the retry may wait. The error keeps the provider's
 * code (RATE_LIMITED for a 429), is retryable (later, by the client) and says the delay in detail.
 */
export function waitRefused(err: ModelError, policy: RetryPolicy, waitedMs: number, delayMs: number): ClassifiedError | null {
  if (waitedMs + delayMs <= policy.maxWaitMs) return null
  const seconds = (ms: number) => `${Math.ceil(ms / 1000)} s`
  const asked = err.retryAfterMs !== null ? `The provider asks to wait ${seconds(delayMs)} before a retry` : `The next retry would wait ${seconds(delayMs)}`
  return {
    ...err.classified,
    retryable: true,
    fatal: true,
    message: `${err.classified.message} (${asked}, longer than a run waits: ${seconds(policy.maxWaitMs)} in all; send the message again later)`,
    recommendations: [`Send the message again after ${seconds(delayMs)}.`, ...err.classified.recommendations],
    detail: { ...err.classified.detail, retryAfterMs: delayMs, waitedMs, maxWaitMs: policy.maxWaitMs }
  }
}

/** Whether a failed model call gets another try: its code is retryable and `attempt` retries have not used up the policy. */
export function shouldRetry(err: ModelError, attempt: number, policy: RetryPolicy): boolean {
  return err.classified.retryable && attempt < policy.maxRetries
}

/** Waits `ms`; rejects with an AbortError as soon as `signal` fires, so an interrupt never waits out a backoff. */
export async function sleep(ms: number, signal: AbortSignal): Promise<void> {
  await delay(ms, undefined, { signal })
}
