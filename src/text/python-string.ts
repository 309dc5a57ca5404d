// Python's str whitespace semantics, which Search-R1's text handling relies on (strip() in
// its action parsing and answer extraction, split() in answer normalisation): the agent and
// the rewards must cut the same strings as the original, not merely similar ones.

/**
 * Python's str.isspace() set (listed from Python 3.11): what str.split() and str.strip() without
 * arguments cut on. Wider than JavaScript's \s, which lacks \x1c-\x1f and \x85, and narrower in
 * one place: \s has U+FEFF, Python does not.
 */
const PYTHON_SPACES = new Set([
  0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001,
  0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f,
  0x205f, 0x3000,
]);

/** All are in the BMP, so one UTF-16 unit decides (a surrogate is never a space). */
function isPythonSpace(code: number): boolean {
  return PYTHON_SPACES.has(code);
}

/** Python's s.strip(). */
export function pythonStrip(s: string): string {
  let start = 0;
  let end = s.length;
  while (start < end && isPythonSpace(s.charCodeAt(start))) start++;
  while (end > start && isPythonSpace(s.charCodeAt(end - 1))) end--;
  return s.slice(start, end);
}

/** Python's s.split(): runs of whitespace separate, empty pieces dropped. */
export function pythonSplit(s: string): string[] {
  const out: string[] = [];
  let start = -1;
  for (let i = 0; i <= s.length; i++) {
    const space = i === s.length || isPythonSpace(s.charCodeAt(i));
    if (space && start >= 0) {
      out.push(s.slice(start, i));
      start = -1;
    } else if (!space && start < 0) {
      start = i;
    }
  }
  return out;
}

/** Whether s has nothing but Python whitespace (Python: `not s.strip()`). */
export function isBlank(s: string): boolean {
  for (let i = 0; i < s.length; i++) if (!isPythonSpace(s.charCodeAt(i))) return false;
  return true;
}
