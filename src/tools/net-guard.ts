import { lookup as dnsLookup } from 'node:dns/promises'
import { BlockList, isIP, type LookupFunction } from 'node:net'
import { errors } from 'undici'
import { createConcurrencyLimiter } from './runtime.ts'
import { ToolFailure } from './tool-errors.ts'

const blockedV4 = new BlockList()
for (const [net, prefix] of [
  ['0.0.0.0', 8], // "this" network, incl. 0.0.0.0
  ['10.0.0.0', 8], // private
  ['100.64.0.0', 10], // carrier-grade NAT
  ['127.0.0.0', 8], // loopback
  ['169.254.0.0', 16], // link-local, incl. the 169.254.169.254 metadata service
  ['172.16.0.0', 12], // private
  ['192.0.0.0', 24], // IETF protocol assignments
  ['192.168.0.0', 16], // private
  ['198.18.0.0', 15], // benchmarking
  ['224.0.0.0', 4], // multicast
  ['240.0.0.0', 4] // reserved, incl. broadcast
] as const) {
  blockedV4.addSubnet(net, prefix, 'ipv4')
}

const blockedV6 = new BlockList()
for (const [net, prefix] of [
  ['::', 128], // unspecified
  ['::1', 128], // loopback
  ['fc00::', 7], // unique local, incl. the fd00:ec2::254 metadata service
  ['fe80::', 10], // link-local
  ['fec0::', 10], // site-local (deprecated)
  ['ff00::', 8], // multicast
  ['100::', 64], // discard
  ['64:ff9b:1::', 48] // local-use NAT64 (RFC 8215): an operator's own translator, into its private IPv4
] as const) {
  blockedV6.addSubnet(net, prefix, 'ipv6')
}

/**
 * True for addresses a fetch from inside the service must not reach: loopback, private,
 * link-local, metadata, unspecified, multicast and reserved ranges, also when an IPv4 address
 * hides inside IPv6 (mapped ::ffff:a.b.c.d, translated ::ffff:0:a.b.c.d, compatible ::a.b.c.d, NAT64 64:ff9b::/96,
 * 6to4 2002:AABB:CCDD::/48); the local-use NAT64 prefix 64:ff9b:1::/48 is refused whole.
 */
export function isForbiddenAddress(address: string): boolean {
  const ip = address.replace(/^\[|\]$/g, '').replace(/%.*$/, '')
  const family = isIP(ip)
  if (family === 4) return blockedV4.check(ip, 'ipv4')
  if (family !== 6) return true
  if (blockedV6.check(ip, 'ipv6')) return true
  const embedded = embeddedIpv4(ip)
  return embedded !== null && blockedV4.check(embedded, 'ipv4')
}

function embeddedIpv4(ip: string): string | null {
  const groups = expandIpv6(ip)
  if (!groups) return null
  const top = groups.slice(0, 6)
  const zero = (g: number[]) => g.every((x) => x === 0)
  const mapped = zero(top.slice(0, 5)) && top[5] === 0xffff
  const translated = zero(top.slice(0, 4)) && top[4] === 0xffff && top[5] === 0
  const compatible = zero(top)
  const nat64 = groups[0] === 0x64 && groups[1] === 0xff9b && zero(groups.slice(2, 6))
  const quad = (hi: number, lo: number) => `${hi >> 8}.${hi & 0xff}.${lo >> 8}.${lo & 0xff}`
  // 6to4 (2002::/16) carries the IPv4 address right after the prefix; a host with a 6to4 tunnel sends it there.
  if (groups[0] === 0x2002) return quad(groups[1] ?? 0, groups[2] ?? 0)
  if (!(mapped || translated || compatible || nat64)) return null
  return quad(groups[6] ?? 0, groups[7] ?? 0)
}

/** The eight 16-bit groups of an IPv6 address (a trailing dotted quad allowed), or null. */
function expandIpv6(ip: string): number[] | null {
  let text = ip.toLowerCase()
  const quad = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text)
  if (quad) {
    const [a, b, c, d] = quad.slice(1).map(Number) as [number, number, number, number]
    text = `${text.slice(0, quad.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`
  }
  const halves = text.split('::')
  if (halves.length > 2) return null
  const parse = (part: string) => (part === '' ? [] : part.split(':').map((g) => parseInt(g, 16)))
  const head = parse(halves[0] ?? '')
  const tail = halves.length === 2 ? parse(halves[1] ?? '') : []
  const fill = halves.length === 2 ? 8 - head.length - tail.length : 0
  const groups = [...head, ...new Array<number>(Math.max(0, fill)).fill(0), ...tail]
  return groups.length === 8 && groups.every((g) => Number.isInteger(g) && g >= 0 && g <= 0xffff) ? groups : null
}

/**
 * True when the URL's host is in `entries`: `host` matches any port, `host:port` only that port
 * (the scheme's default port when the URL has none). IPv6 entries are written in brackets.
 */
export function hostAllowed(url: URL, entries: readonly string[]): boolean {
  const hostname = url.hostname.toLowerCase()
  const port = url.port || (url.protocol === 'https:' ? '443' : '80')
  return entries.some((raw) => {
    const entry = raw.trim().toLowerCase()
    if (entry === '') return false
    let parsed: URL
    try {
      parsed = new URL(`http://${entry}`)
    } catch {
      return false
    }
    if (parsed.hostname !== hostname) return false
    const explicitPort = /:\d+$/.test(entry)
    return !explicitPort || (parsed.port || '80') === port
  })
}

export interface AddressPolicy {
  /** Reach any address (a development setting). */
  allowPrivate: boolean
  /** Hosts (`host` or `host:port`) that may resolve to forbidden addresses anyway. */
  allowedHosts: readonly string[]
}

export interface CheckedAddress {
  address: string
  family: 4 | 6
}

/** Resolves a host name to its addresses; a caller still waiting when `signal` fires stops waiting. */
export type Resolve = (hostname: string, signal: AbortSignal) => Promise<CheckedAddress[]>

/**
 * Host lookups tools make at once, all sessions and tenants together, with the hooks' and the MCP
 * servers' (src/hooks/delivery.ts, src/tools/mcp/connection.ts). getaddrinfo runs on libuv's
 * thread pool (4 threads by default) and cannot be cancelled: a name whose DNS never answers holds
 * its thread until the system resolver gives up, tens of seconds later. Bounded, such lookups take
 * at most two threads, and fs, zlib and crypto work keeps the others. The pool is the process's, so
 * the bound is too: one limiter per process, not a port shared between processes.
 */
const MAX_LOOKUPS = 2
const lookupSlots = createConcurrencyLimiter(MAX_LOOKUPS)

/**
 * getaddrinfo through the tools' lookup slots. A call still queued when `signal` fires leaves the
 * queue; one already looking up keeps its slot until the resolver returns, so the bound holds.
 */
export const lookupHost: Resolve = (hostname, signal) =>
  lookupSlots.run('getaddrinfo', async () => {
    const answer = await dnsLookup(hostname, { all: true, verbatim: true })
    return answer.map((a): CheckedAddress => ({ address: a.address, family: a.family === 6 ? 6 : 4 }))
  }, signal)

/**
 * A socket lookup (for connections undici makes, e.g. webhook tools) through the same slots; a
 * connection still queued after `waitMs` gives up, as its connect timeout ends the connection.
 */
export function queuedLookup(waitMs: number): LookupFunction {
  return (hostname, options, callback) => {
    lookupHost(hostname, AbortSignal.timeout(waitMs)).then(
      (addresses) => pinnedLookup(new Map([[hostname.toLowerCase(), addresses]]))(hostname, options, callback),
      (err: unknown) => callback(err as NodeJS.ErrnoException, '', 0)
    )
  }
}

/**
 * Resolves the URL's host and checks every address against the policy; refuses with PERMISSION_DENIED
 * (no retry can help) when any address is forbidden, so a mixed answer cannot sneak one in.
 */
export async function resolveChecked(url: URL, policy: AddressPolicy, signal: AbortSignal, resolve: Resolve = lookupHost): Promise<CheckedAddress[]> {
  const hostname = url.hostname.replace(/^\[|\]$/g, '')
  const literal = isIP(hostname)
  let addresses: CheckedAddress[]
  if (literal !== 0) addresses = [{ address: hostname, family: literal === 6 ? 6 : 4 }]
  else {
    try {
      addresses = await resolve(hostname, signal)
    } catch (err) {
      if (signal.aborted) throw err
      throw new ToolFailure('IO_ERROR', `Could not resolve the host "${hostname}".`, { host: hostname, errno: (err as NodeJS.ErrnoException).code }, { cause: err })
    }
    if (addresses.length === 0) throw new ToolFailure('IO_ERROR', `The host "${hostname}" has no address.`, { host: hostname })
  }
  if (policy.allowPrivate || hostAllowed(url, policy.allowedHosts)) return addresses
  const forbidden = addresses.find((a) => isForbiddenAddress(a.address))
  if (forbidden) {
    throw new ToolFailure(
      'PERMISSION_DENIED',
      `Refused to connect to ${url.host}: it resolves to ${forbidden.address}, a loopback, private, link-local or metadata address.`,
      { url: url.href, address: forbidden.address }
    )
  }
  return addresses
}

/**
 * A socket lookup that answers only from addresses already checked, so DNS rebinding between the
 * check and the connection cannot switch the target. Unknown host names fail.
 */
export function pinnedLookup(pins: ReadonlyMap<string, CheckedAddress[]>): LookupFunction {
  return (hostname, options, callback) => {
    const addresses = pins.get(hostname.toLowerCase())
    const first = addresses?.[0]
    if (!addresses || !first) {
      const err = Object.assign(new Error(`No checked address for ${hostname}`), { code: 'ENOTFOUND' })
      callback(err, '', 0)
      return
    }
    if (options.all) (callback as unknown as (e: null, a: CheckedAddress[]) => void)(null, addresses)
    else callback(null, first.address, first.family)
  }
}

/** True when the server answered, but not with HTTP that can be read: a retry gets the same. */
export function brokenAnswer(err: unknown): boolean {
  const code = (err as { code?: unknown }).code
  return err instanceof errors.HTTPParserError || code === 'UND_ERR_HEADERS_OVERFLOW' || code === 'UND_ERR_RES_CONTENT_LENGTH_MISMATCH'
}
