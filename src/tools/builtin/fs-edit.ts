import { readFile, stat } from 'node:fs/promises'
import { Type } from '@sinclair/typebox'
import { ToolFailure } from '../tool-errors.ts'
import type { Tool } from '../types.ts'
import { runInWorker } from '../worker.ts'
import { resolveInWorkspace } from '../workspace.ts'
import { planEdit, type EditJob, type EditPlan } from './edit-worker.ts'
import { isDirectory, notRegularFile, recommendFsFailure } from './fs-failures.ts'
import { replaceFile } from './fs-replace.ts'

const Parameters = Type.Object(
  {
    path: Type.String({ minLength: 1, description: 'File path relative to the workspace root' }),
    oldText: Type.String({ minLength: 1, description: 'Exact text to replace, including whitespace' }),
    newText: Type.String({ description: 'Replacement text' }),
    replaceAll: Type.Optional(Type.Boolean({ description: 'Replace every occurrence; default false (oldText must then occur exactly once)' }))
  },
  { additionalProperties: false }
)

const editWorker = new URL('./edit-worker.ts', import.meta.url)
/** Files up to this size are edited on the event loop (a few milliseconds at worst); larger ones on a worker thread. */
const INLINE_BYTES = 256 * 1024

/** fs_edit: replaces exact text in a file; a missing or ambiguous match is a logical failure the model can correct. */
export function createFsEditTool(opts: { maxFileBytes: number }): Tool<typeof Parameters> {
  return {
    name: 'fs_edit',
    description:
      'Replace `oldText` with `newText` in a workspace file. `oldText` must match exactly once unless `replaceAll` is true.',
    parameters: Parameters,
    async execute(input, ctx) {
      const file = await resolveInWorkspace(ctx.workspace, input.path, { mustExist: true, file: true })
      const info = await stat(file)
      if (info.isDirectory()) throw isDirectory(input.path)
      if (!info.isFile()) throw notRegularFile(input.path)
      if (info.size > opts.maxFileBytes) {
        throw new ToolFailure('OUTPUT_TOO_LARGE', `"${input.path}" is ${info.size} bytes; fs_edit handles files up to ${opts.maxFileBytes} bytes.`, {
          path: input.path,
          size: info.size
        })
      }
      const job: EditJob = { file, oldText: input.oldText, newText: input.newText, replaceAll: input.replaceAll ?? false, maxFileBytes: opts.maxFileBytes }
      const plan =
        info.size <= INLINE_BYTES
          ? planEdit(await readFile(file, { encoding: 'utf8', signal: ctx.signal }), job)
          : await runInWorker<EditPlan>(editWorker, 'planFileEdit', job, { signal: ctx.signal })
      if (plan.kind === 'no_match') {
        return { ok: false, code: 'NOT_FOUND', error: `oldText was not found in "${input.path}".`, path: input.path, reason: 'no_match' }
      }
      if (plan.kind === 'ambiguous') {
        return {
          ok: false,
          code: 'VALIDATION_ERROR',
          error: `oldText occurs ${plan.occurrences} times in "${input.path}"; it must occur once, or set replaceAll.`,
          path: input.path,
          reason: 'ambiguous',
          occurrences: plan.occurrences
        }
      }
      if (plan.kind === 'too_large') {
        throw new ToolFailure(
          'OUTPUT_TOO_LARGE',
          `Replacing ${plan.occurrences} occurrences would make "${input.path}" ${plan.bytes} bytes; fs_edit leaves files of at most ${opts.maxFileBytes} bytes.`,
          { path: input.path, reason: 'result_too_large', bytes: plan.bytes, occurrences: plan.occurrences, maxBytes: opts.maxFileBytes }
        )
      }
      await replaceFile(file, plan.content, { relPath: input.path, mode: info.mode & 0o7777, signal: ctx.signal })
      return { path: input.path, replacements: plan.occurrences }
    },
    recommend(failure) {
      const { code, reason, path } = failure
      if (code === 'NOT_FOUND' && reason === 'no_match') {
        return [
          `oldText does not occur in "${path}". Read the file with fs_read and copy the exact text to replace, including whitespace and line breaks.`,
          'Keep oldText short but unique: a few whole lines around the change.'
        ]
      }
      if (code === 'VALIDATION_ERROR' && reason === 'ambiguous') {
        return [
          `oldText occurs ${String(failure.detail?.['occurrences'] ?? 'several')} times in "${path}". Include more surrounding lines so it matches once,`,
          'or set replaceAll: true to replace every occurrence.'
        ]
      }
      if (code === 'OUTPUT_TOO_LARGE' && reason === 'result_too_large') {
        return [
          `The edit would make "${path}" larger than ${String(failure.detail?.['maxBytes'])} bytes; nothing was changed.`,
          'Replace fewer occurrences (a longer, unique oldText without replaceAll) or a shorter newText, or put the content in several files.'
        ]
      }
      if (code === 'OUTPUT_TOO_LARGE') {
        return ['The file is too large for fs_edit; write the changed content in smaller files, or edit it with a command if bash_run is available.']
      }
      return recommendFsFailure(failure)
    }
  }
}
