import { execFileSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import path from 'node:path'
import t from 'tap'

// The project's own Markdown (README, docs/, examples/, clients/) is read by people who have only
// this repository: every link in it must point at a file of the repository, or at a heading of
// one. A link to a file beside the checkout (../shared/…) or to a heading that was renamed fails here.

const root = path.resolve(import.meta.dirname, '..')

/** The repository's own Markdown files, as git tracks them (no node_modules). */
function markdownFiles(): string[] {
  const listed = execFileSync('git', ['ls-files', '*.md'], { cwd: root, encoding: 'utf8' })
  return listed.split('\n').filter((file) => file !== '')
}

/** The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens. */
function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/`/g, '')
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-')
}

/** Every heading anchor of a Markdown file (outside fenced code blocks), read once per file. */
const anchorsByFile = new Map<string, Set<string>>()
function anchorsOf(file: string): Set<string> {
  const known = anchorsByFile.get(file)
  if (known) return known
  const text = readFileSync(file, 'utf8')
  const anchors = new Set<string>()
  let fenced = false
  for (const line of text.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced
    const heading = !fenced && /^#{1,6}\s+(.*)$/.exec(line)
    if (heading) anchors.add(slug(heading[1] ?? ''))
  }
  anchorsByFile.set(file, anchors)
  return anchors
}

/** The targets of the inline links and images of a Markdown text (outside code). */
function linksOf(text: string): string[] {
  const prose = text.replace(/```[\s\S]*?```/g, '').replace(/`[^`\n]*`/g, '')
  return [...prose.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)].map((match) => match[1] ?? '')
}

const files = markdownFiles()

t.test('the repository has Markdown for this test to read', async (t) => {
  t.ok(files.includes('README.md'), 'README.md is tracked')
  t.ok(files.some((file) => file.startsWith('docs/')), 'docs/ holds Markdown')
})

for (const file of files) {
  t.test(`every link of ${file} stays inside the repository and finds its target`, async (t) => {
    const text = readFileSync(path.join(root, file), 'utf8')
    for (const target of linksOf(text)) {
      if (/^(https?:|mailto:)/.test(target)) continue
      const [pathPart = '', anchor] = target.split('#')
      const resolved = pathPart === '' ? path.join(root, file) : path.resolve(root, path.dirname(file), decodeURI(pathPart))
      const inside = path.relative(root, resolved)
      t.notOk(inside.startsWith('..') || path.isAbsolute(inside), `${target} stays inside the repository`)
      if (inside.startsWith('..')) continue
      t.ok(existsSync(resolved), `${target}: ${inside} exists`)
      if (anchor !== undefined && resolved.endsWith('.md') && existsSync(resolved)) {
        t.ok(anchorsOf(resolved).has(anchor), `${target}: ${inside} has a heading #${anchor}`)
      }
    }
  })
}

t.test('the slugs follow GitHub for the headings this README uses', async (t) => {
  t.equal(slug('Long sessions: the context window'), 'long-sessions-the-context-window')
  t.equal(slug('Tracing with any OTLP backend'), 'tracing-with-any-otlp-backend')
  t.equal(slug('Several processes on one PostgreSQL'), 'several-processes-on-one-postgresql')
  t.same(linksOf('see [a](docs/a.md#x) and `[b](../c.md)` and ![d](e.png "title")'), ['docs/a.md#x', 'e.png'])
})
