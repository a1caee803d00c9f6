import t from 'tap'
import { createBuiltinTools } from '../../src/tools/builtin/index.ts'
import { ToolFailure, classifyToolError, toolErrorCatalogue, toolTimeout, type ToolErrorCode } from '../../src/tools/tool-errors.ts'
import type { Tool } from '../../src/tools/types.ts'

// Each built-in tool advises the model on its own failures (STYLE habit 15); these check that
// advice as the model gets it, through the classifier, for failures the tools and the runtime report.

const tools = new Map<string, Tool>(createBuiltinTools({ bashEnabled: true, httpFetch: { allowPrivate: false } }).map((tool) => [tool.name, tool]))
const fsTools = ['fs_read', 'fs_write', 'fs_edit', 'fs_list', 'fs_glob', 'fs_grep']

function builtin(name: string): Tool {
  const tool = tools.get(name)
  if (!tool) throw new Error(`no built-in tool ${name}`)
  return tool
}

/** The recommendations the model gets when `name` fails with this code and detail. */
function advice(name: string, code: ToolErrorCode, detail?: Record<string, unknown>, input?: unknown): string {
  return classifyToolError(builtin(name), new ToolFailure(code, 'failed', detail), input).recommendations.join('\n')
}

t.test('every built-in tool has advice of its own', async (t) => {
  t.same([...tools.keys()].sort(), [...fsTools, 'http_fetch', 'bash_run'].sort())
  for (const tool of tools.values()) t.type(tool.recommend, 'function', tool.name)
})

t.test('a missing path, from any fs tool, names it and suggests fs_glob and fs_list', async (t) => {
  for (const name of fsTools) {
    const text = advice(name, 'NOT_FOUND', { path: 'src/app/main.ts' })
    t.match(text, /"src\/app\/main\.ts" does not exist/, name)
    t.match(text, /fs_glob with a pattern such as "\*\*\/main\.ts"/, name)
    t.match(text, /fs_list on "src\/app"/, name)
  }
  t.match(advice('fs_read', 'NOT_FOUND', undefined, { path: 'notes.md' }), /fs_list on "\."/, 'the path may come from the input')
})

t.test('a folder, a file or a device where the tool needed another kind gets advice on that kind', async (t) => {
  t.match(advice('fs_read', 'IO_ERROR', { path: 'src', reason: 'is_directory' }), /"src" is a directory; use fs_list/)
  t.match(classifyToolError(builtin('fs_write'), Object.assign(new Error('EISDIR'), { code: 'EISDIR' }), { path: 'src' }).recommendations[0], /"src" is a directory/)
  t.match(advice('fs_list', 'IO_ERROR', { path: 'a.txt', reason: 'not_directory' }), /"a.txt" is a file, not a folder/)
  t.match(advice('fs_edit', 'IO_ERROR', { path: 'pipe', reason: 'not_regular_file' }), /pipe, socket or device/)
})

t.test('a path that names a folder: fs_write is told to give a file name, fs_read and fs_edit to drop the "/" or name a file inside', async (t) => {
  const folder = (name: string, path: string) => advice(name, 'VALIDATION_ERROR', { path, reason: 'names_a_folder' })
  t.match(folder('fs_write', 'new/'), /"new\/" names a folder; fs_write writes a file: give the file's name after the folder, e\.g\. "new\/notes\.txt"\.\nTo write the file "new" itself, name it without the "\/"\./)
  t.match(folder('fs_write', 'a/b/.'), /e\.g\. "a\/b\/notes\.txt"/)
  t.equal(folder('fs_write', './'), '"./" names a folder; fs_write writes a file: give the file\'s name after the folder, e.g. "notes.txt".', 'the root: no file to name without the "/"')
  t.match(folder('fs_read', 'README.md/'), /If "README\.md" is the file, name it without the "\/" \("README\.md"\)\.\nTo read a file in the folder, name it, e\.g\. "README\.md\/<file>"; use fs_list on "README\.md"/)
  t.match(folder('fs_edit', 'src/'), /To edit a file in the folder/)
})

t.test('fs_edit: a mismatch says to copy the exact text, an ambiguity offers replaceAll', async (t) => {
  t.match(advice('fs_edit', 'NOT_FOUND', { path: 'a.txt', reason: 'no_match' }), /oldText does not occur in "a.txt".*fs_read/)
  const ambiguous = advice('fs_edit', 'VALIDATION_ERROR', { path: 'a.txt', reason: 'ambiguous', occurrences: 3 })
  t.match(ambiguous, /occurs 3 times in "a.txt"/)
  t.match(ambiguous, /replaceAll: true/)
  t.match(advice('fs_edit', 'OUTPUT_TOO_LARGE', { path: 'a.txt' }), /too large for fs_edit/)
})

t.test('fs_read: an offset past the end gives the number of lines', async (t) => {
  t.match(advice('fs_read', 'NOT_FOUND', { path: 'a.txt', reason: 'offset_past_end', lines: 12 }), /"a.txt" has 12 lines; read it with an offset within that range/)
})

t.test('fs_grep: an invalid pattern says how to escape it', async (t) => {
  t.match(advice('fs_grep', 'VALIDATION_ERROR', { pattern: '(', reason: 'invalid_regex' }), /not a valid JavaScript regular expression/)
  t.match(advice('fs_grep', 'VALIDATION_ERROR', { pattern: 'x' }), /Call fs_grep again with arguments that match/, 'another validation failure gets the general advice')
})

t.test('a timeout suggests a narrower command, search or request, each for its tool', async (t) => {
  const timeout = (name: string) => toolTimeout(builtin(name), 1000).recommendations.join(' ')
  t.match(timeout('bash_run'), /Narrow the command/)
  t.match(timeout('bash_run'), /larger timeoutMs/)
  t.match(timeout('fs_grep'), /narrower path or glob/)
  t.match(timeout('http_fetch'), /did not answer in time/)
  t.equal(timeout('fs_list'), toolTimeout({ name: 'fs_list' }, 1000).recommendations.join(' '), 'a tool without timeout advice gets the general one')
})

t.test('too much output: ranges for fs_read, filters for bash_run, a narrower search or a smaller resource', async (t) => {
  t.match(advice('fs_read', 'OUTPUT_TOO_LARGE'), /offset and limit/)
  t.match(advice('bash_run', 'OUTPUT_TOO_LARGE'), /head -n/)
  for (const name of ['fs_grep', 'fs_glob', 'fs_list']) t.match(advice(name, 'OUTPUT_TOO_LARGE'), /Narrow the search/, name)
  t.match(advice('http_fetch', 'OUTPUT_TOO_LARGE'), /smaller resource/)
  t.match(advice('fs_write', 'OUTPUT_TOO_LARGE'), /Ask for less output/, 'fs_write has none of its own')
})

t.test('bash_run: a failed command names its exit code', async (t) => {
  const failed = classifyToolError(builtin('bash_run'), { ok: false, error: 'The command exited with code 2.', exitCode: 2, stderr: 'no' })
  t.match(failed, { errorType: 'logical', code: 'UNKNOWN', detail: { exitCode: 2 } })
  t.match(failed.recommendations[0], /exited with code 2; read stderr and stdout/)
  t.match(advice('bash_run', 'UNKNOWN', { signal: 'SIGKILL' }), /bash_run failed; check the arguments/, 'killed by a signal: the general advice')
})

t.test('http_fetch: a refused address, a redirect loop and an unreachable host each get their own advice', async (t) => {
  t.match(advice('http_fetch', 'PERMISSION_DENIED', { url: 'http://127.0.0.1/' }), /fetch a public http\(s\) URL/)
  t.match(advice('http_fetch', 'IO_ERROR', { reason: 'too_many_redirects' }), /fetch the final URL directly/)
  t.match(advice('http_fetch', 'IO_ERROR', { errno: 'ECONNREFUSED' }), /host is reachable/)
})

t.test('a failure a tool has no advice for gets the general advice of its code', async (t) => {
  for (const name of tools.keys()) {
    const general = toolErrorCatalogue.CONFIG_ERROR.advice({ tool: name, code: 'CONFIG_ERROR', detail: undefined, reason: undefined, path: undefined, input: undefined })
    t.equal(advice(name, 'CONFIG_ERROR'), general.join('\n'), name)
  }
})
