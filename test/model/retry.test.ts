import t from 'tap'
import { defaultRetryPolicy, retryDelayMs, shouldRetry, sleep, waitRefused } from '../../src/agent/retry.ts'
import { createModelError } from '../../src/model/model-errors.ts'

t.test('the default policy is 3 retries from 1 s, capped at 10 s, 60 s of waiting in all', async (t) => {
  t.same({ ...defaultRetryPolicy }, { maxRetries: 3, baseMs: 1000, capMs: 10_000, maxWaitMs: 60_000 })
})

t.test('backoff doubles per attempt with full jitter and stops growing at the cap', async (t) => {
  const half = () => 0.5
  t.same(
    [0, 1, 2, 3, 4, 10].map((attempt) => retryDelayMs(defaultRetryPolicy, attempt, null, half)),
    [500, 1000, 2000, 4000, 5000, 5000]
  )
  t.equal(retryDelayMs(defaultRetryPolicy, 2, null, () => 0), 0, 'full jitter reaches down to zero')
  t.equal(retryDelayMs(defaultRetryPolicy, 20, null, () => 0.999999), 9999, 'and never reaches the cap itself')
  t.equal(retryDelayMs({ maxRetries: 5, baseMs: 10, capMs: 50, maxWaitMs: 1000 }, 3, null, () => 1), 50)
})

t.test('a Retry-After overrides the backoff', async (t) => {
  t.equal(retryDelayMs(defaultRetryPolicy, 0, 1000, () => 0.1), 1000)
  t.equal(retryDelayMs(defaultRetryPolicy, 0, 50, () => 0.9), 50)
  t.equal(retryDelayMs(defaultRetryPolicy, 2, 0, () => 0.9), 0)
  t.equal(retryDelayMs(defaultRetryPolicy, 0, 10 * 60_000), 10 * 60_000, 'as asked: the wait budget decides, not a silent cap')
})

t.test('a retry that would wait past maxWaitMs in all is refused with the delay in detail', async (t) => {
  t.equal(defaultRetryPolicy.maxWaitMs, 60_000)
  const limited = createModelError('RATE_LIMITED', 'slow down', { status: 429, retryAfterMs: 3_600_000 })
  t.equal(waitRefused(limited, defaultRetryPolicy, 0, 60_000), null, 'up to the budget, the retry waits')
  t.equal(waitRefused(limited, defaultRetryPolicy, 59_000, 2000) !== null, true, 'the budget counts what was already waited')
  t.match(waitRefused(limited, defaultRetryPolicy, 0, 3_600_000), {
    code: 'RATE_LIMITED', retryable: true, fatal: true, detail: { retryAfterMs: 3_600_000, waitedMs: 0, maxWaitMs: 60_000 }
  })
  const policy = { ...defaultRetryPolicy, maxWaitMs: 100 }
  t.equal(waitRefused(limited, policy, 60, 30), null)
  t.match(waitRefused(limited, policy, 60, 60), { detail: { retryAfterMs: 60, waitedMs: 60 } }, 'three polite 60 s waits do not add up to three minutes')
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
