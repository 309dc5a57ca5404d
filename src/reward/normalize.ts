// SQuAD's normalize_answer, which Search-R1 copies into qa_em.py and qa_em_format.py
// (search-r1.md §6), with the Python string semantics it relies on made explicit: EM against
// the original needs the same answer strings, not merely similar ones.

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

/** string.punctuation: the 32 ASCII punctuation characters; “ ” 。 ¿ — and the like stay. */
const ASCII_PUNCTUATION = /[!-/:-@[-`{-~]/g;

/**
 * re.sub(r"\b(a|an|the)\b", " ", s) on a str: Python's \b is Unicode-aware, its word characters
 * being letters, numbers (any N category) and "_". JavaScript's \b is ASCII-only even with the u
 * flag, so the boundaries are spelled out: "théa", "a1", "a²" and "中a" keep their "a", while an
 * "a" before a combining accent (not a word character in Python either) goes.
 */
const ARTICLE = /(?<![\p{L}\p{N}_])(?:a|an|the)(?![\p{L}\p{N}_])/gu;

/**
 * lower → drop ASCII punctuation → articles to " " → " ".join(split()). toLowerCase agrees with
 * Python's str.lower() on every character both Unicode databases know (checked over all code
 * points: full mappings such as İ → i̇, and the final sigma).
 */
export function normalizeAnswer(s: string): string {
  const lowered = s.toLowerCase();
  const unpunctuated = lowered.replace(ASCII_PUNCTUATION, "");
  const noArticles = unpunctuated.replace(ARTICLE, " ");
  return pythonSplit(noArticles).join(" ");
}
