import { Type } from '@sinclair/typebox'
import { ToolFailure } from '../tool-errors.ts'
import { runCommand, type CommandResult } from '../command.ts'
import { jsonFittingPrefix, truncationNote } from '../output.ts'
import type { Tool } from '../types.ts'

const Parameters = Type.Object(
  {
    command: Type.String({ minLength: 1, description: 'A bash command line, run with `bash -c` in the workspace root' }),
    timeoutMs: Type.Optional(Type.Integer({ minimum: 100, description: "Stop the command after this long; the session's tool timeout still applies" }))
  },
  { additionalProperties: false }
)

export interface BashRunOptions {
  /** Bytes of the result as JSON, stdout and stderr included. */
  maxOutputBytes: number
  /** Total output after which the command is killed. */
  killAfterBytes: number
}

/** bash_run: a shell command in the session workspace, in its own process group, with a clean environment. */
export function createBashRunTool(opts: BashRunOptions): Tool<typeof Parameters> {
  return {
    name: 'bash_run',
    description:
      'Run a bash command in the workspace root. Returns exitCode, stdout and stderr (cut to fit in ' +
      `${opts.maxOutputBytes} bytes together). A non-zero exit is reported as a failure with the output. ` +
      'The command and everything it starts are killed when it ends, times out or floods its output.',
    parameters: Parameters,
    async execute(input, ctx) {
      const run = await runCommand(input.command, {
        cwd: ctx.workspace,
        signal: ctx.signal,
        timeoutMs: input.timeoutMs,
        maxOutputBytes: opts.maxOutputBytes,
        killAfterBytes: opts.killAfterBytes,
        // Only what a command needs: the service's own secrets (API keys, database URL) stay out.
        env: { PATH: process.env['PATH'] ?? '/usr/local/bin:/usr/bin:/bin', HOME: ctx.workspace, LANG: 'C.UTF-8', TERM: 'dumb' }
      })
      const output = fitOutput(run, opts.maxOutputBytes)
      if (run.flooded) {
        throw new ToolFailure('OUTPUT_TOO_LARGE', `The command printed more than ${opts.killAfterBytes} bytes and was stopped.`, {
          ...output,
          outputBytes: run.outputBytes
        })
      }
      if (run.timedOut) {
        throw new ToolFailure('TIMEOUT', `The command did not finish within ${input.timeoutMs} ms and was stopped.`, {
          ...output,
          timeoutMs: input.timeoutMs
        })
      }
      if (run.exitCode !== 0) {
        const how = run.exitCode === null ? `was killed by ${run.signal ?? 'a signal'}` : `exited with code ${run.exitCode}`
        return { ok: false, error: `The command ${how}.`, exitCode: run.exitCode, signal: run.signal, ...output }
      }
      return { exitCode: 0, ...output }
    },
    recommend({ code, detail }) {
      if (code === 'TIMEOUT') {
        return [
          'Narrow the command (limit it to a folder, fewer files, fewer iterations) or run long jobs in smaller steps.',
          'Pass a larger timeoutMs if the command needs it, up to the session limit.'
        ]
      }
      if (code === 'OUTPUT_TOO_LARGE') {
        return ['The command printed too much; filter its output (grep, head -n, tail -n, wc -l) or write it to a file and read parts of it.']
      }
      if (code === 'UNKNOWN' && typeof detail?.['exitCode'] === 'number') {
        return [`The command exited with code ${detail['exitCode']}; read stderr and stdout in detail, fix the command and run it again.`]
      }
      return undefined
    }
  }
}

/** JSON bytes kept for a truncation note, and for the result's other fields (exitCode, signal, error, the keys). */
const NOTE_ROOM = 100
const OTHER_FIELDS_ROOM = 200

/**
 * stdout and stderr as the result shows them: together, as JSON (escapes counted: a terminal's
 * colour codes take 6 bytes each), within maxBytes, so that the model gets the result object
 * rather than its JSON text cut. The shorter stream keeps what it needs, up to half.
 */
function fitOutput(run: CommandResult, maxBytes: number): { stdout: string; stderr: string; truncated: boolean } {
  const room = maxBytes - OTHER_FIELDS_ROOM
  if (jsonBytes(run.stdout) + jsonBytes(run.stderr) <= room) return { stdout: run.stdout, stderr: run.stderr, truncated: run.truncated }
  const half = Math.floor(room / 2)
  const stdoutShare = jsonBytes(run.stdout) <= jsonBytes(run.stderr) ? Math.min(jsonBytes(run.stdout), half) : room - Math.min(jsonBytes(run.stderr), half)
  return { stdout: cut(run.stdout, run.stdoutBytes, stdoutShare), stderr: cut(run.stderr, run.stderrBytes, room - stdoutShare), truncated: true }
}

const jsonBytes = (text: string) => Buffer.byteLength(JSON.stringify(text))

/** `text` (of a stream that printed `total` bytes) cut so that its JSON, note included, takes at most `share` bytes. */
function cut(text: string, total: number, share: number): string {
  if (jsonBytes(text) <= share) return text
  const shown = jsonFittingPrefix(text, Math.max(2, share - NOTE_ROOM))
  return shown + truncationNote(Buffer.byteLength(shown), total)
}
