import { stemmer } from "stemmer";

/**
 * The English analyzer of Pyserini/Anserini's default BM25 index (DefaultEnglishAnalyzer):
 * Unicode word tokenisation (UAX #29), possessive 's removal, lower case, Lucene's 33
 * English stop words, Porter stemming. Where this differs from Lucene is listed in the
 * manual (docs/commands/build-index.md, "Differences from Lucene's scores").
 */

// biome-ignore format: one list, as Lucene prints it
export const LUCENE_STOPWORDS: readonly string[] = [
  "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is",
  "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there",
  "these", "they", "this", "to", "was", "will", "with",
];

export interface AnalyzerOptions {
  stopwords: readonly string[];
  stem: boolean;
}

export const DEFAULT_ANALYZER: AnalyzerOptions = { stopwords: LUCENE_STOPWORDS, stem: true };

// UAX #29 word-break classes, reduced to what decides English-like tokens.
const OTHER = 0;
const LETTER = 1; // ALetter, Hebrew_Letter, Katakana, Extend, Format (marks stay in their word)
const DIGIT = 2; // Numeric
const CONNECT = 3; // ExtendNumLet ("_"): joins letters and digits
const MID_LETTER = 4; // between two letters only: ":" "·"
const MID_NUM_LET = 5; // between two letters or two digits: "." "'" "’"
const MID_NUM = 6; // between two digits only: "," ";"
const SINGLE = 7; // Han ideographs and Hiragana: one token per character, as Lucene emits them

const MID_LETTER_CHARS = ":\u00b7\u0387\u05f4\u2027\ufe13\ufe55\uff1a";
const MID_NUM_LET_CHARS = ".'\u2018\u2019\u2024\ufe52\uff07\uff0e";
const MID_NUM_CHARS =
  ",;\u037e\u0589\u060c\u060d\u066c\u07f8\u2044\ufe10\ufe14\ufe50\ufe54\uff0c\uff1b";

function classify(cp: number): number {
  const ch = String.fromCodePoint(cp);
  if (MID_LETTER_CHARS.includes(ch)) return MID_LETTER;
  if (MID_NUM_LET_CHARS.includes(ch)) return MID_NUM_LET;
  if (MID_NUM_CHARS.includes(ch)) return MID_NUM;
  if (/[\p{Script=Han}\p{Script=Hiragana}]/u.test(ch) && /\p{L}/u.test(ch)) return SINGLE;
  if (/\p{Nd}/u.test(ch)) return DIGIT;
  if (/\p{Pc}/u.test(ch)) return CONNECT;
  if (/[\p{Alphabetic}\p{M}\p{Cf}]/u.test(ch) && !/\p{Cc}/u.test(ch)) return LETTER;
  return OTHER;
}

/** Classes of the Basic Multilingual Plane, computed once (64 KiB). */
const BMP = new Uint8Array(0x10000);
for (let cp = 0; cp < 0x10000; cp++) {
  if (cp >= 0xd800 && cp <= 0xdfff) continue; // surrogates: looked up as code points
  BMP[cp] = classify(cp);
}
const astral = new Map<number, number>();
function classOf(cp: number): number {
  if (cp < 0x10000) return BMP[cp] as number;
  let c = astral.get(cp);
  if (c === undefined) {
    c = classify(cp);
    astral.set(cp, c);
  }
  return c;
}

/**
 * Splits text into word tokens with UAX #29 rules: letters and digits join, "." "'" "’"
 * join two letters or two digits ("U.S.A", "can't", "3.14"), "," ";" join digits
 * ("1,000"), ":" joins letters, "_" joins anything; ideographs are single tokens.
 * Tokens with no letter or digit ("__") are dropped, as Lucene's StandardTokenizer does.
 */
export function tokenize(text: string, out: string[] = []): string[] {
  const n = text.length;
  let i = 0;
  while (i < n) {
    let cp = text.charCodeAt(i);
    if (cp >= 0xd800 && cp <= 0xdbff) cp = text.codePointAt(i) as number;
    const cls = classOf(cp);
    const width = cp > 0xffff ? 2 : 1;
    if (cls === SINGLE) {
      out.push(text.slice(i, i + width));
      i += width;
      continue;
    }
    if (cls !== LETTER && cls !== DIGIT && cls !== CONNECT) {
      i += width;
      continue;
    }
    const start = i;
    let last = cls; // class of the last letter, digit or connector taken
    let wordy = cls !== CONNECT;
    i += width;
    while (i < n) {
      let c = text.charCodeAt(i);
      if (c >= 0xd800 && c <= 0xdbff) c = text.codePointAt(i) as number;
      const k = classOf(c);
      const w = c > 0xffff ? 2 : 1;
      if (k === LETTER || k === DIGIT || k === CONNECT) {
        if (k !== CONNECT) wordy = true;
        last = k;
        i += w;
        continue;
      }
      if (k !== MID_LETTER && k !== MID_NUM_LET && k !== MID_NUM) break;
      if (i + w >= n) break;
      let d = text.charCodeAt(i + w);
      if (d >= 0xd800 && d <= 0xdbff) d = text.codePointAt(i + w) as number;
      const next = classOf(d);
      const joinsLetters = last === LETTER && next === LETTER && k !== MID_NUM;
      const joinsDigits = last === DIGIT && next === DIGIT && k !== MID_LETTER;
      if (!joinsLetters && !joinsDigits) break;
      i += w;
    }
    if (wordy) out.push(text.slice(start, i));
  }
  return out;
}

/** Lucene's EnglishPossessiveFilter: a trailing 's, ’s or ＇s (either case of s) is removed. */
export function stripPossessive(token: string): string {
  const n = token.length;
  if (n < 2) return token;
  const s = token.charCodeAt(n - 1);
  const q = token.charCodeAt(n - 2);
  if ((s === 0x73 || s === 0x53) && (q === 0x27 || q === 0x2019 || q === 0xff07)) {
    return token.slice(0, n - 2);
  }
  return token;
}

/**
 * Turns text into index terms, memoising per distinct token (vocabularies are Zipfian,
 * so the stemmer runs once per distinct word, not once per occurrence).
 */
export class Analyzer {
  private readonly stop: Set<string>;
  private readonly memo = new Map<string, string | null>();
  private readonly scratch: string[] = [];

  constructor(readonly options: AnalyzerOptions = DEFAULT_ANALYZER) {
    this.stop = new Set(options.stopwords);
  }

  /** The term of one token, or null when it is a stop word (or vanishes). */
  term(token: string): string | null {
    let t = this.memo.get(token);
    if (t !== undefined) return t;
    const lower = stripPossessive(token).toLowerCase();
    if (lower.length === 0 || this.stop.has(lower)) t = null;
    else t = this.options.stem ? stemmer(lower) : lower;
    if (this.memo.size >= 1 << 20) this.memo.clear();
    this.memo.set(token, t);
    return t;
  }

  /**
   * Word tokens of a text, lower-cased as a whole first: one native call instead of one per
   * token, and the memo holds one entry per word rather than one per capitalisation.
   */
  tokens(text: string, out: string[] = []): string[] {
    return tokenize(text.toLowerCase(), out);
  }

  /** Terms of a text in order, stop words removed. */
  analyze(text: string, out: string[] = []): string[] {
    const tokens = this.tokens(text, this.scratch);
    for (const token of tokens) {
      const t = this.term(token);
      if (t !== null) out.push(t);
    }
    tokens.length = 0;
    return out;
  }
}
