import { readFileSync } from 'node:fs'
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify'

/** The console's static files (src/console/), read once at start: no build step, no file access per request. */
const ASSETS = {
  'index.html': 'text/html; charset=utf-8',
  'app.js': 'text/javascript; charset=utf-8',
  'style.css': 'text/css; charset=utf-8'
} as const

/**
 * The console loads only its own script and stylesheet and calls only this origin's API; the
 * API's CSP (default-src 'none') would stop it from running at all.
 */
export const CONSOLE_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
  "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

const pathsOf = (name: string) => (name === 'index.html' ? ['/console', '/console/'] : [`/console/${name}`])

/** The console's paths, exactly: they need no API key (the page asks for one and sends it on API calls). */
export const CONSOLE_PATHS = Object.keys(ASSETS).flatMap(pathsOf)

/** GET /console: the browser console (SPEC 14), a static page that speaks only the public HTTP API. */
export const consoleRoutes: FastifyPluginAsync = async (app) => {
  const root = new URL('../console/', import.meta.url)
  for (const [name, type] of Object.entries(ASSETS)) {
    const body = readFileSync(new URL(name, root))
    const serve = async (_request: FastifyRequest, reply: FastifyReply) =>
      reply.header('content-security-policy', CONSOLE_CSP).header('cache-control', 'no-cache').type(type).send(body)
    for (const path of pathsOf(name)) app.get(path, { schema: { hide: true } }, serve)
  }
}
