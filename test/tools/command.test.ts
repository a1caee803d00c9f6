import t from 'tap'
import { readFile } from 'node:fs/promises'
import { createBashRunTool } from '../../src/tools/builtin/bash-run.ts'
import { runCommand } from '../../src/tools/command.ts'
import { runTool } from '../../src/tools/runtime.ts'
import { makeWorkspace, tickCounter } from '../fixtures/tools/context.ts'

const env = { PATH: process.env['PATH'] }

/** Alive means running: gone or a zombie awaiting its reaper both count as dead. */
async function alive(pid: number): Promise<boolean> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => null)
  if (stat === null) return false
  return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z'
}

async function waitUntilDead(pid: number, withinMs: number): Promise<boolean> {
  const deadline = Date.now() + withinMs
  while (Date.now() < deadline) {
    if (!(await alive(pid))) return true
    await new Promise((r) => setTimeout(r, 20))
  }
  return !(await alive(pid))
}

t.test('a command returns its exit code and output', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const run = await runCommand('echo out; echo err >&2; pwd; exit 3', { cwd: ws.root, env, maxOutputBytes: 1000 })
  t.equal(run.exitCode, 3)
  t.equal(run.stdout, `out\n${ws.root}\n`)
  t.equal(run.stderr, 'err\n')
  t.same([run.truncated, run.timedOut, run.aborted, run.flooded], [false, false, false, false])
})

t.test('a timeout kills the whole process group, background children included', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const started = Date.now()
  const run = await runCommand('sleep 30 & echo $!; sleep 30', { cwd: ws.root, env, maxOutputBytes: 1000, timeoutMs: 300 })
  t.ok(Date.now() - started < 300 + 1000, 'settled within timeout + 1 s')
  t.equal(run.timedOut, true)
  t.equal(run.exitCode, null)
  const child = Number(run.stdout.trim())
  t.ok(child > 0, `the background child was ${child}`)
  t.ok(await waitUntilDead(child, 1000), 'the background child is gone')
})

t.test('an abort kills the group; so does the end of the command for children left behind', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const controller = new AbortController()
  setTimeout(() => controller.abort(), 200)
  const aborted = await runCommand('sleep 30 & echo $!; wait', { cwd: ws.root, env, maxOutputBytes: 1000, signal: controller.signal })
  t.equal(aborted.aborted, true)
  t.ok(await waitUntilDead(Number(aborted.stdout.trim()), 1000), 'the aborted command’s child is gone')

  const started = Date.now()
  const leftover = await runCommand('sleep 30 & echo $!', { cwd: ws.root, env, maxOutputBytes: 1000 })
  t.ok(Date.now() - started < 2000, 'a child holding the pipes does not keep the call open')
  t.equal(leftover.exitCode, 0)
  t.ok(await waitUntilDead(Number(leftover.stdout.trim()), 1000), 'the child left behind is gone')
})

// Each starts a child in a session (and process group) of its own that writes its pid to `pids`,
// one with the pipes closed and one holding them, and waits until both have written.
const leaveTheGroup =
  "setsid -f bash -c 'echo $$ >> pids; exec sleep 30' >/dev/null 2>&1; setsid -f bash -c 'echo $$ >> pids; exec sleep 30'; " +
  'until [ "$(wc -l < pids)" -ge 2 ]; do sleep 0.01; done'

t.test('children that leave the process group (setsid) are killed too, when the command ends and when it is aborted', async (t) => {
  for (const how of ['ends', 'is aborted'] as const) {
    const ws = await makeWorkspace()
    t.teardown(ws.cleanup)
    const controller = new AbortController()
    const command = how === 'ends' ? leaveTheGroup : `${leaveTheGroup}; sleep 30`
    const running = runCommand(command, { cwd: ws.root, env, maxOutputBytes: 1000, signal: controller.signal })
    if (how === 'is aborted') {
      const written = () => readFile(`${ws.root}/pids`, 'utf8').then((text) => text.split('\n').length > 2, () => false)
      while (!(await written())) await new Promise((r) => setTimeout(r, 10))
      controller.abort()
    }
    const run = await running
    t.equal(run.aborted, how === 'is aborted', `the command ${how}`)
    const pids = (await readFile(`${ws.root}/pids`, 'utf8')).trim().split('\n').map(Number)
    t.equal(pids.length, 2)
    for (const pid of pids) t.ok(await waitUntilDead(pid, 1000), `the child ${pid} that left the group is gone once the command ${how}`)
  }
})

t.test('a command printing a gigabyte is killed early and its output capped, the event loop ticking', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const ticker = tickCounter(10)
  t.teardown(ticker.stop)
  const started = Date.now()
  // A high flood limit keeps it running long enough to watch the event loop while 128 MiB stream through.
  const run = await runCommand('head -c 1G /dev/zero | tr "\\0" x', { cwd: ws.root, env, maxOutputBytes: 1000, killAfterBytes: 128 << 20 })
  const elapsed = Date.now() - started
  t.equal(run.flooded, true)
  t.equal(run.truncated, true)
  t.ok(run.stdout.startsWith('x'.repeat(1000)))
  t.match(run.stdout, /\[output truncated: showing the first 1000 of \d+ bytes\]$/)
  t.ok(run.outputBytes > 128 << 20 && run.outputBytes < 256 << 20, `stopped after ${run.outputBytes} bytes`)
  t.ok(elapsed < 5000, `ended after ${elapsed} ms`)
  t.ok(ticker.ticks() >= Math.floor(elapsed / 40), `the event loop kept ticking (${ticker.ticks()} ticks of 10 ms in ${elapsed} ms)`)
})

t.test('bash_run reports success, failure, timeout and floods as the model should see them', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const bash = createBashRunTool({ maxOutputBytes: 2000, killAfterBytes: 1 << 20 })
  const limits = { timeoutMs: 5000, maxOutputBytes: 10_000 }

  const ok = await runTool(bash, { command: 'echo hi > f.txt && cat f.txt && echo "$HOME"' }, ws.ctx(), limits)
  t.match(ok, { ok: true, result: { exitCode: 0, stdout: `hi\n${ws.root}\n`, stderr: '', truncated: false } })

  process.env['AGENTD_TEST_SECRET'] = 'leak'
  t.teardown(() => delete process.env['AGENTD_TEST_SECRET'])
  const secret = await runTool(bash, { command: 'echo "[$AGENTD_TEST_SECRET]"' }, ws.ctx(), limits)
  t.match(secret, { ok: true, result: { stdout: '[]\n' } }, 'the service environment does not leak into commands')

  const failed = await runTool(bash, { command: 'echo partial; echo oops >&2; exit 2' }, ws.ctx(), limits)
  t.match(failed, {
    ok: false,
    error: { errorType: 'logical', code: 'UNKNOWN', message: 'The command exited with code 2.', detail: { exitCode: 2, stdout: 'partial\n', stderr: 'oops\n' } }
  })

  const slow = await runTool(bash, { command: 'sleep 10', timeoutMs: 200 }, ws.ctx(), limits)
  t.match(slow, { ok: false, error: { errorType: 'aborted', code: 'TIMEOUT', detail: { timeoutMs: 200 } } })

  const started = Date.now()
  const sessionLimit = await runTool(bash, { command: 'sleep 10' }, ws.ctx(), { timeoutMs: 300, maxOutputBytes: 1000 })
  t.match(sessionLimit, { ok: false, error: { errorType: 'aborted', code: 'TIMEOUT' } })
  t.ok(Date.now() - started < 1300, 'the session’s tool timeout stops it too')

  const flood = await runTool(bash, { command: 'yes' }, ws.ctx(), limits)
  t.match(flood, { ok: false, error: { errorType: 'runtime', code: 'OUTPUT_TOO_LARGE', retryable: false } })
  if (!flood.ok) t.match(flood.error.recommendations[0], /filter its output/)
})

t.test('bash_run fits stdout and stderr together in the cap, escapes counted: the model gets the result object, exit code included', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  // The runtime's cap is the tool's, as the catalog sets them both from AGENTD_TOOL_MAX_OUTPUT_BYTES.
  const bash = createBashRunTool({ maxOutputBytes: 2000, killAfterBytes: 1 << 20 })
  const limits = { timeoutMs: 5000, maxOutputBytes: 2000 }

  const both = await runTool(bash, { command: 'seq 1 1000; seq 1 1000 >&2' }, ws.ctx(), limits)
  t.match(both, { ok: true, result: { exitCode: 0, truncated: true, stdout: /^1\n2\n3\n[^]*\[output truncated: showing the first \d+ of 3893 bytes\]$/, stderr: /^1\n2\n[^]*of 3893 bytes\]$/ } })

  const colours = await runTool(bash, { command: 'echo err >&2; for i in $(seq 1 600); do printf "\\033[0m"; done; exit 3' }, ws.ctx(), limits)
  t.match(colours, {
    ok: false,
    error: { errorType: 'logical', message: 'The command exited with code 3.', detail: { exitCode: 3, stderr: 'err\n', stdout: /^\u001b\[0m[^]*\[output truncated/, truncated: true } }
  }, 'a failure keeps its output as fields too, the short stderr whole')
})

t.test('a timeoutMs too long for a timer is no limit at all, not one that fires at once', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const bash = createBashRunTool({ maxOutputBytes: 2000, killAfterBytes: 1 << 20 })
  const slow = await runTool(bash, { command: 'sleep 0.2; echo done', timeoutMs: 1e12 }, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 2000 })
  t.match(slow, { ok: true, result: { exitCode: 0, stdout: 'done\n' } })
})
