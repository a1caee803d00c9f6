import { randomFillSync } from 'node:crypto'

// Crockford base32: sortable as ASCII, no ambiguous letters.
const ALPHABET = '0123456789ABCDEFGHJKMNPQRSTVWXYZ'
const TIME_LEN = 10
/** The 80 random bits are kept as two 40-bit halves: plain numbers, exact in a double, no BigInt. */
const HALF = 2 ** 40
const HALF_LEN = 8

let lastTime = -1
let randomHigh = 0
let randomLow = 0

/** Random bytes drawn from the system in blocks: one syscall for hundreds of IDs. */
const pool = Buffer.alloc(4096)
let poolAt = pool.length

/** A random integer in [0, 2^40) from the pool's next five bytes. */
function random40(): number {
  if (poolAt + 5 > pool.length) {
    randomFillSync(pool)
    poolAt = 0
  }
  const value = pool.readUIntBE(poolAt, 5)
  poolAt += 5
  return value
}

/** `value` (an integer below 32^length) as `length` base32 digits, most significant first. */
function encode(value: number, length: number): string {
  let out = ''
  for (let i = 0; i < length; i++) {
    out = ALPHABET[value % 32] + out
    value = Math.floor(value / 32)
  }
  return out
}

/**
 * A prefixed, time-ordered random ID (ULID layout): IDs made later sort later, also within
 * one millisecond (the random part counts up), so "newest first" is simply "largest ID first".
 */
export function newId(prefix: 'ses' | 'run' | 'msg' | 'call' | 'req'): string {
  const now = Date.now()
  if (now <= lastTime) {
    randomLow++
    if (randomLow === HALF) {
      randomLow = 0
      randomHigh = (randomHigh + 1) % HALF
    }
  } else {
    lastTime = now
    randomHigh = random40()
    randomLow = random40()
  }
  return `${prefix}_${encode(lastTime, TIME_LEN)}${encode(randomHigh, HALF_LEN)}${encode(randomLow, HALF_LEN)}`
}

export const ID_PATTERN = {
  session: '^ses_[0-9A-HJKMNP-TV-Z]{26}$',
  run: '^run_[0-9A-HJKMNP-TV-Z]{26}$',
  message: '^msg_[0-9A-HJKMNP-TV-Z]{26}$',
  call: '^call_[A-Za-z0-9_-]{1,128}$'
} as const
