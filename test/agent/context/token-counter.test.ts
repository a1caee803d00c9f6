import t from 'tap'
import { countTokens } from 'gpt-tokenizer/encoding/o200k_base'
import { countInPieces, memoized, PIECE_CHARS, tokenCounterFor, type TokenCounter } from '../../../src/agent/context/token-counter.ts'

/** A counter that says what it was asked to count: one token per character. */
function recording(): TokenCounter & { asked: number[] } {
  const asked: number[] = []
  return { encoding: 'estimate', asked, count: (text) => (asked.push(text.length), text.length) }
}

t.test('a long text is counted ahead, a slice per turn of the event loop, and remembered', async (t) => {
  const inner = recording()
  const counter = memoized(inner)
  const long = 'word '.repeat(40_000)
  let turns = 0
  const ticking = setInterval(() => turns++, 0)
  await counter.prime(['short', long])
  clearInterval(ticking)
  t.ok(inner.asked.length > 10 && inner.asked.every((n) => n <= 1024), `sliced: ${inner.asked.length} slices, none over 1 KiB`)
  t.ok(turns > 0, 'other work ran between the slices')
  const before = inner.asked.length
  t.equal(counter.count(long), long.length, 'the slices add up to the whole')
  t.equal(inner.asked.length, before, 'and the count is remembered: the planner does not tokenize it again')
})

t.test('many short texts are counted ahead a few ms of the event loop at a time, and remembered', async (t) => {
  // A tokenizer at ~20 µs a message: 3 000 messages are ~60 ms of counting.
  const inner = recording()
  const slow: TokenCounter = {
    encoding: 'estimate',
    count: (text) => {
      const until = performance.now() + 0.02
      while (performance.now() < until);
      return inner.count(text)
    }
  }
  const counter = memoized(slow)
  const texts = Array.from({ length: 3000 }, (_, i) => `message ${i}`)
  let turns = 0
  let longest = 0
  let last = performance.now()
  const ticking = setInterval(() => {
    turns++
    longest = Math.max(longest, performance.now() - last)
    last = performance.now()
  }, 0)
  await counter.prime(texts)
  clearInterval(ticking)
  t.equal(inner.asked.length, 3000, 'each counted once')
  t.ok(turns >= 5, `other work ran between them (${turns} turns)`)
  t.ok(longest < 100, `the event loop's longest wait: ${longest.toFixed(1)} ms`)
  for (const text of texts) counter.count(text)
  t.equal(inner.asked.length, 3000, 'the planner finds every count remembered')
})

t.test('with a real tokenizer, a count made in slices is the whole count or a little above it', async (t) => {
  const real = await tokenCounterFor('gpt-4o')
  const text = 'The workspace was listed and it holds a README, a src folder and tests. '.repeat(2000)
  const counter = memoized(real)
  await counter.prime([text])
  const whole = real.count(text)
  const sliced = counter.count(text)
  t.ok(sliced >= whole && sliced <= whole * 1.01, `sliced ${sliced}, whole ${whole}`)
})

t.test('a tokenizer is given at most PIECE_CHARS at a time: cut before a space where there is one, never inside a character', async (t) => {
  // Its merges take time quadratic in a stretch without a space: 4 KiB of Chinese held the event loop tens of ms.
  const pieces: string[] = []
  const count = countInPieces((text) => (pieces.push(text), text.length))
  const chinese = '的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年'.repeat(200)
  t.equal(count(chinese), chinese.length, 'the pieces add up to the whole')
  t.ok(pieces.length > 1 && pieces.every((p) => p.length <= PIECE_CHARS), `${pieces.length} pieces, none over ${PIECE_CHARS} characters`)
  pieces.length = 0
  const words = 'the workspace holds a README\n'.repeat(100)
  count(words)
  t.ok(pieces.slice(1).every((p) => p.startsWith(' ') || p.startsWith('\n')), 'each piece after the first starts at a space or line break')
  pieces.length = 0
  const emoji = `a${'😀'.repeat(1000)}`
  t.equal(count(emoji), emoji.length)
  t.ok(pieces.every((p) => !/\p{Cs}/u.test(p)), 'no piece holds half of an emoji')
})

t.test('with a real tokenizer, text with spaces counts the same in pieces, and a stretch without any no less', async (t) => {
  const real = await tokenCounterFor('gpt-4o')
  const plain = { disallowedSpecial: new Set<string>() }
  const english = 'The workspace was listed and it holds a README, a src folder and tests.\n'.repeat(300)
  t.equal(real.count(english), countTokens(english, plain), 'the same count as in one go')
  const chinese = Array.from({ length: 3000 }, (_, i) => String.fromCodePoint(0x4e00 + ((i * 7919) % 20000))).join('')
  t.ok(real.count(chinese) >= countTokens(chinese, plain), 'never fewer tokens than in one go')
})
