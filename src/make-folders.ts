import { mkdirSync } from 'node:fs'
import { mkdir } from 'node:fs/promises'
import path from 'node:path'

/*
 * `mkdir -p`, one folder at a time. Node's own recursive mkdir never returns when a parent exists
 * but refuses the child with ENOENT (any path under /proc): it retries forever, on a thread of
 * libuv's pool at full CPU (four such calls and every file operation of the process waits) or,
 * synchronously, on the event loop. These walk up to the first folder that exists and make the
 * missing ones with plain mkdir, so such a path fails with its error.
 */

const code = (err: unknown) => (err as NodeJS.ErrnoException | null)?.code

/** Whether mkdir's failure at `at` means a parent is missing (null: go up), the folder exists (false), or is final (thrown). */
function onMkdirError(err: unknown, at: string): false | null {
  if (code(err) === 'EEXIST') return false
  if (code(err) !== 'ENOENT' || path.dirname(at) === at) throw err
  return null
}

export async function makeFolders(dir: string): Promise<void> {
  const missing: string[] = []
  for (let at = dir; ; at = path.dirname(at)) {
    const made = await mkdir(at).then(() => true, (err: unknown) => onMkdirError(err, at))
    if (made !== null) break
    missing.push(at)
  }
  for (const folder of missing.reverse()) {
    await mkdir(folder).catch((err: unknown) => {
      if (code(err) !== 'EEXIST') throw err
    })
  }
}

export function makeFoldersSync(dir: string): void {
  const missing: string[] = []
  for (let at = dir; ; at = path.dirname(at)) {
    let made: boolean | null
    try {
      mkdirSync(at)
      made = true
    } catch (err) {
      made = onMkdirError(err, at)
    }
    if (made !== null) break
    missing.push(at)
  }
  for (const folder of missing.reverse()) {
    try {
      mkdirSync(folder)
    } catch (err) {
      if (code(err) !== 'EEXIST') throw err
    }
  }
}
