import t from 'tap'
import type { Test } from 'tap'
import { mkdir, realpath, symlink, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import pino from 'pino'
import { loadConfig } from '../../src/config.ts'
import type { SessionRecord } from '../../src/store/store.ts'
import { createFsReadTool } from '../../src/tools/builtin/fs-read.ts'
import { ToolCatalog } from '../../src/tools/catalog.ts'
import { runTool } from '../../src/tools/runtime.ts'
import { ToolFailure } from '../../src/tools/tool-errors.ts'
import { ensureWorkspace, folderSyntax, resolveInWorkspace, toWorkspacePath } from '../../src/tools/workspace.ts'
import { makeWorkspace } from '../fixtures/tools/context.ts'

const refusedAs = async (t: Test, promise: Promise<unknown>, code: string) => {
  const err = await promise.then(
    () => null,
    (e: unknown) => e
  )
  t.ok(err instanceof ToolFailure, 'rejects with a ToolFailure')
  t.equal((err as ToolFailure).code, code)
}

t.test('paths resolve inside the workspace or are refused with PATH_TRAVERSAL', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  await writeFile(path.join(ws.base, 'secret.txt'), 'outside')
  await mkdir(path.join(ws.root, 'src'))
  await writeFile(path.join(ws.root, 'src', 'a.ts'), 'x')

  t.equal(await resolveInWorkspace(ws.root, 'src/a.ts', { mustExist: true }), path.join(ws.root, 'src', 'a.ts'))
  t.equal(await resolveInWorkspace(ws.root, './src/../src/a.ts'), path.join(ws.root, 'src', 'a.ts'), 'a detour that stays inside is fine')
  t.equal(await resolveInWorkspace(ws.root, path.join(ws.root, 'src')), path.join(ws.root, 'src'), 'an absolute path inside is fine')
  t.equal(await resolveInWorkspace(ws.root, 'new/dir/file.txt'), path.join(ws.root, 'new', 'dir', 'file.txt'), 'a path that does not exist yet')

  await refusedAs(t, resolveInWorkspace(ws.root, '../secret.txt'), 'PATH_TRAVERSAL')
  await refusedAs(t, resolveInWorkspace(ws.root, 'src/../../secret.txt'), 'PATH_TRAVERSAL')
  await refusedAs(t, resolveInWorkspace(ws.root, '/etc/passwd'), 'PATH_TRAVERSAL')
  await refusedAs(t, resolveInWorkspace(ws.root, path.join(ws.base, 'secret.txt')), 'PATH_TRAVERSAL')
})

t.test('symbolic links cannot lead out of the workspace', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  await mkdir(path.join(ws.base, 'outside'))
  await writeFile(path.join(ws.base, 'outside', 'secret.txt'), 'outside')
  await symlink(path.join(ws.base, 'outside'), path.join(ws.root, 'dirlink'))
  await symlink(path.join(ws.base, 'outside', 'secret.txt'), path.join(ws.root, 'filelink'))
  await symlink(path.join(ws.base, 'outside', 'not-yet.txt'), path.join(ws.root, 'dangling'))
  await writeFile(path.join(ws.root, 'inside.txt'), 'in')
  await symlink('inside.txt', path.join(ws.root, 'goodlink'))

  await refusedAs(t, resolveInWorkspace(ws.root, 'filelink'), 'PATH_TRAVERSAL')
  await refusedAs(t, resolveInWorkspace(ws.root, 'dirlink/secret.txt'), 'PATH_TRAVERSAL')
  await refusedAs(t, resolveInWorkspace(ws.root, 'dirlink/new.txt', { forWrite: true }), 'PATH_TRAVERSAL')
  await refusedAs(t, resolveInWorkspace(ws.root, 'dangling', { forWrite: true }), 'PATH_TRAVERSAL')
  t.equal(await resolveInWorkspace(ws.root, 'goodlink'), path.join(ws.root, 'inside.txt'), 'a link inside resolves to its target')
})

t.test('links that go round in a loop, existing or dangling, are a path no retry can resolve', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  await symlink('loop2', path.join(ws.root, 'loop1'))
  await symlink('loop1', path.join(ws.root, 'loop2'))
  // A dangling chain: each link leads to the next one's missing file below it.
  for (let i = 0; i < 45; i++) await symlink(`chain${i + 1}/x`, path.join(ws.root, `chain${i}`))
  for (const relPath of ['loop1', 'loop1/file.txt', 'chain0']) {
    const err = await resolveInWorkspace(ws.root, relPath).then(() => null, (e: unknown) => e)
    t.match(err, { code: 'IO_ERROR', retryable: false, detail: { path: relPath, reason: 'link_loop', errno: 'ELOOP' } }, relPath)
  }
  const read = await runTool(createFsReadTool({ maxBytes: 1000 }), { path: 'loop1' }, ws.ctx(), { timeoutMs: 5000, maxOutputBytes: 1000 })
  t.match(read, { ok: false, error: { errorType: 'runtime', code: 'IO_ERROR', retryable: false, recommendations: [/go round in a loop; do not retry/] } })
})

t.test('mustExist reports a missing path as NOT_FOUND, forWrite refuses the root', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  await refusedAs(t, resolveInWorkspace(ws.root, 'nope.txt', { mustExist: true }), 'NOT_FOUND')
  await refusedAs(t, resolveInWorkspace(ws.root, '.', { forWrite: true }), 'IO_ERROR')
  await refusedAs(t, resolveInWorkspace(ws.root, 'a\0b'), 'VALIDATION_ERROR')
})

t.test('a path written as a folder is told apart from one that may name a file; a file tool refuses it before any disk access', async (t) => {
  for (const [relPath, ending] of [['new/', '/'], ['a/b//', '/'], ['new/.', '/.'], ['a/..', '/..'], ['.', '.'], ['..', '..'], ['/abs/dir/', '/']] as const) {
    t.equal(folderSyntax(relPath), ending, relPath)
  }
  for (const relPath of ['new', 'a/b', 'a.', '.hidden', 'dir/..x', 'x..', 'a/.b']) t.equal(folderSyntax(relPath), undefined, relPath)
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  await writeFile(path.join(ws.root, 'file.txt'), 'x')
  await refusedAs(t, resolveInWorkspace(ws.root, 'new/', { forWrite: true, file: true }), 'VALIDATION_ERROR')
  await refusedAs(t, resolveInWorkspace(ws.root, 'file.txt/', { mustExist: true, file: true }), 'VALIDATION_ERROR')
  t.equal(await resolveInWorkspace(ws.root, './', { mustExist: true }), ws.root, 'a folder tool takes the root written as a folder')
  const err = await resolveInWorkspace(ws.root, 'file.txt/', { mustExist: true }).then(() => null, (e: unknown) => e)
  t.match(err, { code: 'IO_ERROR', retryable: false, detail: { path: 'file.txt/', reason: 'not_directory' } }, 'nor a file named as a folder')
  const lone = await resolveInWorkspace(ws.root, 'x\udc00').then(() => null, (e: unknown) => e)
  t.match(lone, { code: 'VALIDATION_ERROR', detail: { reason: 'lone_surrogate', index: 1, fields: [{ field: 'path' }] } })
})

t.test('ensureWorkspace creates the session folder and returns its real path', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const dir = await ensureWorkspace(ws.base, 'ses_other')
  t.equal(dir, await realpath(path.join(ws.base, 'ses_other')))
  t.equal(await ensureWorkspace(ws.base, 'ses_other'), dir, 'idempotent')
  await t.rejects(ensureWorkspace(ws.base, '../escape'), /Invalid session id/)
  t.equal(toWorkspacePath(dir, path.join(dir, 'a', 'b')), 'a/b')
  t.equal(toWorkspacePath(dir, dir), '.')
})

t.test('ensureWorkspace makes a missing root too, and answers the real path through a linked root', async (t) => {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  const deep = path.join(ws.base, 'not', 'yet')
  t.equal(await ensureWorkspace(deep, 'ses_a'), await realpath(path.join(deep, 'ses_a')), 'root made on the way')
  await symlink(deep, path.join(ws.base, 'linked'))
  const viaLink = await ensureWorkspace(path.join(ws.base, 'linked'), 'ses_b')
  t.equal(viaLink, path.join(await realpath(deep), 'ses_b'), 'a new folder under a linked root: the real path, no link in it')
  await symlink(ws.base, path.join(deep, 'ses_c'))
  t.equal(await ensureWorkspace(deep, 'ses_c'), await realpath(ws.base), 'an existing link is resolved, not trusted')
})

t.test('a root that cannot be made fails with its error instead of never answering (a root under /proc)', async (t) => {
  // Before, Node's recursive mkdir retried /proc/<name> forever on a thread of libuv's pool: the
  // run waited for its workspace for good, and four such runs stopped every file operation.
  const failed = await Promise.race([
    ensureWorkspace('/proc/agentd-no-such-root/deeper', 'ses_a').then(() => 'made', (err: NodeJS.ErrnoException) => err.code),
    new Promise((resolve) => setTimeout(resolve, 5000, 'no answer in 5 s').unref())
  ])
  t.equal(failed, 'ENOENT')
})

t.test("a session's workspace removed while a run is still making it stays removed", async (t) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'agentd-ws-race-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const catalog = new ToolCatalog(loadConfig({ AGENTD_WORKSPACES: dir }))
  const tools = await catalog.resolve({ tools: null } as SessionRecord)
  const logger = pino({ enabled: false })
  // The race is lost now and then without the wait in removeWorkspace: enough rounds to see it.
  for (let i = 0; i < 200; i++) {
    const session = { id: `ses_race${i}`, limits: {} } as SessionRecord
    // A run's executor starts making the workspace at once; the session is deleted right after.
    await catalog.executor(session, tools, logger)
    await catalog.removeWorkspace(session.id)
    // Whatever the thread pool was still doing has finished by now.
    await new Promise((resolve) => setTimeout(resolve, 2))
    if (existsSync(path.join(dir, session.id))) t.fail(`workspace ${i} was made again after its removal`)
  }
  t.pass('every removed workspace stayed removed')
})

t.test("a session's workspace is made with the session, for its first run, and a removal that comes first waits for it", async (t) => {
  const dir = mkdtempSync(path.join(tmpdir(), 'agentd-ws-prepared-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const catalog = new ToolCatalog(loadConfig({ AGENTD_WORKSPACES: dir }))
  const logger = pino({ enabled: false })
  const turn = () => new Promise((resolve) => setTimeout(resolve, 20))

  const made = { id: 'ses_prepared', tools: null, limits: {} } as unknown as SessionRecord
  catalog.prepareWorkspace(made)
  t.notOk(existsSync(path.join(dir, made.id)), 'not while the 201 is being written')
  // A mkdir on libuv's pool: under the full suite on two cores it took longer than a 20 ms turn once.
  for (let i = 0; i < 100 && !existsSync(path.join(dir, made.id)); i++) await turn()
  t.ok(existsSync(path.join(dir, made.id)), 'made once it is out')
  const execute = await catalog.executor(made, await catalog.resolve(made), logger)
  const listed = await execute({ id: 'call_1', name: 'fs_list', input: {} } as never, new AbortController().signal, async () => undefined)
  t.same(listed, { ok: true, result: { path: '.', entries: [], truncated: false } }, "the session's first run works in it")

  const bare = { id: 'ses_bare', tools: [], limits: {} } as unknown as SessionRecord
  catalog.prepareWorkspace(bare)
  await turn()
  t.notOk(existsSync(path.join(dir, bare.id)), 'a session without server tools gets no folder')

  // Removed before the folder's creation has even started: the removal waits for it, then
  // removes it. Without that wait the race is lost now and then: enough rounds to see it.
  for (let i = 0; i < 100; i++) {
    const gone = { id: `ses_gone${i}`, tools: null, limits: {} } as unknown as SessionRecord
    catalog.prepareWorkspace(gone)
    await catalog.removeWorkspace(gone.id)
    await new Promise((resolve) => setTimeout(resolve, 2))
    if (existsSync(path.join(dir, gone.id))) t.fail(`session ${i}, removed at once, left its folder behind`)
  }
  t.pass('every session removed at once left no folder behind')
})
