/**
 * Where a cut of `text` at `end` UTF-16 units keeps whole characters: `end`, or one sooner when the
 * unit before it opens a surrogate pair (emoji and others outside the BMP are two units). A lone
 * half would be sent as a `\ud83d` escape, which strict JSON parsers refuse as invalid Unicode.
 */
export function wholeCharEnd(text: string, end: number): number {
  const last = text.charCodeAt(end - 1)
  return last >= 0xd800 && last <= 0xdbff ? end - 1 : end
}
