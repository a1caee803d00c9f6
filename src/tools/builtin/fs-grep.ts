import { Type } from '@sinclair/typebox'
import { fitListResult } from '../output.ts'
import { ToolFailure } from '../tool-errors.ts'
import type { Tool } from '../types.ts'
import { runInWorker } from '../worker.ts'
import { refuseLoneSurrogate, resolveInWorkspace, workspaceRoot } from '../workspace.ts'
import { recommendFsFailure } from './fs-failures.ts'
import type { GrepJob, GrepResult } from './grep-worker.ts'

const Parameters = Type.Object(
  {
    pattern: Type.String({ minLength: 1, description: 'JavaScript regular expression searched line by line' }),
    path: Type.Optional(Type.String({ description: 'File or folder to search; default the workspace root' })),
    glob: Type.Optional(Type.String({ description: 'Only files matching this glob, e.g. "*.ts" (file name) or "src/**/*.ts" (path)' })),
    ignoreCase: Type.Optional(Type.Boolean({ description: 'Case-insensitive; default false' })),
    maxMatches: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, description: 'Default 200' }))
  },
  { additionalProperties: false }
)

const grepWorker = new URL('./grep-worker.ts', import.meta.url)

export interface FsGrepOptions {
  maxFileBytes: number
  /** V8 heap of the search thread. */
  maxHeapMb: number
  /** Bytes of the result as JSON; the matches that do not fit are left out. */
  maxBytes: number
}

/** fs_grep: a regular-expression search over workspace files, run on a worker thread so no pattern can block the service. */
export function createFsGrepTool(opts: FsGrepOptions): Tool<typeof Parameters> {
  return {
    name: 'fs_grep',
    readOnly: true,
    description:
      'Search workspace files for lines matching a regular expression. Returns {path, line, text} per match ' +
      '(at most maxMatches, default 200). Skips binary files, files over ' +
      `${opts.maxFileBytes} bytes, .git and node_modules, and does not follow symbolic links.`,
    parameters: Parameters,
    async execute(input, ctx) {
      try {
        new RegExp(input.pattern)
      } catch (err) {
        throw new ToolFailure('VALIDATION_ERROR', `The pattern is not a valid regular expression: ${(err as Error).message}`, {
          pattern: input.pattern,
          reason: 'invalid_regex'
        })
      }
      const root = await workspaceRoot(ctx.workspace)
      const start = await resolveInWorkspace(ctx.workspace, input.path ?? '.', { mustExist: true })
      const job: GrepJob = {
        root,
        start,
        pattern: input.pattern,
        ignoreCase: input.ignoreCase ?? false,
        maxMatches: input.maxMatches ?? 200,
        maxFileBytes: opts.maxFileBytes,
        maxLineChars: 500
      }
      if (input.glob !== undefined) {
        refuseLoneSurrogate('glob', input.glob)
        job.glob = input.glob
      }
      const result = await runInWorker<GrepResult>(grepWorker, 'grep', job, {
        signal: ctx.signal,
        resourceLimits: { maxOldGenerationSizeMb: opts.maxHeapMb }
      })
      return fitListResult({ ...result }, 'matches', opts.maxBytes, (shown) =>
        `Only the first ${shown} matches are shown; narrow the search with a more specific pattern, a sub-folder as path or a glob.`)
    },
    recommend(failure) {
      const { code, reason } = failure
      if (code === 'VALIDATION_ERROR' && reason === 'invalid_regex') {
        return ['The pattern is not a valid JavaScript regular expression; escape special characters such as ( [ { . * + ? with a backslash.']
      }
      if (code === 'TIMEOUT') return ['Search a narrower path or glob, and simplify the pattern (avoid nested quantifiers such as (a+)+).']
      if (code === 'OUTPUT_TOO_LARGE') return ['Narrow the search: a more specific pattern, a sub-folder as path, or a glob filter.']
      return recommendFsFailure(failure)
    }
  }
}
