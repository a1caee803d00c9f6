import { assertClean, cpuTimeMs, runPool, type AgentdClient } from './harness.ts'
import type { ChildServer } from './child.ts'
import { startCheckouts } from './ab.ts'
import { fmt, percentile, printTable } from './report.ts'

const CONCURRENCY = 50
const WARMUP = 200
const RUNS = Number(process.env['BENCH_AB_RUNS'] ?? 1000)
const ROUNDS = Number(process.env['BENCH_AB_ROUNDS'] ?? 4)
const TIME_LIMIT_MS = 600_000

/**
 * ab-throughput: the throughput workload (bench/throughput.ts: 50 clients, a run = new session,
 * an fs_list call, a 20-chunk answer) on two checkouts in turn, `npm run bench -- ab-throughput
 * <checkout A> <checkout B>`. Each round runs RUNS runs on A then on B (B then A on odd rounds);
 * both agentd processes stay up, only one is loaded at a time. On a shared machine single
 * throughput runs differ by 20-40 % within minutes, so a change is judged by the medians of the
 * rounds and, better, by agentd's CPU per run, which drifts less than runs/s.
 * BENCH_AB_RUNS (default 1000) and BENCH_AB_ROUNDS (default 4); BENCH_SQLITE=memory for `:memory:`.
 */
export async function run(): Promise<void> {
  const { dirA, dirB, services, clients, close } = await startCheckouts('ab-throughput', CONCURRENCY + 4)
  const deadline = Date.now() + TIME_LIMIT_MS
  try {
    const oneRun = (client: AgentdClient) => async () => {
      const sessionId = await client.createSession({})
      const done = await client.streamMessage(sessionId, 'List the workspace, then answer.')
      if (done.reason !== 'completed') throw new Error(`a run ended ${done.reason}`)
    }
    for (const client of clients) assertClean('warm-up', await runPool(WARMUP, CONCURRENCY, deadline, oneRun(client)), WARMUP)

    const rounds: Array<Array<{ runsPerSecond: number; cpuMsPerRun: number }>> = [[], []]
    for (let round = 0; round < ROUNDS; round++) {
      for (const which of round % 2 === 0 ? [0, 1] : [1, 0]) {
        const pid = (services[which] as ChildServer).pid
        const cpuBefore = cpuTimeMs(pid) ?? 0
        const started = performance.now()
        const outcome = await runPool(RUNS, CONCURRENCY, deadline, oneRun(clients[which] as AgentdClient))
        const seconds = (performance.now() - started) / 1000
        assertClean('measured runs', outcome, RUNS)
        const cpuMs = (cpuTimeMs(pid) ?? cpuBefore) - cpuBefore
        rounds[which]?.push({ runsPerSecond: outcome.finished / seconds, cpuMsPerRun: cpuMs / outcome.finished })
      }
    }

    const median = (values: number[]) => percentile(values, 50)
    const [a, b] = rounds as [typeof rounds[0], typeof rounds[0]]
    console.log(`\nab-throughput: ${ROUNDS} rounds of ${RUNS} runs on each checkout, ${CONCURRENCY} at once, alternating which goes first`)
    printTable([
      ['checkout', 'runs/s by round', 'median', 'agentd CPU ms/run by round', 'median'],
      ...[a, b].map((rows, i) => [
        `${i === 0 ? 'A' : 'B'} ${i === 0 ? dirA : dirB}`,
        rows.map((r) => fmt(r.runsPerSecond, 0)).join(' / '), fmt(median(rows.map((r) => r.runsPerSecond)), 0),
        rows.map((r) => fmt(r.cpuMsPerRun, 2)).join(' / '), fmt(median(rows.map((r) => r.cpuMsPerRun)), 2)
      ]),
      ['B ÷ A', '', fmt(median(b.map((r) => r.runsPerSecond)) / median(a.map((r) => r.runsPerSecond)), 2), '',
        fmt(median(b.map((r) => r.cpuMsPerRun)) / median(a.map((r) => r.cpuMsPerRun)), 2)]
    ])
  } finally {
    await close()
  }
}
