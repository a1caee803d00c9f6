import { createReadStream } from 'node:fs'
import { open, stat } from 'node:fs/promises'
import { Type } from '@sinclair/typebox'
import { jsonFittingPrefix, utf8Prefix } from '../output.ts'
import type { Tool } from '../types.ts'
import { resolveInWorkspace } from '../workspace.ts'
import { isDirectory, notRegularFile, recommendFsFailure } from './fs-failures.ts'

const Parameters = Type.Object(
  {
    path: Type.String({ minLength: 1, description: 'File path relative to the workspace root' }),
    offset: Type.Optional(Type.Integer({ minimum: 1, description: 'First line to read (1-based); default 1' })),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 10_000, description: 'Number of lines to read; default 2000' }))
  },
  { additionalProperties: false }
)

const defaultLimit = 2000
const sniffBytes = 8192

/** fs_read: lines of a text file, streamed so that neither a huge file nor a huge line is held in memory. */
export function createFsReadTool(opts: { maxBytes: number }): Tool<typeof Parameters> {
  return {
    name: 'fs_read',
    readOnly: true,
    description:
      'Read a text file of the workspace. Returns its lines from `offset` (1-based) for `limit` lines (default 2000), ' +
      `at most ${opts.maxBytes} bytes; \`hasMore\` says whether lines follow, to read on with a larger offset.`,
    parameters: Parameters,
    async execute(input, ctx) {
      const file = await resolveInWorkspace(ctx.workspace, input.path, { mustExist: true, file: true })
      const info = await stat(file)
      if (info.isDirectory()) throw isDirectory(input.path)
      // Opening a FIFO or device would block a libuv thread for good, whatever the timeout does.
      if (!info.isFile()) throw notRegularFile(input.path)
      if (await looksBinary(file)) {
        return { path: input.path, binary: true, size: info.size, content: null, note: 'The file looks binary (it contains NUL bytes); not shown.' }
      }
      const offset = input.offset ?? 1
      const limit = input.limit ?? defaultLimit
      // maxBytes bounds the result's JSON, which is what the model reads (a larger one reaches it
      // cut as text, without hasMore or where to go on): the content gets what the rest leaves.
      const budget = Math.max(0, opts.maxBytes - resultOverhead(input.path, offset, limit, opts.maxBytes))
      const read = await readLines(file, offset, limit, budget, ctx.signal)
      if (read.linesSeen < offset && info.size > 0) {
        return {
          ok: false,
          code: 'NOT_FOUND',
          error: `"${input.path}" has ${read.linesSeen} lines; offset ${offset} is past the end.`,
          path: input.path,
          reason: 'offset_past_end',
          lines: read.linesSeen
        }
      }
      const result: Record<string, unknown> = {
        path: input.path,
        content: read.lines.join('\n'),
        startLine: offset,
        endLine: offset + read.lines.length - 1,
        hasMore: read.hasMore
      }
      if (read.cutLine) result['note'] = cutLineNote(offset + read.lines.length - 1, opts.maxBytes)
      else if (read.cutAtBytes) result['note'] = stoppedNote(opts.maxBytes, offset + read.lines.length)
      return result
    },
    recommend(failure) {
      if (failure.code === 'NOT_FOUND' && failure.reason === 'offset_past_end') {
        return [`"${failure.path}" has ${String(failure.detail?.['lines'])} lines; read it with an offset within that range, or without offset from the start.`]
      }
      if (failure.code === 'OUTPUT_TOO_LARGE') return ['Read the file in parts with offset and limit (line numbers).']
      return recommendFsFailure(failure)
    }
  }
}

const cutLineNote = (line: number, maxBytes: number) => `Line ${line} is longer than ${maxBytes} bytes and was cut.`
const stoppedNote = (maxBytes: number, next: number) => `Output stopped at ${maxBytes} bytes; continue with offset ${next}.`

/** JSON bytes of a result with empty content: its other fields at their largest, and the longer note. */
function resultOverhead(path: string, offset: number, limit: number, maxBytes: number): number {
  const last = offset + limit
  return Math.max(...[cutLineNote(last, maxBytes), stoppedNote(maxBytes, last)].map((note) =>
    Buffer.byteLength(JSON.stringify({ path, content: '', startLine: offset, endLine: last, hasMore: true, note }))))
}

async function looksBinary(file: string): Promise<boolean> {
  const handle = await open(file, 'r')
  try {
    const { buffer, bytesRead } = await handle.read(Buffer.alloc(sniffBytes), 0, sniffBytes, 0)
    return buffer.subarray(0, bytesRead).includes(0)
  } finally {
    await handle.close()
  }
}

interface ReadLines {
  lines: string[]
  /** Lines counted so far (all of them when the end was reached). */
  linesSeen: number
  hasMore: boolean
  cutAtBytes: boolean
  cutLine: boolean
}

/**
 * Splits the byte stream itself: lines before `offset` are never buffered, and a line is buffered
 * only up to the byte budget, which counts the lines as the content's JSON (escapes included).
 */
async function readLines(file: string, offset: number, limit: number, maxBytes: number, signal: AbortSignal): Promise<ReadLines> {
  const out: ReadLines = { lines: [], linesSeen: 0, hasMore: false, cutAtBytes: false, cutLine: false }
  let used = 0
  let parts: Buffer[] = []
  let partBytes = 0
  let overflow = false
  let pending = false
  let full = false

  // Ends the current line; false once reading should stop.
  const finishLine = (): boolean => {
    out.linesSeen++
    pending = false
    if (out.linesSeen < offset) return true
    const line = utf8Prefix(Buffer.concat(parts, partBytes), maxBytes).replace(/\r$/, '')
    parts = []
    partBytes = 0
    // The line's escaped text, and the escaped newline that joins it to the one before.
    const cost = Buffer.byteLength(JSON.stringify(line)) - 2 + (out.lines.length > 0 ? 2 : 0)
    if (overflow || used + cost > maxBytes) {
      if (out.lines.length === 0) {
        // jsonFittingPrefix counts the quotes too.
        out.lines.push(jsonFittingPrefix(line, maxBytes + 2))
        out.cutLine = true
      } else out.cutAtBytes = true
      out.hasMore = true
      return false
    }
    out.lines.push(line)
    used += cost
    full = out.lines.length >= limit
    return true
  }

  const stream = createReadStream(file, { signal })
  try {
    outer: for await (const chunk of stream as AsyncIterable<Buffer>) {
      let start = 0
      for (;;) {
        if (full) {
          if (start < chunk.length) {
            out.hasMore = true
            break outer
          }
          break
        }
        const nl = chunk.indexOf(10, start)
        const end = nl === -1 ? chunk.length : nl
        if (end > start) pending = true
        if (out.linesSeen + 1 >= offset && !overflow) {
          const room = Math.max(0, maxBytes - used - partBytes)
          const piece = chunk.subarray(start, Math.min(end, start + room))
          if (piece.length > 0) {
            parts.push(piece)
            partBytes += piece.length
          }
          if (end - start > piece.length) overflow = true
        }
        if (nl === -1) break
        if (!finishLine()) break outer
        start = nl + 1
      }
    }
    // A last line without a trailing newline.
    if (pending && !full && !out.hasMore) finishLine()
  } finally {
    stream.destroy()
  }
  return out
}
