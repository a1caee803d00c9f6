import { realpathSync, type Dirent } from 'node:fs'
import { glob } from 'node:fs/promises'
import path from 'node:path'
import { Type } from '@sinclair/typebox'
import { braceExpand } from 'minimatch'
import { fitListResult } from '../output.ts'
import { ToolFailure } from '../tool-errors.ts'
import type { Tool } from '../types.ts'
import { isInside, refuseLoneSurrogate, resolveInWorkspace, toWorkspacePath, workspaceRoot } from '../workspace.ts'
import { recommendFsFailure } from './fs-failures.ts'

const Parameters = Type.Object(
  {
    pattern: Type.String({ minLength: 1, description: 'Glob pattern relative to the workspace root, e.g. "src/**/*.ts"' }),
    path: Type.Optional(Type.String({ description: 'Folder to search from; default the workspace root' }))
  },
  { additionalProperties: false }
)

const skipped = new Set(['.git', 'node_modules'])
/** More alternatives than this (braces multiply: ten `{a,b}` make 1024) is a pattern no search needs. */
const MAX_EXPANSIONS = 256

/** Whether a path, its links followed to the end, is inside the workspace (false for a dangling link). */
function linksInside(root: string, link: string): boolean {
  try {
    return isInside(root, realpathSync(link))
  } catch {
    return false
  }
}

/** fs_glob: workspace paths matching a glob (node:fs/promises glob), confined to the workspace and capped. */
export function createFsGlobTool(opts: { maxResults: number; maxBytes: number }): Tool<typeof Parameters> {
  return {
    name: 'fs_glob',
    readOnly: true,
    description:
      'Find workspace files and folders whose path matches a glob pattern ("**" spans folders). ' +
      `Paths are relative to the workspace root; at most ${opts.maxResults} are returned, sorted. ` +
      '.git and node_modules are searched only when the pattern names them.',
    parameters: Parameters,
    async execute(input, ctx) {
      refuseLoneSurrogate('pattern', input.pattern)
      // Braces are expanded first (as glob does), so "{..,x}/*" is checked as "../*" and "x/*".
      // Expanding one past the limit is enough to know the pattern is over it.
      const expanded = braceExpand(input.pattern, { braceExpandMax: MAX_EXPANSIONS + 1 })
      if (expanded.length > MAX_EXPANSIONS) {
        throw new ToolFailure('VALIDATION_ERROR', `The pattern "${input.pattern}" expands to more than ${MAX_EXPANSIONS} patterns; use fewer braces.`, {
          pattern: input.pattern, reason: 'too_many_expansions'
        })
      }
      const segments = expanded.flatMap((pattern) => pattern.split(/[\\/]+/))
      if (expanded.some((pattern) => path.isAbsolute(pattern)) || segments.includes('..')) {
        throw new ToolFailure('PATH_TRAVERSAL', `The pattern "${input.pattern}" reaches outside the workspace.`, { pattern: input.pattern })
      }
      const root = await workspaceRoot(ctx.workspace)
      const cwd = await resolveInWorkspace(ctx.workspace, input.path ?? '.', { mustExist: true })
      const named = segments.filter((s) => skipped.has(s))
      // glob asks before it enters or yields each path: the walk never leaves the workspace,
      // whatever the pattern, and once the call is aborted (timeout, interrupt) it enters
      // nothing more, so the work stops instead of going on unawaited. A folder is checked by its
      // real path, once: glob enters a link named by the pattern without asking ("link/**"
      // through a link to / walked the whole file system until the timeout).
      const insideFolders = new Map<string, boolean>()
      const exclude = (entry: Dirent) => {
        if (ctx.signal.aborted) return true
        const folder = path.resolve(cwd, entry.parentPath)
        let inside = insideFolders.get(folder)
        if (inside === undefined) insideFolders.set(folder, (inside = linksInside(root, folder)))
        if (!inside) return true
        if (skipped.has(entry.name) && !named.includes(entry.name)) return true
        return entry.isSymbolicLink() && !linksInside(root, path.join(folder, entry.name))
      }
      const matches: string[] = []
      let truncated = false
      for await (const match of glob(input.pattern, { cwd, exclude, withFileTypes: true })) {
        ctx.signal.throwIfAborted()
        const absolute = path.resolve(cwd, match.parentPath, match.name)
        // glob does not follow links into folders, but a matched link itself may point out.
        const inside = await resolveInWorkspace(root, absolute).then(
          (real) => isInside(root, real),
          () => false
        )
        if (!inside) continue
        if (matches.length >= opts.maxResults) {
          truncated = true
          break
        }
        matches.push(toWorkspacePath(root, absolute))
      }
      ctx.signal.throwIfAborted()
      matches.sort()
      const note = (shown: number) => `Only ${shown} matches are shown; use a more specific pattern.`
      const result: Record<string, unknown> = { pattern: input.pattern, matches, truncated }
      if (truncated) result['note'] = note(matches.length)
      return fitListResult(result, 'matches', opts.maxBytes, note)
    },
    recommend(failure) {
      if (failure.code === 'OUTPUT_TOO_LARGE') return ['Narrow the search: a more specific pattern, a sub-folder as path, or a glob filter.']
      return recommendFsFailure(failure)
    }
  }
}
