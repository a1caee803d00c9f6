import { AgentdClient, startServiceProcess, startStampingModelProcess, sqliteSetting } from './harness.ts'
import { fmt, percentile, printTable } from './report.ts'
import { CHUNKS, runThroughAgentd } from './e2e.ts'
import type { ChildServer } from './child.ts'

const WARMUP = 100
const RUNS = Number(process.env['BENCH_AB_RUNS'] ?? 1500)

/**
 * ab: two checkouts of agentd side by side, `npm run bench -- ab <checkout A> <checkout B>` (each
 * a folder holding this repository, e.g. a `git worktree` of the commit before a change, and
 * this one). Both serve the e2e workload from one model and one client, a run on A then a run on
 * B, alternating which goes first: the machine's drift (load, clock, caches) falls on both alike,
 * so a change of a few percent shows, where separate bench runs differ by 10-20 % between them.
 * BENCH_AB_RUNS sets the runs per checkout (default 1500); BENCH_SQLITE=memory uses `:memory:`.
 */
export async function run(): Promise<void> {
  const { dirA, dirB, clients, close } = await startCheckouts('ab', 2)
  try {
    const timings = [{ e2e: [] as number[], firstText: [] as number[] }, { e2e: [] as number[], firstText: [] as number[] }]
    for (let i = 0; i < WARMUP + RUNS; i++) {
      for (const which of i % 2 === 0 ? [0, 1] : [1, 0]) {
        const { timing } = await runThroughAgentd(clients[which] as AgentdClient)
        if (i < WARMUP) continue
        timings[which]?.e2e.push(timing.e2e)
        timings[which]?.firstText.push(timing.firstText)
      }
    }
    console.log(`\nab: the e2e workload (bench/e2e.ts), ${RUNS} runs on each checkout after ${WARMUP} to warm up, one at a time, alternating`)
    const row = (label: string, t: { e2e: number[]; firstText: number[] }) => [
      label, fmt(percentile(t.e2e, 50)), fmt(percentile(t.e2e, 90)), fmt(percentile(t.firstText, 50)), fmt(percentile(t.firstText, 90))
    ]
    const [a, b] = timings as [typeof timings[0], typeof timings[0]]
    printTable([
      ['checkout', 'e2e p50 ms', 'e2e p90 ms', 'first text p50 ms', 'first text p90 ms'],
      row(`A ${dirA}`, a),
      row(`B ${dirB}`, b),
      ['B ÷ A', fmt(percentile(b.e2e, 50) / percentile(a.e2e, 50)), fmt(percentile(b.e2e, 90) / percentile(a.e2e, 90)),
        fmt(percentile(b.firstText, 50) / percentile(a.firstText, 50)), fmt(percentile(b.firstText, 90) / percentile(a.firstText, 90))]
    ])
  } finally {
    await close()
  }
}

/** Two checkouts' agentd (given on the command line), each started by its own harness from its own sources, on one model. */
export async function startCheckouts(bench: string, connections: number): Promise<{
  dirA: string; dirB: string; services: ChildServer[]; clients: AgentdClient[]; close(): Promise<void>
}> {
  const [dirA, dirB] = process.argv.slice(3)
  if (!dirA || !dirB) throw new Error(`usage: npm run bench -- ${bench} <checkout A> <checkout B>`)
  const model = await startStampingModelProcess({ chunks: CHUNKS, intervalMs: 0, toolName: 'fs_list' })
  const services: ChildServer[] = []
  const clients: AgentdClient[] = []
  const close = async () => {
    for (const client of clients) await client.close()
    for (const service of services) await service.close()
    await model.close()
  }
  try {
    for (const dir of [dirA, dirB]) {
      const harness = (await import(`${dir}/bench/harness.ts`)) as { startServiceProcess: typeof startServiceProcess }
      const service = await harness.startServiceProcess(model.url, sqliteSetting())
      services.push(service)
      clients.push(new AgentdClient(service.url, connections))
    }
  } catch (err) {
    await close()
    throw err
  }
  return { dirA, dirB, services, clients, close }
}
