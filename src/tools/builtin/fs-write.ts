import { mkdir, stat } from 'node:fs/promises'
import path from 'node:path'
import { Type } from '@sinclair/typebox'
import type { Tool } from '../types.ts'
import { resolveInWorkspace } from '../workspace.ts'
import { isDirectory, notRegularFile, parentNotDirectory, recommendFsFailure } from './fs-failures.ts'
import { replaceFile } from './fs-replace.ts'

const Parameters = Type.Object(
  {
    path: Type.String({ minLength: 1, description: 'File path relative to the workspace root' }),
    content: Type.String({ description: 'The complete new content of the file' })
  },
  { additionalProperties: false }
)

/** fs_write: creates or replaces a file, creating missing folders. */
export function createFsWriteTool(): Tool<typeof Parameters> {
  return {
    name: 'fs_write',
    description: 'Create or overwrite a file of the workspace with `content`; missing parent folders are created.',
    parameters: Parameters,
    async execute(input, ctx) {
      const file = await resolveInWorkspace(ctx.workspace, input.path, { forWrite: true, file: true })
      const existing = await stat(file).then(
        (s) => {
          if (s.isDirectory()) throw isDirectory(input.path)
          if (!s.isFile()) throw notRegularFile(input.path)
          return s
        },
        () => null
      )
      await mkdir(path.dirname(file), { recursive: true }).catch((err: NodeJS.ErrnoException) => {
        if (err.code === 'EEXIST' || err.code === 'ENOTDIR') throw parentNotDirectory(input.path, err)
        throw err
      })
      // A new file renamed over the path: neither a link swapped in after the checks above nor a
      // hard link to a file outside the workspace is written through, and a failed write leaves the old file.
      await replaceFile(file, input.content, { relPath: input.path, mode: existing ? existing.mode & 0o7777 : 0o644, signal: ctx.signal })
      return { path: input.path, bytes: Buffer.byteLength(input.content), created: existing === null }
    },
    recommend: recommendFsFailure
  }
}
