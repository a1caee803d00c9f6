import { randomBytes } from 'node:crypto'

// Crockford base32: sortable as ASCII, no ambiguous letters.
const ALPHABET = '0123456789ABCDEFGHJKMNPQRSTVWXYZ'
const TIME_LEN = 10
const RANDOM_LEN = 16

let lastTime = -1
let lastRandom = 0n

function encode(value: bigint, length: number): string {
  let out = ''
  for (let i = 0; i < length; i++) {
    out = ALPHABET[Number(value & 31n)] + out
    value >>= 5n
  }
  return out
}

/**
 * A prefixed, time-ordered random ID (ULID layout): IDs made later sort later, also within
 * one millisecond, so "newest first" is simply "largest ID first".
 */
export function newId(prefix: 'ses' | 'run' | 'msg' | 'call' | 'req'): string {
  const now = Date.now()
  if (now <= lastTime) {
    lastRandom = (lastRandom + 1n) & ((1n << 80n) - 1n)
  } else {
    lastTime = now
    lastRandom = BigInt('0x' + randomBytes(10).toString('hex'))
  }
  return `${prefix}_${encode(BigInt(lastTime), TIME_LEN)}${encode(lastRandom, RANDOM_LEN)}`
}

export const ID_PATTERN = {
  session: '^ses_[0-9A-HJKMNP-TV-Z]{26}$',
  run: '^run_[0-9A-HJKMNP-TV-Z]{26}$',
  message: '^msg_[0-9A-HJKMNP-TV-Z]{26}$',
  call: '^call_[A-Za-z0-9_-]{1,128}$'
} as const
