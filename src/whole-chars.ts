/**
 * Where a cut of `text` at `end` UTF-16 units keeps whole characters: `end`, or one sooner when the
 * unit before it opens a surrogate pair (emoji and others outside the BMP are two units). A lone
 * half would be sent as a `\ud83d` escape, which strict JSON parsers refuse as invalid Unicode.
 */
export function wholeCharEnd(text: string, end: number): number {
  const last = text.charCodeAt(end - 1)
  return last >= 0xd800 && last <= 0xdbff ? end - 1 : end
}

/** A lone half of a surrogate pair: with the u flag a whole pair is one code point, never in this category. */
const LONE_SURROGATE = /\p{Surrogate}/u

/**
 * Where the text's first lone surrogate is (in UTF-16 units), or -1 when it has none. The stores and
 * the file system keep text as UTF-8, which has no such code point: Node writes U+FFFD in its place.
 * (String.prototype.isWellFormed says whether, but is not in the es2023 lib this code compiles to.)
 */
export function loneSurrogateAt(text: string): number {
  return LONE_SURROGATE.exec(text)?.index ?? -1
}

const LONE_SURROGATES = /\p{Surrogate}/gu

/**
 * The text with each lone surrogate replaced by U+FFFD, as the stores keep it (the text itself
 * when it has none). Sent as it is, a lone half goes out as a `\ud83d` escape, which strict JSON
 * parsers (DeepSeek's, llama.cpp's) refuse, failing the request.
 */
export function wellFormedText(text: string): string {
  return loneSurrogateAt(text) < 0 ? text : text.replace(LONE_SURROGATES, '\uFFFD')
}
