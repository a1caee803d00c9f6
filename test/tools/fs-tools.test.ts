import t from 'tap'
import type { Test } from 'tap'
import { execFileSync } from 'node:child_process'
import { chmod, link, mkdir, mkdtemp, readdir, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { createFsEditTool } from '../../src/tools/builtin/fs-edit.ts'
import { createBuiltinTools } from '../../src/tools/builtin/index.ts'
import { runTool, type ToolOutcome } from '../../src/tools/runtime.ts'
import type { Tool } from '../../src/tools/types.ts'
import { makeWorkspace, makeWorkspaceIn, type TestWorkspace } from '../fixtures/tools/context.ts'

const tools = new Map(
  createBuiltinTools({ bashEnabled: false, httpFetch: { allowPrivate: false }, maxOutputBytes: 2000 }).map((tool) => [tool.name, tool])
)
const limits = { timeoutMs: 5000, maxOutputBytes: 100_000 }

function call(ws: TestWorkspace, name: string, input: unknown): Promise<ToolOutcome> {
  return runTool(tools.get(name) as Tool, input, ws.ctx(), limits)
}

async function setup(t: Test): Promise<TestWorkspace> {
  const ws = await makeWorkspace()
  t.teardown(ws.cleanup)
  await mkdir(path.join(ws.root, 'src', 'lib'), { recursive: true })
  await writeFile(path.join(ws.root, 'src', 'main.ts'), 'import { x } from "./lib/x.ts"\nconsole.log(x)\n')
  await writeFile(path.join(ws.root, 'src', 'lib', 'x.ts'), 'export const x = 1\n')
  await writeFile(path.join(ws.root, 'README.md'), '# Title\nline two\nline three\n')
  await writeFile(path.join(ws.base, 'secret.txt'), 'TOKEN=outside\n')
  return ws
}

t.test('the built-ins are the fs tools and http_fetch; bash_run only when enabled', async (t) => {
  t.same([...tools.keys()], ['fs_read', 'fs_write', 'fs_edit', 'fs_list', 'fs_glob', 'fs_grep', 'http_fetch'])
  const withBash = createBuiltinTools({ bashEnabled: true, httpFetch: { allowPrivate: false } }).map((tool) => tool.name)
  t.ok(withBash.includes('bash_run'))
})

t.test('fs_read reads lines, ranges and reports what follows', async (t) => {
  const ws = await setup(t)
  t.match(await call(ws, 'fs_read', { path: 'README.md' }), {
    ok: true,
    result: { path: 'README.md', content: '# Title\nline two\nline three', startLine: 1, endLine: 3, hasMore: false }
  })
  t.match(await call(ws, 'fs_read', { path: 'README.md', offset: 2, limit: 1 }), {
    ok: true,
    result: { content: 'line two', startLine: 2, endLine: 2, hasMore: true }
  })
  await writeFile(path.join(ws.root, 'no-newline.txt'), 'a\r\nb')
  t.match(await call(ws, 'fs_read', { path: 'no-newline.txt' }), { ok: true, result: { content: 'a\nb', endLine: 2, hasMore: false } })
  t.match(await call(ws, 'fs_read', { path: 'README.md', offset: 10 }), {
    ok: false,
    error: { errorType: 'logical', code: 'NOT_FOUND', detail: { reason: 'offset_past_end', lines: 3 } }
  })
})

/** Bytes of a successful outcome's result as the model reads it (JSON). */
const jsonBytes = (outcome: ToolOutcome) => Buffer.byteLength(JSON.stringify(outcome.ok ? outcome.result : null))

t.test('fs_read caps a huge file and a huge line by bytes', async (t) => {
  const ws = await setup(t)
  await writeFile(path.join(ws.root, 'big.txt'), 'abcdefghi\n'.repeat(10_000))
  const big = await call(ws, 'fs_read', { path: 'big.txt' })
  t.match(big, { ok: true, result: { startLine: 1, endLine: 169, hasMore: true, note: 'Output stopped at 2000 bytes; continue with offset 170.' } })
  t.ok(jsonBytes(big) <= 2000, 'the whole result fits in 2000 bytes')
  await writeFile(path.join(ws.root, 'one-line.txt'), 'x'.repeat(1_000_000))
  const oneLine = await call(ws, 'fs_read', { path: 'one-line.txt' })
  t.match(oneLine, { ok: true, result: { endLine: 1, hasMore: true, note: /longer than 2000 bytes/, content: /^x{1800,}$/ } })
  t.ok(jsonBytes(oneLine) <= 2000)
  await writeFile(path.join(ws.root, 'blob.bin'), Buffer.from([1, 2, 0, 3]))
  t.match(await call(ws, 'fs_read', { path: 'blob.bin' }), { ok: true, result: { binary: true, content: null } })
})

t.test('fs_read counts what escaping adds: the model gets the result object with hasMore and where to go on, never cut JSON text', async (t) => {
  const ws = await setup(t)
  // The runtime's cap is the tool's, as the catalog sets them both from AGENTD_TOOL_MAX_OUTPUT_BYTES.
  const read = (input: unknown) => runTool(tools.get('fs_read') as Tool, input, ws.ctx(), { ...limits, maxOutputBytes: 2000 })
  await writeFile(path.join(ws.root, 'quoted.ts'), 'const s = "quoted"\n'.repeat(300))
  const quoted = await read({ path: 'quoted.ts' })
  t.match(quoted, { ok: true, result: { startLine: 1, endLine: Number, hasMore: true, note: /continue with offset/ } })
  const { endLine, note, content } = (quoted.ok ? quoted.result : {}) as { endLine: number; note: string; content: string }
  t.equal(note, `Output stopped at 2000 bytes; continue with offset ${endLine + 1}.`)
  t.equal(content, 'const s = "quoted"\n'.repeat(endLine).slice(0, -1), 'whole lines, unchanged')
  await writeFile(path.join(ws.root, 'controls.txt'), '\u0001'.repeat(5000))
  t.match(await read({ path: 'controls.txt' }), { ok: true, result: { endLine: 1, hasMore: true, note: /longer than 2000 bytes/, content: /^\u0001+$/ } })
})

t.test('fs_list, fs_glob and fs_grep keep whole entries within the cap: the model gets the result object with truncated and a note', async (t) => {
  const ws = await setup(t)
  const deep = path.join(ws.root, 'a-rather-long-folder-name', 'another-long-folder-name')
  await mkdir(deep, { recursive: true })
  for (let i = 0; i < 40; i++) await writeFile(path.join(deep, `file-number-${i}.txt`), 'match this line please\n')
  const run = (name: string, input: unknown) => runTool(tools.get(name) as Tool, input, ws.ctx(), { ...limits, maxOutputBytes: 2000 })
  for (const [name, input, key, note] of [
    ['fs_list', { recursive: true }, 'entries', /^Only the first \d+ entries are shown/],
    ['fs_glob', { pattern: '**/*.txt' }, 'matches', /^Only \d+ matches are shown/],
    ['fs_grep', { pattern: 'match this' }, 'matches', /^Only the first \d+ matches are shown/]
  ] as const) {
    const outcome = await run(name, input)
    t.match(outcome, { ok: true, result: { truncated: true, note } }, `${name} answers an object`)
    const result = (outcome.ok ? outcome.result : {}) as Record<string, unknown>
    const items = result[key] as unknown[]
    t.ok(items.length > 10, `${name} shows ${items.length} whole entries`)
    t.equal(String(result['note']).match(/\d+/)?.[0], String(items.length), 'and says how many')
  }
})

t.test('fs_read errors: missing file, directory, escapes, bad arguments', async (t) => {
  const ws = await setup(t)
  const missing = await call(ws, 'fs_read', { path: 'src/mian.ts' })
  t.match(missing, { ok: false, error: { errorType: 'logical', code: 'NOT_FOUND', message: '"src/mian.ts" does not exist in the workspace.' } })
  if (!missing.ok) t.match(missing.error.recommendations[1], /fs_glob with a pattern such as "\*\*\/mian\.ts"/)
  t.match(await call(ws, 'fs_read', { path: 'src' }), { ok: false, error: { errorType: 'runtime', code: 'IO_ERROR' } })
  for (const escape of ['../secret.txt', path.join(ws.base, 'secret.txt'), 'src/../../secret.txt']) {
    t.match(await call(ws, 'fs_read', { path: escape }), { ok: false, error: { errorType: 'validation', code: 'PATH_TRAVERSAL' } }, escape)
  }
  await symlink(path.join(ws.base, 'secret.txt'), path.join(ws.root, 'link'))
  t.match(await call(ws, 'fs_read', { path: 'link' }), { ok: false, error: { code: 'PATH_TRAVERSAL' } }, 'a link pointing out')
  t.match(await call(ws, 'fs_read', { path: 'README.md', limit: 0 }), { ok: false, error: { code: 'VALIDATION_ERROR', detail: { fields: [{ field: 'limit' }] } } })
})

t.test('fs_write creates files and folders, refuses escapes', async (t) => {
  const ws = await setup(t)
  t.match(await call(ws, 'fs_write', { path: 'new/deep/file.txt', content: 'héllo' }), { ok: true, result: { path: 'new/deep/file.txt', bytes: 6, created: true } })
  t.equal(await readFile(path.join(ws.root, 'new', 'deep', 'file.txt'), 'utf8'), 'héllo')
  t.match(await call(ws, 'fs_write', { path: 'README.md', content: 'replaced' }), { ok: true, result: { created: false } })
  t.equal(await readFile(path.join(ws.root, 'README.md'), 'utf8'), 'replaced')
  t.match(await call(ws, 'fs_write', { path: '../evil.txt', content: 'x' }), { ok: false, error: { code: 'PATH_TRAVERSAL' } })
  await symlink(path.join(ws.base, 'planted.txt'), path.join(ws.root, 'dangling'))
  t.match(await call(ws, 'fs_write', { path: 'dangling', content: 'x' }), { ok: false, error: { code: 'PATH_TRAVERSAL' } })
  await t.rejects(readFile(path.join(ws.base, 'planted.txt')), 'nothing was written outside')
  t.match(await call(ws, 'fs_write', { path: 'src', content: 'x' }), { ok: false, error: { code: 'IO_ERROR' } })
})

t.test('fs_write below a file is refused as a path that cannot be made, not as an I/O failure to retry', async (t) => {
  const ws = await setup(t)
  for (const target of ['README.md/notes.txt', 'README.md/deeper/notes.txt']) {
    t.match(await call(ws, 'fs_write', { path: target, content: 'x' }), {
      ok: false,
      error: {
        errorType: 'runtime', code: 'IO_ERROR', retryable: false,
        message: `"${target}" cannot be made: part of its folder path is a file, not a folder.`,
        detail: { path: target, reason: 'parent_not_directory' },
        recommendations: [/use fs_list on its parent folders/]
      }
    }, target)
  }
  t.equal(await readFile(path.join(ws.root, 'README.md'), 'utf8'), '# Title\nline two\nline three\n', 'the file is left as it was')
})

t.test('a path ending in "/" names a folder: fs_write, fs_read and fs_edit refuse it instead of using the name without the slash', async (t) => {
  const ws = await setup(t)
  const before = (await readdir(ws.root)).sort()
  for (const target of ['new/', 'a/b/', 'new/.', 'src/', 'README.md/']) {
    const outcome = await call(ws, 'fs_write', { path: target, content: 'x' })
    t.match(outcome, {
      ok: false,
      error: {
        errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false,
        message: `"${target}" names a folder (it ends with "${target.endsWith('.') ? '/.' : '/'}"), not a file.`,
        detail: { path: target, reason: 'names_a_folder' },
        recommendations: [/give the file's name after the folder, e.g. ".*\/notes\.txt"/]
      }
    }, `fs_write ${target}`)
  }
  t.same((await readdir(ws.root)).sort(), before, 'no file "new" and no folder "new" or "a" was made')
  t.same(await readdir(path.join(ws.root, 'src')), ['lib', 'main.ts'], 'nothing was made in src')
  t.equal(await readFile(path.join(ws.root, 'README.md'), 'utf8'), '# Title\nline two\nline three\n', 'README.md is left as it was')

  for (const [name, input] of [
    ['fs_read', { path: 'README.md/' }],
    ['fs_read', { path: 'src/' }],
    ['fs_edit', { path: 'README.md/', oldText: 'Title', newText: 'Heading' }]
  ] as const) {
    const outcome = await call(ws, name, input)
    t.match(outcome, {
      ok: false,
      error: { errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false, detail: { path: input.path, reason: 'names_a_folder' } }
    }, `${name} ${input.path}`)
    const named = input.path.slice(0, -1)
    if (!outcome.ok) t.match(outcome.error.recommendations.join(' '), `If "${named}" is the file, name it without the "/" ("${named}").`)
  }
  t.equal(await readFile(path.join(ws.root, 'README.md'), 'utf8'), '# Title\nline two\nline three\n', 'fs_edit did not edit README.md')

  // A folder named with the slash is what fs_list, fs_glob and fs_grep take.
  t.match(await call(ws, 'fs_list', { path: 'src/' }), { ok: true, result: { entries: [{ path: 'src/lib' }, { path: 'src/main.ts' }] } })
  t.match(await call(ws, 'fs_glob', { pattern: '*.ts', path: 'src/' }), { ok: true, result: { matches: ['src/main.ts'] } })
  t.match(await call(ws, 'fs_grep', { pattern: 'console', path: 'src/' }), { ok: true, result: { matches: [{ path: 'src/main.ts' }] } })
  // A file named with the slash is not one: it is not listed, globbed in or searched as a file.
  for (const [name, input] of [
    ['fs_list', { path: 'README.md/' }],
    ['fs_glob', { pattern: '*', path: 'README.md/' }],
    ['fs_grep', { pattern: 'Title', path: 'README.md/' }]
  ] as const) {
    t.match(await call(ws, name, input), {
      ok: false,
      error: { code: 'IO_ERROR', retryable: false, detail: { path: 'README.md/', reason: 'not_directory' }, recommendations: [/is a file, not a folder/] }
    }, `${name} README.md/`)
  }
})

t.test('a path with a lone UTF-16 surrogate is refused before anything is made or read: the file system would name another file', async (t) => {
  const ws = await setup(t)
  // What the file system makes of "a\ud800b.txt" (U+FFFD for the lone half): another file than the one named.
  await writeFile(path.join(ws.root, 'a\ufffdb.txt'), 'another file\n')
  const before = (await readdir(ws.root)).sort()
  for (const [name, input] of [
    ['fs_write', { path: 'a\ud800b.txt', content: 'x' }],
    ['fs_write', { path: 'new\udc00/file.txt', content: 'x' }],
    ['fs_read', { path: 'a\ud800b.txt' }],
    ['fs_edit', { path: 'a\ud800b.txt', oldText: 'another', newText: 'edited' }],
    ['fs_list', { path: 'src\ud800' }],
    ['fs_grep', { pattern: 'file', path: 'a\ud800b.txt' }],
    ['fs_glob', { pattern: '*', path: 'src\udfff' }]
  ] as const) {
    const outcome = await call(ws, name, input)
    t.match(outcome, {
      ok: false,
      error: {
        errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false,
        message: /^The path ".*\\u(d800|dc00|dfff).*" holds a lone UTF-16 surrogate/,
        detail: { reason: 'lone_surrogate', fields: [{ field: 'path', expected: String }] },
        recommendations: [/Send "path" as well-formed Unicode/]
      }
    }, `${name} ${JSON.stringify(input.path)}`)
  }
  // fs_glob's pattern would report a match under the name the model gave, for the file of another name.
  t.match(await call(ws, 'fs_glob', { pattern: 'a\ud800b.txt' }), {
    ok: false,
    error: { code: 'VALIDATION_ERROR', detail: { reason: 'lone_surrogate', fields: [{ field: 'pattern' }] }, recommendations: [/Send "pattern" as well-formed Unicode/] }
  })
  t.match(await call(ws, 'fs_grep', { pattern: 'file', glob: '*\udbff.txt' }), {
    ok: false,
    error: { code: 'VALIDATION_ERROR', detail: { reason: 'lone_surrogate', index: 1, fields: [{ field: 'glob' }] }, recommendations: [/Send "glob" as well-formed Unicode: the \\udbff at index 1/] }
  })
  t.same((await readdir(ws.root)).sort(), before, 'nothing was made')
  t.equal(await readFile(path.join(ws.root, 'a\ufffdb.txt'), 'utf8'), 'another file\n', 'the other file is left as it was')
  // A whole surrogate pair is a character like any other.
  t.match(await call(ws, 'fs_write', { path: 'smile-\ud83d\ude00.txt', content: 'x' }), { ok: true, result: { created: true } })
  t.equal(await readFile(path.join(ws.root, 'smile-😀.txt'), 'utf8'), 'x')
})

t.test('fs_edit replaces exact text; a mismatch or ambiguity is logical', async (t) => {
  const ws = await setup(t)
  t.match(await call(ws, 'fs_edit', { path: 'src/lib/x.ts', oldText: 'x = 1', newText: 'x = "$&"' }), { ok: true, result: { replacements: 1 } })
  t.equal(await readFile(path.join(ws.root, 'src', 'lib', 'x.ts'), 'utf8'), 'export const x = "$&"\n', 'newText is literal')
  const mismatch = await call(ws, 'fs_edit', { path: 'README.md', oldText: 'line four', newText: 'x' })
  t.match(mismatch, { ok: false, error: { errorType: 'logical', code: 'NOT_FOUND', retryable: true, detail: { reason: 'no_match' } } })
  if (!mismatch.ok) t.match(mismatch.error.recommendations[0], /Read the file with fs_read/)
  const ambiguous = await call(ws, 'fs_edit', { path: 'README.md', oldText: 'line', newText: 'row' })
  t.match(ambiguous, { ok: false, error: { errorType: 'logical', code: 'VALIDATION_ERROR', detail: { occurrences: 2 } } })
  if (!ambiguous.ok) t.match(ambiguous.error.recommendations.join(' '), /replaceAll: true/)
  t.match(await call(ws, 'fs_edit', { path: 'README.md', oldText: 'line', newText: 'row', replaceAll: true }), { ok: true, result: { replacements: 2 } })
  t.equal(await readFile(path.join(ws.root, 'README.md'), 'utf8'), '# Title\nrow two\nrow three\n')
  t.match(await call(ws, 'fs_edit', { path: 'gone.txt', oldText: 'a', newText: 'b' }), { ok: false, error: { code: 'NOT_FOUND' } })
})

t.test('fs_edit matches several lines of a CRLF file as fs_read shows them (without "\\r"), keeping its line ends', async (t) => {
  const ws = await setup(t)
  await writeFile(path.join(ws.root, 'win.txt'), 'one\r\ntwo\r\nthree\r\n')
  t.match(await call(ws, 'fs_read', { path: 'win.txt' }), { ok: true, result: { content: 'one\ntwo\nthree' } })
  t.match(await call(ws, 'fs_edit', { path: 'win.txt', oldText: 'one\ntwo', newText: 'uno\ndos' }), { ok: true, result: { replacements: 1 } })
  t.equal(await readFile(path.join(ws.root, 'win.txt'), 'utf8'), 'uno\r\ndos\r\nthree\r\n')
  t.match(await call(ws, 'fs_edit', { path: 'win.txt', oldText: 'dos\nfour', newText: 'x' }), { ok: false, error: { code: 'NOT_FOUND', detail: { reason: 'no_match' } } })
})

t.test('a FIFO is refused at once instead of blocking a thread', async (t) => {
  const ws = await setup(t)
  execFileSync('mkfifo', [path.join(ws.root, 'pipe')])
  const started = Date.now()
  for (const [name, input] of [
    ['fs_read', { path: 'pipe' }],
    ['fs_edit', { path: 'pipe', oldText: 'a', newText: 'b' }],
    ['fs_write', { path: 'pipe', content: 'x' }]
  ] as const) {
    const outcome = await call(ws, name, input)
    t.match(outcome, { ok: false, error: { code: 'IO_ERROR', retryable: false, detail: { reason: 'not_regular_file' } } }, name)
    if (!outcome.ok) t.match(outcome.error.recommendations[0], /pipe, socket or device/)
  }
  t.ok(Date.now() - started < 1000)
})

t.test('fs_list lists a folder, recursively on request, links shown not followed', async (t) => {
  const ws = await setup(t)
  await symlink(ws.base, path.join(ws.root, 'out'))
  t.match(await call(ws, 'fs_list', {}), {
    ok: true,
    result: {
      path: '.',
      entries: [
        { path: 'README.md', type: 'file', size: 28 },
        { path: 'out', type: 'symlink' },
        { path: 'src', type: 'dir' }
      ],
      truncated: false
    }
  })
  const deep = await call(ws, 'fs_list', { path: 'src', recursive: true })
  t.same(deep.ok && (deep.result as { entries: { path: string }[] }).entries.map((e) => e.path), ['src/lib', 'src/main.ts', 'src/lib/x.ts'])
  t.match(await call(ws, 'fs_list', { path: 'README.md' }), { ok: false, error: { code: 'IO_ERROR', detail: { reason: 'not_directory' } } })
  t.match(await call(ws, 'fs_list', { path: 'out' }), { ok: false, error: { code: 'PATH_TRAVERSAL' } })
})

t.test('fs_list reads a large folder whole (past what it reads at once), sorted, sizes included, capped at 1000 entries', async (t) => {
  const ws = await setup(t)
  const big = path.join(ws.root, 'big')
  await mkdir(big)
  const names = Array.from({ length: 1200 }, (_, i) => `f${String(i).padStart(4, '0')}.txt`)
  // Written in an order unlike the sorted one.
  for (const name of [...names].reverse()) await writeFile(path.join(big, name), name.repeat(2))
  // A cap of bytes that 1000 entries fit in.
  const fsList = createBuiltinTools({ bashEnabled: false, httpFetch: { allowPrivate: false }, maxOutputBytes: 100_000 }).find((tool) => tool.name === 'fs_list') as Tool
  const listed = await runTool(fsList, { path: 'big' }, ws.ctx(), limits)
  const result = (listed.ok ? listed.result : {}) as { entries: Array<{ path: string; type: string; size: number }>; truncated: boolean; note?: string }
  t.equal(result.entries.length, 1000)
  t.same(result.entries.map((e) => e.path), names.slice(0, 1000).map((n) => `big/${n}`), 'the first 1000 in name order')
  t.ok(result.entries.every((e) => e.type === 'file' && e.size === 18), 'every file with its size')
  t.equal(result.truncated, true)
  t.match(result.note, /first 1000 entries/)
})

t.test('a name that is not UTF-8 (a file, a folder) does not fail fs_list or fs_grep for the whole workspace', async (t) => {
  const ws = await setup(t)
  // Bytes 0xff: Node reads the name as UTF-8, so the name it gives leads nowhere.
  const latin1 = (name: string) => Buffer.from(path.join(ws.root, name), 'latin1')
  await writeFile(latin1('bad-\xff.txt'), 'x marks\n')
  await mkdir(latin1('dir-\xff'))
  await writeFile(Buffer.concat([latin1('dir-\xff'), Buffer.from('/inside.txt')]), 'x marks\n')

  const listed = await call(ws, 'fs_list', { recursive: true })
  t.match(listed, { ok: true, result: { truncated: false } })
  const entries = (listed.ok ? (listed.result as { entries: Array<{ path: string; type: string; size?: number }> }).entries : [])
  t.match(entries.find((e) => e.path === 'bad-\ufffd.txt'), { type: 'file' }, 'the file is listed (without a size)')
  t.match(entries.find((e) => e.path === 'dir-\ufffd'), { type: 'dir' }, 'the folder is listed, not entered')
  t.match(entries.find((e) => e.path === 'src/main.ts'), { type: 'file', size: 46 }, 'and everything else as usual')

  const found = await call(ws, 'fs_grep', { pattern: 'import|export' })
  t.match(found, { ok: true, result: { truncated: false, filesSkipped: 1 } })
  t.same((found.ok ? (found.result as { matches: Array<{ path: string }> }).matches : []).map((m) => m.path), ['src/lib/x.ts', 'src/main.ts'])
})

t.test('fs_glob matches inside the workspace only', async (t) => {
  const ws = await setup(t)
  await mkdir(path.join(ws.root, 'node_modules', 'pkg'), { recursive: true })
  await writeFile(path.join(ws.root, 'node_modules', 'pkg', 'index.ts'), '')
  await symlink(path.join(ws.base, 'secret.txt'), path.join(ws.root, 'src', 'leak.ts'))
  t.match(await call(ws, 'fs_glob', { pattern: '**/*.ts' }), { ok: true, result: { matches: ['src/lib/x.ts', 'src/main.ts'], truncated: false } })
  t.match(await call(ws, 'fs_glob', { pattern: 'node_modules/**/*.ts' }), { ok: true, result: { matches: ['node_modules/pkg/index.ts'] } })
  t.match(await call(ws, 'fs_glob', { pattern: '*.ts', path: 'src/lib' }), { ok: true, result: { matches: ['src/lib/x.ts'] } })
  t.match(await call(ws, 'fs_glob', { pattern: '../*.txt' }), { ok: false, error: { code: 'PATH_TRAVERSAL' } })
  t.match(await call(ws, 'fs_glob', { pattern: '/etc/*' }), { ok: false, error: { code: 'PATH_TRAVERSAL' } })
})

t.test('fs_glob does not walk through a link that leads out of the workspace, and still through one that stays in', async (t) => {
  // Before, "everything/**" through a link to / walked the whole file system (matching nothing
  // it could show) until the tool's timeout.
  const ws = await setup(t)
  await symlink('/', path.join(ws.root, 'everything'))
  await symlink(path.join(ws.root, 'src'), path.join(ws.root, 'inner'))
  t.match(await call(ws, 'fs_glob', { pattern: 'everything/**' }), { ok: true, result: { matches: [], truncated: false } })
  t.match(await call(ws, 'fs_glob', { pattern: 'inner/**/*.ts' }), { ok: true, result: { matches: ['inner/lib/x.ts', 'inner/main.ts'] } })
})

t.test('fs_glob checks each brace alternative: none may leave the workspace, and there are not thousands', async (t) => {
  const ws = await setup(t)
  for (const pattern of ['{..,x}/{..,x}/**/*.none', 'src/{lib,..}/*', '{/etc,src}/*', '{src,{a,..}}/*.txt']) {
    t.match(await call(ws, 'fs_glob', { pattern }), { ok: false, error: { code: 'PATH_TRAVERSAL' } }, pattern)
  }
  t.match(await call(ws, 'fs_glob', { pattern: '{src,src/lib}/*.ts' }), { ok: true, result: { matches: ['src/lib/x.ts', 'src/main.ts'] } })
  t.match(await call(ws, 'fs_glob', { pattern: '{a,b}'.repeat(9) }), { ok: false, error: { code: 'VALIDATION_ERROR', detail: { reason: 'too_many_expansions' } } })
})

t.test('an aborted fs_glob stops walking instead of going on unawaited', async (t) => {
  const ws = await setup(t)
  // 7^4 folders: a walk long enough to tell stopping from finishing.
  const dirs: string[] = ['']
  for (let level = 0; level < 4; level++) dirs.splice(0, dirs.length, ...dirs.flatMap((d) => Array.from({ length: 7 }, (_, i) => path.join(d, `d${i}`))))
  await Promise.all(dirs.map((d) => mkdir(path.join(ws.root, 'tree', d), { recursive: true })))
  const glob = tools.get('fs_glob') as Tool
  let started = performance.now()
  await glob.execute({ pattern: 'tree/**/*.none' }, ws.ctx())
  const whole = performance.now() - started
  const controller = new AbortController()
  started = performance.now()
  const aborted = glob.execute({ pattern: 'tree/**/*.none' }, ws.ctx(controller.signal))
  setTimeout(() => controller.abort(new Error('timed out')), 5)
  await t.rejects(aborted, /timed out/, 'the call ends with its abort reason')
  const stopped = performance.now() - started
  t.ok(stopped < whole / 2, `stopped after ${stopped.toFixed(0)} ms; the whole walk takes ${whole.toFixed(0)} ms`)
})

t.test('fs_grep finds lines on a worker thread, filters by glob, caps matches', async (t) => {
  const ws = await setup(t)
  await writeFile(path.join(ws.root, 'src', 'many.txt'), 'hit\n'.repeat(50))
  await symlink(path.join(ws.base, 'secret.txt'), path.join(ws.root, 'src', 'secret-link.txt'))
  t.match(await call(ws, 'fs_grep', { pattern: 'x\\b', glob: '*.ts' }), {
    ok: true,
    result: {
      matches: [
        { path: 'src/lib/x.ts', line: 1, text: 'export const x = 1' },
        { path: 'src/main.ts', line: 1 },
        { path: 'src/main.ts', line: 2, text: 'console.log(x)' }
      ],
      truncated: false
    }
  })
  t.match(await call(ws, 'fs_grep', { pattern: 'HIT', ignoreCase: true, maxMatches: 5 }), { ok: true, result: { truncated: true } })
  const capped = await call(ws, 'fs_grep', { pattern: 'hit', maxMatches: 5 })
  t.equal(capped.ok && (capped.result as { matches: unknown[] }).matches.length, 5)
  t.match(await call(ws, 'fs_grep', { pattern: 'TOKEN' }), { ok: true, result: { matches: [] } }, 'links are not followed out')
  t.match(await call(ws, 'fs_grep', { pattern: 'a(' }), { ok: false, error: { errorType: 'validation', code: 'VALIDATION_ERROR', detail: { reason: 'invalid_regex' } } })
  t.match(await call(ws, 'fs_grep', { pattern: 'x', path: '../' }), { ok: false, error: { code: 'PATH_TRAVERSAL' } })
})

t.test('fs_grep with a catastrophic pattern times out without blocking the service', async (t) => {
  const ws = await setup(t)
  await writeFile(path.join(ws.root, 'evil.txt'), `${'a'.repeat(40)}b\n`)
  const started = Date.now()
  const outcome = await runTool(tools.get('fs_grep') as Tool, { pattern: '^(a+)+$' }, ws.ctx(), { timeoutMs: 500, maxOutputBytes: 1000 })
  t.match(outcome, { ok: false, error: { errorType: 'aborted', code: 'TIMEOUT' } })
  t.ok(Date.now() - started < 1500)
  if (!outcome.ok) t.match(outcome.error.recommendations[0], /nested quantifiers/)
})

t.test('an fs_edit that would multiply a file is refused before it is built, and the file stays as it was', async (t) => {
  const ws = await setup(t)
  const edit = createFsEditTool({ maxFileBytes: 4 * 1024 * 1024 })
  const original = 'a'.repeat(3 * 1024 * 1024)
  await writeFile(path.join(ws.root, 'a.txt'), original)
  const outcome = await runTool(edit, { path: 'a.txt', oldText: 'a', newText: 'b'.repeat(40), replaceAll: true }, ws.ctx(), limits)
  t.match(outcome, {
    ok: false,
    error: { errorType: 'runtime', code: 'OUTPUT_TOO_LARGE', retryable: false, detail: { reason: 'result_too_large', occurrences: 3 * 1024 * 1024 } }
  })
  if (!outcome.ok) t.match(outcome.error.recommendations.join(' '), /nothing was changed.*shorter newText/)
  t.equal((await stat(path.join(ws.root, 'a.txt'))).size, original.length, 'the file was not rewritten')
})

t.test('a large file is edited on a worker thread with the same answers', async (t) => {
  const ws = await setup(t)
  const edit = createFsEditTool({ maxFileBytes: 4 * 1024 * 1024 })
  await writeFile(path.join(ws.root, 'a.txt'), 'ab'.repeat(1536 * 1024))
  t.match(await runTool(edit, { path: 'a.txt', oldText: 'a', newText: '$&' }, ws.ctx(), limits), {
    ok: false,
    error: { code: 'VALIDATION_ERROR', detail: { reason: 'ambiguous', occurrences: 1536 * 1024 } }
  })
  t.match(await runTool(edit, { path: 'a.txt', oldText: 'a', newText: '$', replaceAll: true }, ws.ctx(), limits), { ok: true, result: { replacements: 1536 * 1024 } })
  t.equal(await readFile(path.join(ws.root, 'a.txt'), 'utf8'), '$b'.repeat(1536 * 1024))
})

t.test('fs_write and fs_edit replace a hard link instead of writing through it to a file outside', async (t) => {
  const ws = await setup(t)
  const outside = path.join(ws.base, 'secret.txt')
  await link(outside, path.join(ws.root, 'hard.txt'))
  t.match(await call(ws, 'fs_edit', { path: 'hard.txt', oldText: 'outside', newText: 'edited' }), { ok: true })
  t.match(await call(ws, 'fs_write', { path: 'hard.txt', content: 'written' }), { ok: true, result: { created: false } })
  t.equal(await readFile(outside, 'utf8'), 'TOKEN=outside\n', 'the file outside is unchanged')
  t.equal(await readFile(path.join(ws.root, 'hard.txt'), 'utf8'), 'written')
  await chmod(path.join(ws.root, 'src', 'main.ts'), 0o751)
  t.match(await call(ws, 'fs_edit', { path: 'src/main.ts', oldText: 'console', newText: 'globalThis.console' }), { ok: true })
  t.equal((await stat(path.join(ws.root, 'src', 'main.ts'))).mode & 0o777, 0o751, 'an edited file keeps its mode')
})

t.test('a write that fills the disk leaves the file as it was, and the model is told not to retry', async (t) => {
  const base = await mkdtemp(path.join(tmpdir(), 'agentd-small-disk-'))
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=2m', 'tmpfs', base], { stdio: 'ignore' })
  } catch {
    await rm(base, { recursive: true })
    t.plan(0, 'mounting a 2 MiB tmpfs needs root')
    return
  }
  t.teardown(async () => {
    execFileSync('umount', [base])
    await rm(base, { recursive: true })
  })
  const small = await makeWorkspaceIn(base)
  const original = 'keep me\n'.repeat(150_000)
  await writeFile(path.join(small.root, 'notes.txt'), original)
  const leftOver = async () => (await readdir(small.root)).sort()
  const edited = await runTool(tools.get('fs_edit') as Tool, { path: 'notes.txt', oldText: 'keep me', newText: 'keep me, and keep me', replaceAll: true }, small.ctx(), limits)
  t.match(edited, { ok: false, error: { errorType: 'runtime', code: 'IO_ERROR', retryable: false, detail: { reason: 'disk_full', path: 'notes.txt' } } })
  if (!edited.ok) t.match(edited.error.recommendations[0], /disk is full; "notes.txt" was not changed/)
  t.equal(await readFile(path.join(small.root, 'notes.txt'), 'utf8'), original, 'fs_edit left the file whole')
  const written = await runTool(tools.get('fs_write') as Tool, { path: 'notes.txt', content: 'x'.repeat(2_500_000) }, small.ctx(), limits)
  t.match(written, { ok: false, error: { code: 'IO_ERROR', retryable: false, detail: { reason: 'disk_full' } } })
  t.equal(await readFile(path.join(small.root, 'notes.txt'), 'utf8'), original, 'fs_write left the file whole')
  t.same(await leftOver(), ['notes.txt'], 'no partial file is left behind')
})

t.test('a name or path too long for the file system is a bad argument, not an I/O failure to retry', async (t) => {
  const ws = await setup(t)
  const longName = 'n'.repeat(300)
  const longPath = `${'d'.repeat(200)}/`.repeat(25) + 'f.txt'
  for (const [name, input] of [
    ['fs_read', { path: longName }],
    ['fs_write', { path: longName, content: 'x' }],
    ['fs_write', { path: longPath, content: 'x' }],
    ['fs_list', { path: `src/${longName}` }]
  ] as const) {
    const outcome = await call(ws, name, input)
    t.match(outcome, { ok: false, error: { errorType: 'validation', code: 'VALIDATION_ERROR', retryable: false, detail: { reason: 'name_too_long' } } }, name)
    if (!outcome.ok) t.match(outcome.error.recommendations[0], /at most 255 bytes/)
  }
})
