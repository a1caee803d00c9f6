import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { fmt, printTable } from './report.ts'

/** The parts of a V8 .cpuprofile (written by `node --cpu-prof`) that this summary reads. */
interface CpuProfile {
  nodes: Array<{ id: number; callFrame: { functionName: string; url: string; lineNumber: number }; children?: number[] }>
  samples: number[]
}

interface Frame {
  /** "src/store/sqlite.ts:51 #transaction" */
  fn: string
  /** "src/store/sqlite.ts", "node_modules/openai/…", "node:internal/…", or a V8 pseudo-frame such as "(garbage collector)" */
  file: string
  /** "src/store", "openai", "node:http", "(native)" … */
  area: string
}

const repoRoot = fileURLToPath(new URL('..', import.meta.url))

function frameOf(callFrame: CpuProfile['nodes'][number]['callFrame']): Frame {
  const { functionName, url, lineNumber } = callFrame
  const name = functionName || '(anonymous)'
  if (url === '') {
    const file = functionName.startsWith('(') ? functionName : '(native)'
    return { fn: functionName.startsWith('(') ? functionName : `(native) ${name}`, file, area: file }
  }
  const path = url.startsWith('file://') ? fileURLToPath(url) : url
  const file = path.startsWith(repoRoot) ? path.slice(repoRoot.length) : path
  return { fn: `${file}:${lineNumber + 1} ${name}`, file, area: areaOf(file) }
}

function areaOf(file: string): string {
  const modules = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(file)
  if (modules) return modules[1] as string
  if (file.startsWith('node:')) return `node:${file.replace(/^node:(internal\/)?(deps\/)?/, '').split('/')[0]}`
  return file.split('/').slice(0, 2).join('/')
}

/**
 * Prints where a profiled process spent its busy time (every sample but idle): the functions and
 * files with the most self time, and each area (agentd folder, package, Node subsystem) by total
 * time, a sample counting once for every area on its stack. Native work (SQLite, JSON, socket
 * writes) counts as self time of the JavaScript function that called it.
 */
export function printCpuProfile(file: string, title: string): void {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile
  const frames = new Map(profile.nodes.map((node) => [node.id, frameOf(node.callFrame)]))
  const parent = new Map<number, number>()
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id)

  const hits = new Map<number, number>()
  for (const id of profile.samples) hits.set(id, (hits.get(id) ?? 0) + 1)
  let idle = 0
  const selfByFn = new Map<string, number>()
  const selfByFile = new Map<string, number>()
  const totalByArea = new Map<string, number>()
  const add = (map: Map<string, number>, key: string, count: number) => map.set(key, (map.get(key) ?? 0) + count)
  for (const [id, count] of hits) {
    const frame = frames.get(id) as Frame
    if (frame.fn === '(idle)') {
      idle += count
      continue
    }
    add(selfByFn, frame.fn, count)
    add(selfByFile, frame.file, count)
    const areas = new Set<string>()
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) areas.add((frames.get(at) as Frame).area)
    // Every async continuation runs under these, so they would top the table without saying anything.
    for (const plumbing of ['(root)', '(native)', 'node:process']) areas.delete(plumbing)
    for (const area of areas) add(totalByArea, area, count)
  }

  const busy = profile.samples.length - idle
  const top = (map: Map<string, number>, n: number) =>
    [...map].sort((a, b) => b[1] - a[1]).slice(0, n).map(([name, count]) => [name, `${fmt((100 * count) / busy, 1)} %`])
  console.log(`\n${title}: ${profile.samples.length} samples, ${fmt((100 * idle) / profile.samples.length, 1)} % idle; shares below are of the busy samples`)
  printTable([['self time, by function', 'share'], ...top(selfByFn, 20)])
  console.log()
  printTable([['self time, by file', 'share'], ...top(selfByFile, 12)])
  console.log()
  printTable([['total time, by area', 'share'], ...top(totalByArea, 15)])
}
