import { spawn } from 'node:child_process'
import { existsSync, mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'
import { buildTestApp, type TapTest } from '../helpers/app.ts'
import { hooksEnv } from '../helpers/hook-server.ts'

const script = fileURLToPath(new URL('../../examples/python/hooks_server.py', import.meta.url))
const SECRET = 'python-hook-secret-0123456789'

/** Starts the example hook server on a free port; returns its base URL and what it prints. */
async function startPythonHooks(t: TapTest): Promise<{ base: string; output: () => string }> {
  const child = spawn('python3', [script, '--port', '0'], { env: { PATH: process.env.PATH ?? '', AGENTD_HOOK_SECRET: SECRET }, stdio: ['ignore', 'pipe', 'inherit'] })
  t.teardown(() => child.kill())
  let output = ''
  const port = await new Promise<string>((resolve, reject) => {
    child.stdout.on('data', (chunk: Buffer) => {
      output += chunk.toString()
      const match = /listening on (\d+)/.exec(output)
      if (match) resolve(match[1] as string)
    })
    child.on('exit', (code) => reject(new Error(`hooks_server.py exited with ${code}`)))
  })
  return { base: `http://127.0.0.1:${port}`, output: () => output }
}

t.test('the README hook server: a policy, a redaction and a ledger, all signature-checked, work against agentd', async (t) => {
  const hooks = await startPythonHooks(t)
  const ctx = await buildTestApp(t, {
    env: hooksEnv(t, [
      { name: 'docs-only', on: 'preToolUse', url: `${hooks.base}/policy`, tools: ['fs_write'], secret: SECRET },
      { name: 'redact', on: 'postToolUse', url: `${hooks.base}/redact`, onFailure: 'deny', secret: SECRET },
      { name: 'ledger', on: 'runEnd', url: `${hooks.base}/runs`, secret: SECRET }
    ])
  })
  const { app, devModel } = ctx
  const session = (await app.inject({ method: 'POST', url: '/v1/sessions', payload: {} })).json()
  const workspace = join(ctx.dir, 'workspaces', session.id)
  mkdirSync(workspace, { recursive: true })
  writeFileSync(join(workspace, 'config.txt'), 'key = sk-live0123456789abcdef\n')
  devModel.script({
    toolCalls: [
      { name: 'fs_write', arguments: { path: 'docs/notes.md', content: 'ok' } },
      { name: 'fs_write', arguments: { path: 'run.sh', content: 'rm -rf /' } },
      { name: 'fs_read', arguments: { path: 'config.txt' } }
    ]
  }, { text: 'done' })
  const { run } = (await app.inject({
    method: 'POST', url: `/v1/sessions/${session.id}/messages?wait=true`, payload: { content: 'go' }, headers: { 'x-request-id': 'req-python-hooks' }
  })).json()
  t.equal(run.status, 'completed')
  t.ok(existsSync(join(workspace, 'docs/notes.md')))
  t.notOk(existsSync(join(workspace, 'run.sh')), 'the policy kept the write out of the workspace root')
  const toolMessages = (devModel.requests.at(-1)?.body.messages ?? []).filter((m) => m.role === 'tool').map((m) => JSON.parse(String(m.content)))
  t.match(toolMessages[1], { ok: false, code: 'DENIED_BY_USER', error: /fs_write is allowed only under docs\// })
  t.match(toolMessages[2], { content: 'key = [redacted]' }, 'the key never reached the model')
  for (let i = 0; i < 300 && !hooks.output().includes(run.id); i++) await new Promise((resolve) => setTimeout(resolve, 10))
  t.match(hooks.output(), new RegExp(`run ${run.id} completed request=req-python-hooks tokens=\\d+`), 'the ledger got the run, signature checked')

  const forged = await fetch(`${hooks.base}/policy`, { method: 'POST', body: '{}', headers: { 'x-agentd-signature': 'sha256=00' } })
  t.equal(forged.status, 401, 'a request without the right signature is refused')
})
