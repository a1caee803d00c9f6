import { Type } from '@sinclair/typebox'
import { ToolFailure } from '../tool-errors.ts'
import { runCommand } from '../command.ts'
import type { Tool } from '../types.ts'

const Parameters = Type.Object(
  {
    command: Type.String({ minLength: 1, description: 'A bash command line, run with `bash -c` in the workspace root' }),
    timeoutMs: Type.Optional(Type.Integer({ minimum: 100, description: "Stop the command after this long; the session's tool timeout still applies" }))
  },
  { additionalProperties: false }
)

export interface BashRunOptions {
  /** Bytes kept of stdout and of stderr each. */
  maxOutputBytes: number
  /** Total output after which the command is killed. */
  killAfterBytes: number
}

/** bash_run: a shell command in the session workspace, in its own process group, with a clean environment. */
export function createBashRunTool(opts: BashRunOptions): Tool<typeof Parameters> {
  return {
    name: 'bash_run',
    description:
      'Run a bash command in the workspace root. Returns exitCode, stdout and stderr (each cut at ' +
      `${opts.maxOutputBytes} bytes). A non-zero exit is reported as a failure with the output. ` +
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
      const output = { stdout: run.stdout, stderr: run.stderr, truncated: run.truncated }
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
