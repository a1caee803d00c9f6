import { posix } from 'node:path'
import { ToolFailure, type ToolFailureFacts } from '../tool-errors.ts'

// What the fs_* tools share about their failures: the reasons they give and the advice on them.

/** A FIFO, socket or device: reading it could block forever. */
export function notRegularFile(relPath: string): ToolFailure {
  return new ToolFailure('IO_ERROR', `"${relPath}" is not a regular file.`, { path: relPath, reason: 'not_regular_file' }, { retryable: false })
}

/** A file was expected where there is a folder. */
export function isDirectory(relPath: string): ToolFailure {
  return new ToolFailure('IO_ERROR', `"${relPath}" is a directory.`, { path: relPath, reason: 'is_directory' })
}

/** A file stands where a folder of the path should be: no retry can make the folder. */
export function parentNotDirectory(relPath: string, cause: unknown): ToolFailure {
  return new ToolFailure('IO_ERROR', `"${relPath}" cannot be made: part of its folder path is a file, not a folder.`, {
    path: relPath, reason: 'parent_not_directory'
  }, { retryable: false, cause })
}

/** The file system is full (or the quota used up): the file was left as it was. */
export function diskFull(relPath: string, cause: unknown): ToolFailure {
  return new ToolFailure('IO_ERROR', `No space left on the disk: "${relPath}" was left as it was.`, { path: relPath, reason: 'disk_full' }, {
    retryable: false,
    cause
  })
}

/** Advice on the failures every fs_* tool can meet: a missing path, a folder or file of the wrong kind. */
export function recommendFsFailure({ tool, code, reason, path, detail }: ToolFailureFacts): string[] | undefined {
  if (code === 'NOT_FOUND' && path !== undefined) {
    const base = path.split('/').filter(Boolean).pop() ?? path
    const dir = path.includes('/') ? path.slice(0, path.lastIndexOf('/')) || '.' : '.'
    return [
      `"${path}" does not exist in the workspace.`,
      `Use fs_glob with a pattern such as "**/${base}" to find it, or fs_list on "${dir}" to see what is there.`
    ]
  }
  if (code === 'VALIDATION_ERROR' && reason === 'names_a_folder' && path !== undefined) {
    // "new/" -> "new", "a/b/." -> "a/b", "new/.." -> ".".
    const folder = posix.normalize(path).replace(/\/+$/, '') || '.'
    const inFolder = folder === '.' ? '' : `${folder}/`
    if (tool === 'fs_write') {
      return [
        `"${path}" names a folder; fs_write writes a file: give the file's name after the folder, e.g. "${inFolder}notes.txt".`,
        ...(folder === '.' ? [] : [`To write the file "${folder}" itself, name it without the "/".`])
      ]
    }
    return [
      `"${path}" names a folder, not a file.${folder === '.' ? '' : ` If "${folder}" is the file, name it without the "/" ("${folder}").`}`,
      `To ${tool === 'fs_edit' ? 'edit' : 'read'} a file in the folder, name it, e.g. "${inFolder}<file>"; use fs_list on "${folder}" to see its entries.`
    ]
  }
  if (reason === 'name_too_long') {
    return [`"${path}" is too long for the file system; use names of at most 255 bytes and paths of at most 4095.`]
  }
  if (code !== 'IO_ERROR') return undefined
  if (reason === 'is_directory' || detail?.['errno'] === 'EISDIR') {
    return [`"${path}" is a directory; use fs_list to see its entries, or name a file inside it.`]
  }
  if (reason === 'parent_not_directory') {
    return [`Part of "${path}"'s folder path is a file; use fs_list on its parent folders to see which, and choose another path.`]
  }
  if (reason === 'link_loop') return [`"${path}" leads through symbolic links that go round in a loop; do not retry it, use fs_list on its folder to see the links.`]
  if (reason === 'not_directory') return [`"${path}" is a file, not a folder; read it with fs_read, or list its parent folder.`]
  if (reason === 'disk_full') {
    return [
      `The disk is full; "${path}" was not changed. Do not retry the same write.`,
      'Delete files that are no longer needed or write less, or tell the user that the disk is full.'
    ]
  }
  if (reason === 'not_regular_file') return [`"${path}" is a pipe, socket or device; only regular files can be read or written.`]
  return undefined
}
