import t from 'tap'
import { setImmediate as nextTurn } from 'node:timers/promises'
import { takeTurn } from '../../src/agent/turn-share.ts'

/** Keeps the CPU busy for ms, as a run building its model call does. */
function work(ms: number): void {
  const until = performance.now() + ms
  while (performance.now() < until) {
    // busy
  }
}

/** Lets any window left open by an earlier test close, and its waiters go. */
async function quiet(): Promise<void> {
  for (let i = 0; i < 5; i++) await nextTurn()
}

t.beforeEach(quiet)

t.test('a run alone never waits for its turn', async (t) => {
  for (let i = 0; i < 20; i++) {
    t.equal(takeTurn(), undefined, `call ${i} goes on at once`)
    await nextTurn()
  }
})

t.test('runs that come in one turn go on until the turn has spent its budget, then wait their turn in order', async (t) => {
  t.equal(takeTurn(), undefined, 'the first run of the turn goes on')
  work(3)
  const order: string[] = []
  const runs: Promise<unknown>[] = []
  let late: Promise<void> | undefined
  for (const name of ['second', 'third', 'fourth']) {
    const waiting = takeTurn()
    t.ok(waiting instanceof Promise, `once the turn has spent its budget, the ${name} run waits`)
    runs.push((waiting as Promise<void>).then(() => {
      order.push(name)
      // A run that comes while others wait queues behind them, even with budget left.
      if (name === 'second') {
        late = takeTurn()
        runs.push(late?.then(() => order.push('late')) ?? Promise.resolve())
      }
    }))
  }
  await Promise.all(runs.slice(0, 3))
  t.ok(late instanceof Promise, 'a run that comes while others wait does not cut in line')
  await late
  t.same(order, ['second', 'third', 'fourth', 'late'], 'waiting runs go in the order they came')
})

t.test('a turn lets only a budget of waiting runs go; the others go on the turns after', async (t) => {
  t.equal(takeTurn(), undefined, 'the first run of the turn goes on')
  work(3)
  const turnsOf: number[] = []
  let turn = 0
  const ticking = setInterval(() => turn++, 0)
  t.teardown(() => clearInterval(ticking))
  const runs: Promise<unknown>[] = []
  for (let i = 0; i < 6; i++) {
    const waiting = takeTurn()
    t.ok(waiting, `run ${i} waits`)
    runs.push(
      (waiting as Promise<void>).then(() => {
        turnsOf.push(turn)
        // Each run spends 1.5 ms: two fit in a 2 ms budget, the third goes past it.
        work(1.5)
      })
    )
  }
  await Promise.all(runs)
  clearInterval(ticking)
  const distinctTurns = new Set(turnsOf).size
  t.ok(distinctTurns >= 3, `six runs of 1.5 ms each went on ${distinctTurns} different turns, not all in one (${turnsOf.join(', ')})`)
})
