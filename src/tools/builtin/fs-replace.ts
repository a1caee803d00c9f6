import { randomBytes } from 'node:crypto'
import { constants } from 'node:fs'
import { open, rename, rm } from 'node:fs/promises'
import path from 'node:path'
import { errnoOf } from '../../errors/errno.ts'
import { diskFull } from './fs-failures.ts'

export interface ReplaceFileOptions {
  /** The path the model gave, for the failure it gets. */
  relPath: string
  /** Permission bits of the new file (an edited file keeps its own). */
  mode: number
  signal: AbortSignal
}

/**
 * Writes `content` to `file` (a real path inside the workspace) through a new file in the same
 * folder renamed over it: a write that fails half-way (disk full) or is interrupted leaves the old
 * file whole instead of truncated. The rename also replaces a link or a hard link at the path
 * instead of writing through it.
 */
export async function replaceFile(file: string, content: string, opts: ReplaceFileOptions): Promise<void> {
  const temp = path.join(path.dirname(file), `.agentd-${randomBytes(6).toString('hex')}.tmp`)
  const flags = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW
  try {
    const handle = await open(temp, flags, 0o600)
    try {
      await handle.writeFile(content, { signal: opts.signal })
      // The umask shaped the mode at open; the file gets exactly the mode asked for.
      await handle.chmod(opts.mode)
    } finally {
      await handle.close()
    }
    await rename(temp, file)
  } catch (err) {
    await rm(temp, { force: true }).catch(() => {})
    const errno = errnoOf(err)
    if (errno === 'ENOSPC' || errno === 'EDQUOT') throw diskFull(opts.relPath, err)
    throw err
  }
}
