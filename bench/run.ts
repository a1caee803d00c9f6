/**
 * The benchmarks: `npm run bench -- <e2e|overhead|latency|throughput|model|store|frames|streams|all>`,
 * and `npm run bench -- ab <checkout A> <checkout B>` to compare two checkouts (bench/ab.ts; one
 * run at a time), `npm run bench -- ab-throughput <checkout A> <checkout B>` the same with 50 clients.
 * They print figures; they are never tests. Each starts its own model and agentd processes on
 * 127.0.0.1 (store drives the SQLite store in its own process, with no HTTP), stops by itself
 * after a fixed amount of work (and a time limit), and leaves nothing running.
 * BENCH_CPU_PROF=1 also profiles agentd (node --cpu-prof) and prints where its time went;
 * BENCH_CPU_PROF_KEEP=<folder> keeps the raw profiles there; BENCH_ELU=1 prints agentd's
 * event-loop utilisation every 2 s.
 */
import { machine } from './report.ts'

// In this order for `all`: e2e first, the issue's own figures.
const benches: Record<string, () => Promise<{ run(): Promise<void> }>> = {
  e2e: () => import('./e2e.ts'),
  overhead: () => import('./overhead.ts'),
  latency: () => import('./latency.ts'),
  throughput: () => import('./throughput.ts'),
  model: () => import('./model-stream.ts'),
  store: () => import('./store.ts'),
  frames: () => import('./frame-cost.ts'),
  streams: () => import('./idle-streams.ts')
}
/** Benches that take arguments, so not part of `all`. */
const withArguments: Record<string, () => Promise<{ run(): Promise<void> }>> = {
  ab: () => import('./ab.ts'),
  'ab-throughput': () => import('./ab-throughput.ts')
}
const TIME_LIMIT_MS = 15 * 60_000

const name = process.argv[2] ?? ''
const selected = name === 'all' ? Object.keys(benches) : [name]
if (!selected.every((bench) => bench in benches || bench in withArguments)) {
  console.error(`usage: npm run bench -- <${[...Object.keys(benches), 'all'].join('|')}>, or npm run bench -- <ab|ab-throughput> <checkout A> <checkout B>`)
  process.exit(1)
}

setTimeout(() => {
  console.error(`bench: still running after ${TIME_LIMIT_MS / 60_000} minutes; stopping`)
  process.exit(1)
}, TIME_LIMIT_MS).unref()

console.log(`machine: ${machine()}`)
for (const bench of selected) {
  const module = await ((benches[bench] ?? withArguments[bench]) as () => Promise<{ run(): Promise<void> }>)()
  await module.run()
}
