import { constants } from 'node:fs'
import { mkdir, open, stat } from 'node:fs/promises'
import path from 'node:path'
import { Type } from '@sinclair/typebox'
import type { Tool } from '../types.ts'
import { resolveInWorkspace } from '../workspace.ts'
import { isDirectory, notRegularFile, recommendFsFailure } from './fs-failures.ts'

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
      const file = await resolveInWorkspace(ctx.workspace, input.path, { forWrite: true })
      const existed = await stat(file).then(
        (s) => {
          if (s.isDirectory()) throw isDirectory(input.path)
          if (!s.isFile()) throw notRegularFile(input.path)
          return true
        },
        () => false
      )
      await mkdir(path.dirname(file), { recursive: true })
      // O_NOFOLLOW: a link swapped in after the checks above cannot redirect the write;
      // O_NONBLOCK: nor can a FIFO block the open (it fails instead). Regular files ignore it.
      const flags = constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW | constants.O_NONBLOCK
      const handle = await open(file, flags, 0o644)
      try {
        await handle.writeFile(input.content, { signal: ctx.signal })
      } finally {
        await handle.close()
      }
      return { path: input.path, bytes: Buffer.byteLength(input.content), created: !existed }
    },
    recommend: recommendFsFailure
  }
}
