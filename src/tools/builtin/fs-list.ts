import { opendirSync, readdirSync, statSync, type Dirent } from 'node:fs'
import { lstat } from 'node:fs/promises'
import path from 'node:path'
import { Type } from '@sinclair/typebox'
import { fitListResult } from '../output.ts'
import type { Tool } from '../types.ts'
import { notDirectory, resolveInWorkspace, toWorkspacePath, workspaceRoot } from '../workspace.ts'
import { recommendFsFailure } from './fs-failures.ts'

const Parameters = Type.Object(
  {
    path: Type.Optional(Type.String({ description: 'Folder relative to the workspace root; default "."' })),
    recursive: Type.Optional(Type.Boolean({ description: 'List sub-folders too; default false' }))
  },
  { additionalProperties: false }
)

type EntryType = 'file' | 'dir' | 'symlink' | 'other'
interface Entry {
  path: string
  type: EntryType
  size?: number
}

/** Entries of a folder read before its listing goes on without blocking (see readFolder). */
const SYNC_ENTRIES = 256
/**
 * A folder whose own size (the bytes of its entries as the file system stores them: ~20-30 a
 * name on ext4 and tmpfs) is at most this is read whole at once, a few hundred entries at most.
 */
const SYNC_FOLDER_BYTES = 16 * 1024

/**
 * The entries of a folder, unsorted. A small folder (nearly every workspace folder) is read
 * synchronously in one call: a few microseconds, where a thread-pool hop costs 30-150 µs, and
 * where a directory handle (opendir, read, close) costs three times as much as one readdir. A
 * larger one is read through a handle: its first SYNC_ENTRIES entries at once, the rest without
 * blocking the event loop.
 */
async function readFolder(dir: string): Promise<Dirent[]> {
  if (statSync(dir).size <= SYNC_FOLDER_BYTES) return readdirSync(dir, { withFileTypes: true })
  const handle = opendirSync(dir, { bufferSize: 64 })
  const entries: Dirent[] = []
  try {
    for (let entry = handle.readSync(); entry !== null; entry = handle.readSync()) {
      entries.push(entry)
      if (entries.length === SYNC_ENTRIES) {
        for await (const rest of handle) entries.push(rest)
        return entries
      }
    }
  } finally {
    // The async iterator closes the handle itself once it has read to the end (or failed).
    if (entries.length < SYNC_ENTRIES) handle.closeSync()
  }
  return entries
}

/** Folders a recursive listing shows but does not enter: large and rarely what the model is after. */
const notEntered = new Set(['.git', 'node_modules'])

/** fs_list: the entries of a folder, breadth first, capped. Symbolic links are listed, never followed. */
export function createFsListTool(opts: { maxEntries: number; maxBytes: number }): Tool<typeof Parameters> {
  return {
    name: 'fs_list',
    readOnly: true,
    description:
      `List a workspace folder (default the root). With recursive, sub-folders are listed too (not .git or node_modules), ` +
      `up to ${opts.maxEntries} entries. Symbolic links are shown, not followed.`,
    parameters: Parameters,
    async execute(input, ctx) {
      const relPath = input.path ?? '.'
      const dir = await resolveInWorkspace(ctx.workspace, relPath, { mustExist: true })
      const root = await workspaceRoot(ctx.workspace)
      const entries: Entry[] = []
      const queue = [dir]
      let truncated = false
      while (queue.length > 0 && !truncated) {
        ctx.signal.throwIfAborted()
        const current = queue.shift() as string
        // The path is real (no links left), so reading it as a folder tells whether it is one.
        const children = (await readFolder(current).catch((err: NodeJS.ErrnoException) => {
          if (err.code === 'ENOTDIR' && current === dir) {
            throw notDirectory(relPath)
          }
          // A sub-folder removed since it was listed, or named in bytes that are not UTF-8 (read as
          // UTF-8, its name leads nowhere): it is listed, not entered, and the listing goes on.
          if (err.code === 'ENOENT' && current !== dir) return []
          throw err
        })).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
        const sizes: Array<Promise<void>> = []
        for (const child of children) {
          if (entries.length >= opts.maxEntries) {
            truncated = true
            break
          }
          const full = path.join(current, child.name)
          const type: EntryType = child.isSymbolicLink() ? 'symlink' : child.isDirectory() ? 'dir' : child.isFile() ? 'file' : 'other'
          const entry: Entry = { path: toWorkspacePath(root, full), type }
          // The sizes of a folder's files are asked for together: the thread pool reads them side by side.
          // A file gone since, or named in bytes that are not UTF-8, is listed without its size.
          if (type === 'file') {
            sizes.push(lstat(full).then((stats) => { entry.size = stats.size }, (err: NodeJS.ErrnoException) => {
              if (err.code !== 'ENOENT') throw err
            }))
          }
          entries.push(entry)
          if (input.recursive && type === 'dir' && !notEntered.has(child.name)) queue.push(full)
        }
        await Promise.all(sizes)
      }
      const note = (shown: number) => `Only the first ${shown} entries are shown; list a sub-folder or use fs_glob to narrow down.`
      const result: Record<string, unknown> = { path: relPath, entries, truncated }
      if (truncated) result['note'] = note(entries.length)
      return fitListResult(result, 'entries', opts.maxBytes, note)
    },
    recommend(failure) {
      if (failure.code === 'OUTPUT_TOO_LARGE') return ['Narrow the search: a more specific pattern, a sub-folder as path, or a glob filter.']
      return recommendFsFailure(failure)
    }
  }
}
