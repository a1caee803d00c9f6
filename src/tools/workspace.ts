import { lstatSync, readlinkSync, realpathSync, statSync } from 'node:fs'
import { mkdir, realpath, rm } from 'node:fs/promises'
import path from 'node:path'
import { makeFolders } from '../make-folders.ts'
import { loneSurrogateAt } from '../whole-chars.ts'
import { ToolFailure } from './tool-errors.ts'

export interface ResolveOptions {
  /** The path must exist (else NOT_FOUND, a logical error). */
  mustExist?: boolean
  /** The path will be written: the workspace root itself is refused. */
  forWrite?: boolean
  /**
   * The path must name a file (fs_read, fs_write, fs_edit): one ending in "/" (or "/.", "/..")
   * names a folder and is refused, instead of resolving to the name without the slash.
   */
  file?: boolean
}

/**
 * Resolves a path the model gave (relative to the workspace, or absolute inside it) to an absolute
 * real path inside the workspace. Symbolic links are followed through realpath, also dangling ones
 * and for paths that do not exist yet (the nearest existing parent is realpath'ed), so no link can
 * lead out. Anything outside is refused with PATH_TRAVERSAL.
 *
 * The resolution is synchronous on purpose: realpath(3), lstat and readlink of one path are a few
 * microseconds of bounded work (at most PATH_MAX bytes and 40 link hops), while each of them
 * through libuv's thread pool costs two thread wake-ups, 30-150 µs per call on a busy machine:
 * most of a cheap tool's time. Work that grows with the input (reading a folder or a file) stays
 * asynchronous.
 */
export async function resolveInWorkspace(root: string, relPath: string, options: ResolveOptions = {}): Promise<string> {
  if (typeof relPath !== 'string' || relPath.includes('\0')) {
    throw new ToolFailure('VALIDATION_ERROR', 'The path must be a string without NUL characters.', { path: String(relPath) })
  }
  refuseLoneSurrogate('path', relPath)
  const realRoot = await workspaceRoot(root)
  const lexical = path.resolve(realRoot, relPath)
  if (!isInside(realRoot, lexical)) throw traversal(relPath)
  // path.resolve drops a trailing "/" (and "/."): "new/" would be the file "new", "README.md/" the file README.md.
  const folderEnd = folderSyntax(relPath)
  if (folderEnd !== undefined && options.file) throw namesAFolder(relPath, folderEnd)
  const resolved = resolveOrRefuse(relPath, () => realpathAllowMissing(lexical, 0))
  if (!isInside(realRoot, resolved.path)) throw traversal(relPath)
  // A folder named so, that is a file: not listed, searched or globbed in as the file. ("." and a
  // path ending in ".." resolve to a folder whatever they follow: no stat for fs_list's default ".")
  if ((folderEnd === '/' || folderEnd === '/.') && resolved.exists && !statSync(resolved.path).isDirectory()) {
    throw notDirectory(relPath)
  }
  // A path no file system call could take (one to be made, below a real parent) is a bad argument, not an I/O failure.
  if (Buffer.byteLength(resolved.path) > MAX_PATH_BYTES || resolved.path.split(path.sep).some((name) => Buffer.byteLength(name) > MAX_NAME_BYTES)) {
    throw tooLong(relPath)
  }
  if (options.mustExist && !resolved.exists) {
    throw new ToolFailure('NOT_FOUND', `"${relPath}" does not exist in the workspace.`, { path: relPath })
  }
  if (options.forWrite && resolved.path === realRoot) {
    throw new ToolFailure('IO_ERROR', 'The workspace root is a directory and cannot be written as a file.', {
      path: relPath,
      reason: 'is_directory'
    })
  }
  return resolved.path
}

/**
 * The real path of a workspace root, resolved once per root: a workspace is created real
 * (ensureWorkspace), and a root swapped for a symbolic link later would only lead paths out,
 * which resolveInWorkspace then refuses against the path remembered here.
 */
const realRoots = new Map<string, string>()
export async function workspaceRoot(root: string): Promise<string> {
  const known = realRoots.get(root)
  if (known !== undefined) return known
  const real = realpathSync.native(root)
  rememberRoot(root, real)
  return real
}

function rememberRoot(root: string, real: string): void {
  // Bounded: past this many workspaces the map starts over (each root is resolved again on its next use).
  if (realRoots.size >= 10_000) realRoots.clear()
  realRoots.set(root, real)
}

/** The workspace-relative form of an absolute path inside it ("." for the root), with "/" separators. */
export function toWorkspacePath(root: string, absolute: string): string {
  const relative = path.relative(root, absolute)
  return relative === '' ? '.' : relative.split(path.sep).join('/')
}

/** True when `candidate` is `root` or below it (both absolute and normalised). */
export function isInside(root: string, candidate: string): boolean {
  if (candidate === root) return true
  const prefix = root.endsWith(path.sep) ? root : root + path.sep
  return candidate.startsWith(prefix)
}

const sessionFolder = /^[A-Za-z0-9_-]{1,128}$/

/** Removes a session's workspace folder and everything in it (the session was deleted). */
export async function removeWorkspace(rootDir: string, sessionId: string): Promise<void> {
  if (!sessionFolder.test(sessionId)) throw new Error(`Invalid session id for a workspace folder: ${JSON.stringify(sessionId)}`)
  await rm(path.join(path.resolve(rootDir), sessionId), { recursive: true, force: true })
}

/** Creates `<rootDir>/<sessionId>` (and `rootDir`) if needed and returns its real path. */
export async function ensureWorkspace(rootDir: string, sessionId: string): Promise<string> {
  if (!sessionFolder.test(sessionId)) throw new Error(`Invalid session id for a workspace folder: ${JSON.stringify(sessionId)}`)
  const dir = path.join(path.resolve(rootDir), sessionId)
  // One file-system call in the common case (each is a hop to libuv's thread pool): a folder
  // this call made is no link, so its real path is the root's (resolved once) plus its name.
  const created = await mkdir(dir).then(() => true, (err: NodeJS.ErrnoException) => {
    if (err.code === 'EEXIST') return false
    if (err.code === 'ENOENT') return makeFolders(dir).then(() => false)
    throw err
  })
  const real = created ? path.join(await workspaceRoot(path.resolve(rootDir)), sessionId) : await realpath(dir)
  // The tools resolve their paths against this root: known real, it costs them no further call.
  rememberRoot(real, real)
  return real
}

/**
 * How a path written as a folder ends ("/", "/." or "/.."; "." and ".." alone too), or undefined
 * for a path that may name a file. The file system would take it as a folder (open("new/",
 * O_CREAT) is EISDIR), but path.resolve drops that ending.
 */
export function folderSyntax(relPath: string): string | undefined {
  if (relPath.endsWith('/')) return '/'
  const last = relPath.slice(relPath.lastIndexOf('/') + 1)
  if (last !== '.' && last !== '..') return undefined
  return relPath.includes('/') ? `/${last}` : last
}

/** A path the tool takes as a folder names a file: no retry makes a file a folder. */
export function notDirectory(relPath: string): ToolFailure {
  return new ToolFailure('IO_ERROR', `"${relPath}" is not a directory.`, { path: relPath, reason: 'not_directory' }, { retryable: false })
}

/** A file tool was given a path that names a folder: no retry of the same argument can name a file. */
function namesAFolder(relPath: string, ending: string): ToolFailure {
  const why = ending.startsWith('/') ? `it ends with "${ending}"` : `"${ending}" is one`
  return new ToolFailure('VALIDATION_ERROR', `"${relPath}" names a folder (${why}), not a file.`, {
    path: relPath,
    reason: 'names_a_folder'
  })
}

/**
 * Refuses a string argument holding a lone UTF-16 surrogate (JSON may carry "\ud800" alone): the
 * file system stores names as UTF-8, where Node writes U+FFFD in its place, so the file made or
 * found would be another than the one named. `field` is the argument's name, e.g. `path`.
 */
export function refuseLoneSurrogate(field: string, value: string): void {
  const index = loneSurrogateAt(value)
  if (index < 0) return
  const unit = `\\u${value.charCodeAt(index).toString(16).padStart(4, '0')}`
  throw new ToolFailure(
    'VALIDATION_ERROR',
    `The ${field} ${JSON.stringify(value)} holds a lone UTF-16 surrogate (${unit} at index ${index}): no file name can hold it, and the file system would name another file.`,
    {
      reason: 'lone_surrogate',
      index,
      fields: [{ field, expected: 'well-formed Unicode text (no lone UTF-16 surrogate)', message: `lone surrogate ${unit} at index ${index}` }]
    },
    {
      recommendations: [
        `Send "${field}" as well-formed Unicode: the ${unit} at index ${index} is one half of a UTF-16 surrogate pair without the other.`,
        'Write the character you mean whole (both halves of its pair), or use a plain ASCII name.'
      ]
    }
  )
}

/** Linux's NAME_MAX and PATH_MAX - 1 (the terminating NUL). */
const MAX_NAME_BYTES = 255
const MAX_PATH_BYTES = 4095

function tooLong(relPath: string): ToolFailure {
  return new ToolFailure('VALIDATION_ERROR', `"${relPath}" is too long: a name may have at most ${MAX_NAME_BYTES} bytes, a path ${MAX_PATH_BYTES}.`, {
    path: relPath,
    reason: 'name_too_long'
  })
}

/** A path too long, or whose links go round in a loop: no retry can resolve it. */
function resolveOrRefuse<T>(relPath: string, resolve: () => T): T {
  try {
    return resolve()
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code
    if (code === 'ENAMETOOLONG') throw tooLong(relPath)
    if (code === 'ELOOP') {
      throw new ToolFailure('IO_ERROR', `"${relPath}" cannot be resolved: its symbolic links lead round in a loop (or through more than ${maxLinkHops}).`, {
        path: relPath, reason: 'link_loop', errno: 'ELOOP'
      }, { retryable: false, cause: err })
    }
    throw err
  }
}

function traversal(relPath: string): ToolFailure {
  return new ToolFailure('PATH_TRAVERSAL', `"${relPath}" is outside the session workspace.`, { path: relPath })
}

const maxLinkHops = 40

/** realpath for paths that may not exist yet: the real path of the nearest existing ancestor plus the rest. */
function realpathAllowMissing(target: string, hops: number): { path: string; exists: boolean } {
  let current = target
  const rest: string[] = []
  for (;;) {
    try {
      const real = realpathSync.native(current)
      return { path: path.join(real, ...rest), exists: rest.length === 0 }
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code
      if (code !== 'ENOENT' && code !== 'ENOTDIR') throw err
    }
    // A dangling link would be created through on write, so its target is what must stay inside.
    let isLink = false
    try {
      isLink = lstatSync(current).isSymbolicLink()
    } catch {
      // Missing: go on with its parent.
    }
    if (isLink) {
      if (hops >= maxLinkHops) throw Object.assign(new Error('Too many levels of symbolic links'), { code: 'ELOOP' })
      const linkTarget = path.resolve(path.dirname(current), readlinkSync(current))
      return realpathAllowMissing(path.join(linkTarget, ...rest), hops + 1)
    }
    const parent = path.dirname(current)
    if (parent === current) return { path: path.join(current, ...rest), exists: false }
    rest.unshift(path.basename(current))
    current = parent
  }
}
