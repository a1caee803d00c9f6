import { readFileSync } from 'node:fs'

/** What fs_edit decided about one replacement; `content` only when it may be written. */
export type EditPlan =
  | { kind: 'no_match' }
  | { kind: 'ambiguous'; occurrences: number }
  | { kind: 'too_large'; occurrences: number; bytes: number }
  | { kind: 'ok'; occurrences: number; content: string }

export interface EditJob {
  file: string
  oldText: string
  newText: string
  replaceAll: boolean
  /** The largest file the edit may leave, in bytes. */
  maxFileBytes: number
}

/** Pieces joined at a time: a million one-letter matches never make one array of millions of strings. */
const JOIN_EVERY = 65_536

/**
 * The edit of a file's text. fs_read shows lines without their "\r": a multi-line oldText copied
 * from a CRLF file matches nothing as given, so it is tried again with the file's line ends (and
 * newText gets them too).
 */
export function planEdit(text: string, job: Omit<EditJob, 'file'>): EditPlan {
  const plan = planReplacement(text, job.oldText, job.newText, job)
  if (plan.kind !== 'no_match' || !job.oldText.includes('\n') || !text.includes('\r\n')) return plan
  const crlf = (s: string) => s.replace(/\r?\n/g, '\r\n')
  return planReplacement(text, crlf(job.oldText), crlf(job.newText), job)
}

/**
 * Counts the matches and sizes the result before building it, so an edit that would multiply the
 * file (a short oldText everywhere, a long newText) costs neither the memory nor the disk.
 */
function planReplacement(text: string, oldText: string, newText: string, job: Omit<EditJob, 'file'>): EditPlan {
  let occurrences = 0
  for (let at = text.indexOf(oldText); at !== -1; at = text.indexOf(oldText, at + oldText.length)) occurrences++
  if (occurrences === 0) return { kind: 'no_match' }
  if (occurrences > 1 && !job.replaceAll) return { kind: 'ambiguous', occurrences }
  const bytes = Buffer.byteLength(text) + occurrences * (Buffer.byteLength(newText) - Buffer.byteLength(oldText))
  if (bytes > job.maxFileBytes) return { kind: 'too_large', occurrences, bytes }
  // Literal pieces, not String.replace: "$&" and friends in newText stay as they are.
  const chunks: string[] = []
  let pieces: string[] = []
  let from = 0
  for (let at = text.indexOf(oldText); at !== -1; at = text.indexOf(oldText, from)) {
    pieces.push(text.slice(from, at), newText)
    from = at + oldText.length
    if (pieces.length >= JOIN_EVERY) {
      chunks.push(pieces.join(''))
      pieces = []
    }
  }
  pieces.push(text.slice(from))
  chunks.push(pieces.join(''))
  return { kind: 'ok', occurrences, content: chunks.join('') }
}

/** planEdit of a file, on a worker thread (runInWorker) for files too large to edit on the event loop. */
export function planFileEdit(job: EditJob): EditPlan {
  return planEdit(readFileSync(job.file, 'utf8'), job)
}
