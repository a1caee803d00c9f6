#!/usr/bin/env node
// The `agentd` command. Plain JavaScript on purpose: it must start on whatever Node the machine
// has, so that an old one gets a one-line answer or the Node 24 that npm installed with the
// project (the `node` package) instead of a stack trace about an unknown ".ts" extension.
import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

/** Node runs the project's TypeScript itself (type stripping) from 22.18 on. */
const MINIMUM = [22, 18]
const [major, minor] = process.versions.node.split('.').map(Number)
const supported = major > MINIMUM[0] || (major === MINIMUM[0] && minor >= MINIMUM[1])

if (supported) {
  const { main } = await import('../src/cli/main.ts')
  const code = await main(process.argv.slice(2))
  // `serve` keeps running (undefined); every other command ends here, open sockets or not.
  if (code !== undefined) process.exit(code)
} else {
  const bundled = fileURLToPath(new URL('../node_modules/node/bin/node', import.meta.url))
  if (!existsSync(bundled)) {
    process.stderr.write(
      `agentd: needs Node.js ${MINIMUM.join('.')} or newer and found ${process.version}; ` +
        'run `npm install` (it installs Node 24 for the project) or install a newer Node\n'
    )
    process.exit(1)
  }
  // Node's own flags (`npm start` gives one, see package.json) go to the Node that runs the command.
  const child = spawn(bundled, [...process.execArgv, fileURLToPath(import.meta.url), ...process.argv.slice(2)], { stdio: 'inherit' })
  // The child is the service or the CLI: it gets the signals meant for this process. Not SIGINT,
  // which this process ignores while the child runs, as system() does: a terminal's Ctrl+C reaches
  // the whole process group, the child too, and a second one from here would be a second Ctrl+C
  // (in `chat`, the first interrupts the run and the second quits).
  process.on('SIGINT', () => {})
  for (const signal of ['SIGTERM', 'SIGHUP']) process.on(signal, () => child.kill(signal))
  child.on('exit', (code, signal) => process.exit(code ?? (signal ? 128 : 1)))
}
