/**
 * Regular expressions compiled into the engine's grammars (src/engine/grammar/regex.ts),
 * checked with the second recognizer (test/helpers/grammar-match.ts) against JavaScript's
 * own RegExp as the oracle: for every pattern and every text, the grammar matches exactly
 * when `^(?:pattern)$` does (the texts avoid where Python's `re`, whose syntax the compiler
 * reads, and JavaScript differ: `\r` and U+2028 for `.`, Unicode spaces for `\s`).
 */
import { describe, expect, it } from "vitest";
import { regexGrammar } from "../../src/engine/grammar/regex.js";
import { grammarMatches } from "../helpers/grammar-match.js";
import { badRequestOf } from "../helpers/usage-error.js";

const TEXTS = [
  "",
  "a",
  "ab",
  "abc",
  "aaa",
  "b",
  "yes",
  "no",
  "maybe",
  "123-4567",
  "12-34567",
  "1234567",
  "a1_Z",
  "hello world",
  "hello  world",
  "x.y",
  "x y",
  "é",
  "né",
  "日本",
  "😀",
  "a\nb",
  "{}",
  "[1,2]",
  "2026-11-29",
  "ab-ab",
  "-",
  "]",
  "a-z",
];

const CASES: string[] = [
  "abc",
  "a*",
  "a+b?",
  "(yes|no|maybe)",
  "\\d{3}-\\d{4}",
  "[a-z]+",
  "[A-Za-z0-9_]+",
  "\\w+",
  "\\W",
  "\\D+",
  "hello\\s+world",
  "x.y",
  ".",
  ".+",
  "[^a-z]+",
  "[^\\d-]",
  "né|日本",
  "[é日]",
  "\\{\\}|\\[\\d(,\\d)*\\]",
  "\\d{4}-\\d{2}-\\d{2}",
  "(ab|a)(-ab)?",
  "(a?)?b",
  "(?:ab){1,2}|a{2,}",
  "[-a]|\\]",
  "a-z",
  "(?P<word>[a-c]+)",
  "^abc$",
  "a*?b??",
  "\\x61\\u0062c",
  "[\\w-]+",
  "",
];

const js = (pattern: string) =>
  new RegExp(`^(?:${pattern.replace(/\(\?P</g, "(?<").replace(/^\^|\$$/g, "")})$`, "u");

describe("regex → grammar: the texts it matches are RegExp's", () => {
  it.each(CASES)("%s", (pattern) => {
    const g = regexGrammar(pattern, "regex");
    const oracle = js(pattern);
    for (const text of TEXTS) {
      expect(grammarMatches(g, text), `${JSON.stringify(pattern)} on ${JSON.stringify(text)}`).toBe(
        oracle.test(text),
      );
    }
  });

  it("refuses what a grammar cannot hold, naming the field and the position", () => {
    const refused = (pattern: string, message: RegExp) =>
      expect(
        badRequestOf(() => regexGrammar(pattern, "sampling_params.regex")),
        String(pattern),
      ).toMatch(message);
    refused("(a)\\1", /"sampling_params\.regex": the escape \\1 is not supported at position 3/);
    refused("a(?=b)", /lookarounds, flags and backreferences are not supported/);
    refused("(?i)a", /lookarounds, flags and backreferences are not supported/);
    refused("(a*)*", /a repeated part that can match nothing/);
    refused("a**", /a quantifier on a quantifier/);
    refused("[^é]", /a negated class with a non-ASCII character/);
    refused("[a-é]", /a range beyond ASCII/);
    refused("a{3,1}", /\{3,1\} has its bounds the wrong way round/);
    refused("a^b", /the anchor \^ only at the pattern's ends/);
    refused("(ab", /an unclosed group/);
    refused("[ab", /an unclosed class/);
    refused("*a", /nothing to repeat/);
    refused("a)", /unexpected "\)"/);
  });
});
