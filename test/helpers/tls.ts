import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createServer, type ServerOptions } from 'node:https'
import type { AddressInfo } from 'node:net'
import { join } from 'node:path'
import { tempDir } from './app.ts'

type Tap = { teardown(fn: () => unknown): void }

export interface Certificate {
  key: Buffer
  cert: Buffer
}

/** A fresh key and self-signed certificate for `localhost` (and no IP address), made with openssl. */
export function selfSignedCertificate(t: Tap): Certificate {
  const dir = tempDir(t, 'agentd-tls-')
  const key = join(dir, 'key.pem')
  const cert = join(dir, 'cert.pem')
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', key, '-out', cert,
    '-days', '1', '-subj', '/CN=localhost', '-addext', 'subjectAltName=DNS:localhost'
  ], { stdio: 'ignore' })
  return { key: readFileSync(key), cert: readFileSync(cert) }
}

/** An HTTPS server on 127.0.0.1 presenting `certificate` (with `options`: versions, ciphers), answering `{}` to every request it gets. */
export async function serveHttps(t: Tap, certificate: Certificate, options: ServerOptions = {}): Promise<{ port: number; origin: string; hits: () => number }> {
  let hits = 0
  const server = createServer({ ...options, key: certificate.key, cert: certificate.cert } satisfies ServerOptions, (_req, res) => {
    hits++
    res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
  })
  server.on('tlsClientError', () => {})
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    server.closeAllConnections()
    server.close()
  })
  const port = (server.address() as AddressInfo).port
  return { port, origin: `https://127.0.0.1:${port}`, hits: () => hits }
}
