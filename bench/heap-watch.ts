/**
 * Inside a bench's server process (agentd, the bare agent): how much it allocated on V8's heap and
 * what its garbage collections cost, phase by phase. Allocation has no counter of its own in
 * Node, so it is summed from V8's used heap around each GC (v8.GCProfiler): what was used just
 * before a GC, less what was left just after the one before it, plus the growth since the last.
 * That counts every object the process made, whatever it was made for; concurrent sweeping
 * between two GCs can only make it lower than the truth, and only by what a major GC frees.
 */
import { GCProfiler, getHeapStatistics } from 'node:v8'
import { add, totals, type PauseTotals } from './pause-totals.ts'

export interface HeapSample {
  /** Bytes allocated on V8's heap since the previous sample (or the start). */
  allocatedBytes: number
  /** The GCs since then: count, total and longest main-thread pause (ms), and how many paused PAUSE_MS or more. */
  gc: PauseTotals
}

/** GCProfiler's record of one GC (its heap statistics are camel-cased, unlike getHeapStatistics()). */
interface GcRecord {
  cost: number
  beforeGC: { heapStatistics: { usedHeapSize: number } }
  afterGC: { heapStatistics: { usedHeapSize: number } }
}

/** Starts watching; `sample()` reports what happened since the previous call (or the start) and starts over. */
export function watchHeap(): { sample(): HeapSample } {
  let profiler = new GCProfiler()
  profiler.start()
  let usedAtStart = getHeapStatistics().used_heap_size
  return {
    sample() {
      const used = getHeapStatistics().used_heap_size
      const statistics = profiler.stop().statistics as unknown as GcRecord[]
      profiler = new GCProfiler()
      profiler.start()
      const gc = totals()
      let allocatedBytes = 0
      let left = usedAtStart
      for (const { cost, beforeGC, afterGC } of statistics) {
        allocatedBytes += Math.max(0, beforeGC.heapStatistics.usedHeapSize - left)
        left = afterGC.heapStatistics.usedHeapSize
        add(gc, cost / 1000)
      }
      allocatedBytes += Math.max(0, used - left)
      usedAtStart = used
      return { allocatedBytes, gc }
    }
  }
}
