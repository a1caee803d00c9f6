import t from 'tap'
import { defaultRetryPolicy, maxRetryAfterMs, retryDelayMs, shouldRetry, sleep } from '../../src/agent/retry.ts'
import { createModelError } from '../../src/model/model-errors.ts'

t.test('the default policy is 3 retries from 1 s, capped at 10 s', async (t) => {
  t.same({ ...defaultRetryPolicy }, { maxRetries: 3, baseMs: 1000, capMs: 10_000 })
})

t.test('backoff doubles per attempt with full jitter and stops growing at the cap', async (t) => {
  const half = () => 0.5
  t.same(
    [0, 1, 2, 3, 4, 10].map((attempt) => retryDelayMs(defaultRetryPolicy, attempt, null, half)),
    [500, 1000, 2000, 4000, 5000, 5000]
  )
  t.equal(retryDelayMs(defaultRetryPolicy, 2, null, () => 0), 0, 'full jitter reaches down to zero')
  t.equal(retryDelayMs(defaultRetryPolicy, 20, null, () => 0.999999), 9999, 'and never reaches the cap itself')
  t.equal(retryDelayMs({ maxRetries: 5, baseMs: 10, capMs: 50 }, 3, null, () => 1), 50)
})

t.test('a Retry-After overrides the backoff, up to a sane maximum', async (t) => {
  t.equal(retryDelayMs(defaultRetryPolicy, 0, 1000, () => 0.1), 1000)
  t.equal(retryDelayMs(defaultRetryPolicy, 0, 50, () => 0.9), 50)
  t.equal(retryDelayMs(defaultRetryPolicy, 2, 0, () => 0.9), 0)
  t.equal(retryDelayMs(defaultRetryPolicy, 0, 10 * 60_000), maxRetryAfterMs)
  t.equal(maxRetryAfterMs, 60_000)
})

t.test('only retryable codes are retried, and only maxRetries times', async (t) => {
  const limited = createModelError('RATE_LIMITED', 'slow down')
  t.same(
    [0, 1, 2, 3].map((attempt) => shouldRetry(limited, attempt, defaultRetryPolicy)),
    [true, true, true, false]
  )
  t.notOk(shouldRetry(createModelError('AUTHENTICATION_ERROR', 'bad key'), 0, defaultRetryPolicy))
  t.notOk(shouldRetry(createModelError('TIMEOUT', 'slow'), 0, { ...defaultRetryPolicy, maxRetries: 0 }))
})

t.test('sleep waits, and an abort ends the wait at once', async (t) => {
  const started = Date.now()
  await sleep(30, new AbortController().signal)
  t.ok(Date.now() - started >= 25)

  const controller = new AbortController()
  const waiting = sleep(10_000, controller.signal)
  setTimeout(() => controller.abort(), 10)
  const abortedAt = Date.now()
  await t.rejects(waiting, { name: 'AbortError' })
  t.ok(Date.now() - abortedAt < 1000)

  await t.rejects(sleep(10, AbortSignal.abort()), { name: 'AbortError' }, 'an already aborted signal rejects')
})
