import { setTimeout as delay } from 'node:timers/promises'
import type { ModelError } from '../model/types.ts'

/** SPEC 5.1: how often and how long the service waits before calling the model again. */
export interface RetryPolicy {
  maxRetries: number
  baseMs: number
  capMs: number
}

/** 3 retries, exponential backoff from 1 s, capped at 10 s. */
export const defaultRetryPolicy: Readonly<RetryPolicy> = Object.freeze({ maxRetries: 3, baseMs: 1000, capMs: 10_000 })

/** A provider's Retry-After is honoured up to this; longer waits would stall the run past any sensible client timeout. */
export const maxRetryAfterMs = 60_000

/**
 * Delay before retry number `attempt` (0 for the first retry): full jitter,
 * `random() * min(cap, base * 2 ** attempt)`, unless the provider sent a Retry-After, which wins (capped at 60 s).
 */
export function retryDelayMs(
  policy: RetryPolicy,
  attempt: number,
  retryAfterMs: number | null,
  random: () => number = Math.random
): number {
  if (retryAfterMs !== null && retryAfterMs >= 0) return Math.min(retryAfterMs, maxRetryAfterMs)
  return Math.floor(random() * Math.min(policy.capMs, policy.baseMs * 2 ** attempt))
}

/** Whether a failed model call gets another try: its code is retryable and `attempt` retries have not used up the policy. */
export function shouldRetry(err: ModelError, attempt: number, policy: RetryPolicy): boolean {
  return err.classified.retryable && attempt < policy.maxRetries
}

/** Waits `ms`; rejects with an AbortError as soon as `signal` fires, so an interrupt never waits out a backoff. */
export async function sleep(ms: number, signal: AbortSignal): Promise<void> {
  await delay(ms, undefined, { signal })
}
