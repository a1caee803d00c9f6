import { cpus, loadavg, release, totalmem } from 'node:os'

/** The p-th percentile (0-100) of the values, nearest rank. */
export function percentile(values: number[], p: number): number {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  const rank = Math.ceil((p / 100) * sorted.length)
  return sorted[Math.min(sorted.length, Math.max(1, rank)) - 1] as number
}

export const mean = (values: number[]): number => values.reduce((sum, v) => sum + v, 0) / values.length

/** A number with `digits` decimals, or "-" when there is none. */
export const fmt = (value: number, digits = 2): string => (Number.isFinite(value) ? value.toFixed(digits) : '-')

/** Prints rows as a table with aligned columns; the first row is the header. */
export function printTable(rows: string[][]): void {
  const widths = rows[0]?.map((_, col) => Math.max(...rows.map((row) => (row[col] ?? '').length))) ?? []
  const line = (row: string[]) => row.map((cell, col) => (col === 0 ? cell.padEnd(widths[col] ?? 0) : cell.padStart(widths[col] ?? 0))).join('   ')
  console.log(line(rows[0] ?? []))
  console.log(widths.map((w) => '-'.repeat(w)).join('   '))
  for (const row of rows.slice(1)) console.log(line(row))
}

/** The machine the figures come from. */
export function machine(): string {
  const cores = cpus()
  return `${cores.length} × ${cores[0]?.model ?? 'unknown CPU'}, ${Math.round(totalmem() / 2 ** 30)} GiB, ` +
    `${process.platform} ${release()}, node ${process.version}; load average ${fmt(loadavg()[0] ?? 0)} at start ` +
    '(other work on the machine skews the figures)'
}
