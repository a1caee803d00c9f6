import { lstatSync, readdirSync, readFileSync, type Dirent } from 'node:fs'
import path from 'node:path'

/** What fs_grep hands to its worker thread; paths are real and inside the workspace. */
export interface GrepJob {
  root: string
  start: string
  pattern: string
  ignoreCase: boolean
  glob?: string
  maxMatches: number
  maxFileBytes: number
  maxLineChars: number
}

export interface GrepMatch {
  path: string
  line: number
  text: string
}

export interface GrepResult {
  matches: GrepMatch[]
  truncated: boolean
  filesSearched: number
  /** Files passed over: binary, larger than maxFileBytes, or gone (removed during the search, or named in bytes that are not UTF-8). */
  filesSkipped: number
}

const notEntered = new Set(['.git', 'node_modules'])

/**
 * Runs on a worker thread (runInWorker), where blocking file reads and a runaway regular
 * expression cost nothing but the worker, which is terminated on timeout.
 * Symbolic links are not followed, so the walk stays inside the workspace.
 */
export function grep(job: GrepJob): GrepResult {
  const regex = new RegExp(job.pattern, job.ignoreCase ? 'i' : '')
  const result: GrepResult = { matches: [], truncated: false, filesSearched: 0, filesSkipped: 0 }
  const rel = (p: string) => path.relative(job.root, p).split(path.sep).join('/') || '.'
  const wanted = (p: string) => {
    if (job.glob === undefined) return true
    // A glob without "/" matches the file name anywhere, like ripgrep's -g.
    return job.glob.includes('/') ? path.matchesGlob(rel(p), job.glob) : path.matchesGlob(path.basename(p), job.glob)
  }

  const searchFile = (file: string): boolean => {
    if (!wanted(file)) return true
    const buf = readSearchable(file, job.maxFileBytes)
    if (buf === null || buf.subarray(0, 8192).includes(0)) {
      result.filesSkipped++
      return true
    }
    result.filesSearched++
    const lines = buf.toString('utf8').split('\n')
    for (let i = 0; i < lines.length; i++) {
      const line = (lines[i] as string).replace(/\r$/, '')
      if (!regex.test(line)) continue
      if (result.matches.length >= job.maxMatches) {
        result.truncated = true
        return false
      }
      const text = line.length > job.maxLineChars ? `${line.slice(0, job.maxLineChars)}…` : line
      result.matches.push({ path: rel(file), line: i + 1, text })
    }
    return true
  }

  // Depth first in name order, so the matches (and which ones the cap keeps) follow path order.
  const walk = (dir: string): boolean => {
    const entries = readdirOrNothing(dir).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
    for (const entry of entries) {
      const full = path.join(dir, entry.name)
      if (entry.isDirectory() && !notEntered.has(entry.name)) {
        if (!walk(full)) return false
      } else if (entry.isFile() && !searchFile(full)) return false
    }
    return true
  }

  if (lstatSync(job.start).isFile()) searchFile(job.start)
  else walk(job.start)
  return result
}

/**
 * A file's bytes; null when it is larger than maxBytes, or gone: removed since its folder was read,
 * or named in bytes that are not UTF-8 (read as UTF-8, its name leads nowhere). Such a file is
 * passed over rather than failing the whole search.
 */
function readSearchable(file: string, maxBytes: number): Buffer | null {
  try {
    return lstatSync(file).size > maxBytes ? null : readFileSync(file)
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null
    throw err
  }
}

/** A folder's entries; none when it is gone (removed, or named in bytes that are not UTF-8). */
function readdirOrNothing(dir: string): Dirent[] {
  try {
    return readdirSync(dir, { withFileTypes: true })
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return []
    throw err
  }
}
