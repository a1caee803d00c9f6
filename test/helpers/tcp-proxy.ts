import { connect, createServer, type Socket } from 'node:net'
import type { AddressInfo } from 'node:net'

/**
 * A TCP proxy in front of a server (the tests' PostgreSQL), to take the network away from a
 * process: `cut()` closes every connection and refuses new ones (a database that went down),
 * `partition()` keeps the connections open but carries nothing either way (a network that drops
 * packets: nobody is told), and `restore()` undoes either. `drop()` partitions only the
 * connections open now, for good, and lets new ones through (a NAT that forgot a connection, a
 * server host that lost power behind a load balancer that sends new connections elsewhere).
 */
export interface TcpProxy {
  readonly port: number
  cut(): void
  partition(): void
  drop(): void
  restore(): void
  close(): Promise<void>
}

export async function startTcpProxy(target: { host: string; port: number }): Promise<TcpProxy> {
  let mode: 'open' | 'cut' | 'partition' = 'open'
  const pairs = new Set<[Socket, Socket]>()
  /** Connections drop() took out: never joined again, destroyed by close(). */
  const dropped = new Set<[Socket, Socket]>()
  const server = createServer((client) => {
    if (mode === 'cut') return client.destroy()
    const upstream = connect(target.port, target.host)
    const pair: [Socket, Socket] = [client, upstream]
    pairs.add(pair)
    const end = () => {
      client.destroy()
      upstream.destroy()
      pairs.delete(pair)
    }
    for (const socket of pair) {
      socket.on('error', end)
      socket.on('close', end)
    }
    if (mode === 'open') join(pair)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const join = ([client, upstream]: [Socket, Socket]) => {
    client.pipe(upstream)
    upstream.pipe(client)
  }
  const split = ([client, upstream]: [Socket, Socket]) => {
    client.unpipe(upstream)
    upstream.unpipe(client)
    client.pause()
    upstream.pause()
  }
  return {
    port: (server.address() as AddressInfo).port,
    cut() {
      mode = 'cut'
      for (const [client, upstream] of pairs) {
        client.destroy()
        upstream.destroy()
      }
      pairs.clear()
    },
    partition() {
      mode = 'partition'
      for (const pair of pairs) split(pair)
    },
    drop() {
      for (const pair of pairs) {
        split(pair)
        dropped.add(pair)
      }
      pairs.clear()
    },
    restore() {
      if (mode === 'partition') for (const pair of pairs) join(pair)
      mode = 'open'
    },
    async close() {
      mode = 'cut'
      for (const [client, upstream] of [...pairs, ...dropped]) {
        client.destroy()
        upstream.destroy()
      }
      await new Promise<void>((resolve) => server.close(() => resolve()))
    }
  }
}

/** A proxy in front of the server a URL names (closed when the test ends), and the same URL through it. */
export async function proxyInFrontOf(t: { teardown(fn: () => unknown): void }, url: string, defaultPort: number): Promise<{ proxy: TcpProxy; url: URL }> {
  const target = new URL(url)
  const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || defaultPort) })
  t.teardown(() => proxy.close())
  const through = new URL(url)
  through.port = String(proxy.port)
  return { proxy, url: through }
}
