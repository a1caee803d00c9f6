// tap compiles its plugin list into node_modules on `tap build`. A fresh `npm install` ships the
// default list, whose @tapjs/typescript plugin loads ts-node, which needs the TypeScript JS API
// that TypeScript 7 no longer has. This project runs tests through Node's own type stripping
// instead (package.json "tap.plugin": ["!@tapjs/typescript"]), so rebuild once when needed.
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'

const require = createRequire(import.meta.url)
const packageDir = (name: string) => dirname(require.resolve(`${name}/package.json`))
const built = readFileSync(join(packageDir('@tapjs/test'), 'test-built/dist/esm/index.js'), 'utf8')
if (built.includes('@tapjs/typescript')) {
  process.stdout.write('tap: rebuilding its plugins without @tapjs/typescript (once after install)\n')
  execFileSync(process.execPath, [join(packageDir('tap'), 'dist/esm/run.mjs'), 'build'], { stdio: 'inherit' })
}
