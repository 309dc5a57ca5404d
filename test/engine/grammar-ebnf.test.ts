/**
 * EBNF grammars (GBNF-style, as xgrammar and llama.cpp read them) compiled into the engine's
 * grammars (src/engine/grammar/ebnf.ts), checked with the second recognizer
 * (test/helpers/grammar-match.ts): each grammar's sentences match, other texts do not; a
 * grammar written as a regular expression's equivalent accepts what RegExp accepts; and what
 * the engine cannot expand is refused naming the rule.
 */
import { describe, expect, it } from "vitest";
import { ebnfGrammar } from "../../src/engine/grammar/ebnf.js";
import { grammarMatches } from "../helpers/grammar-match.js";
import { badRequestOf } from "../helpers/usage-error.js";

function check(text: string, valid: string[], invalid: string[]) {
  const g = ebnfGrammar(text, "ebnf");
  for (const s of valid) expect(grammarMatches(g, s), JSON.stringify(s)).toBe(true);
  for (const s of invalid) expect(grammarMatches(g, s), JSON.stringify(s)).toBe(false);
}

describe("EBNF → grammar", () => {
  it("rules in any order, referring to each other; alternation, groups, quantifiers", () => {
    check(
      `
      # a list of answers
      root   ::= answer ("," ws answer)*
      answer ::= "yes" | "no" | number
      number ::= [1-9] [0-9]{0,2} | "0"
      ws     ::= [ \\t]*
      `,
      ["yes", "no", "0", "42", "999", "yes,no", "yes, 17,\tno", "1,2,3"],
      ["", "maybe", "1000", "01", "yes,", ",yes", "yes no"],
    );
  });

  it("recursion (nested lists), strings with escapes, single quotes, negated classes", () => {
    check(
      String.raw`
      root  ::= value
      value ::= list | str
      list  ::= "[" (value ("," value)*)? "]"
      str   ::= '"' ([^"\\] | "\\" ["\\n])* '"'
      `,
      ['"a"', "[]", '["a",[],["b\\"c"]]', '""', '"x\\\\y"', '"é"'],
      ["[", '["a",]', '"a', "[[]", '"\\q"'],
    );
    check(`root ::= "a\\x62\\u0063\\n"`, ["abc\n"], ["abc"]);
    check(`root ::= ("ab"){2} "c"? [\\d]+`, ["abab1", "ababc23"], ["ab1", "abababc1", "ababc"]);
    // (x?)? is x?: an optional part that can match nothing at most once.
    check(`root ::= ("a"?)? "b"`, ["b", "ab"], ["aab"]);
  });

  it("the same language as a regular expression, on many texts", () => {
    const g = ebnfGrammar(`root ::= [a-z]+ "@" [a-z]+ ("." [a-z]{2,3})+`, "ebnf");
    const re = /^[a-z]+@[a-z]+(\.[a-z]{2,3})+$/;
    for (const s of [
      "a@b.co",
      "me@x.org.uk",
      "@b.co",
      "a@b",
      "a@b.c",
      "a@b.comm",
      "A@b.co",
      "a@b.co.",
    ]) {
      expect(grammarMatches(g, s), s).toBe(re.test(s));
    }
  });

  it("refuses what the engine cannot expand, naming the rule or the position", () => {
    const refused = (text: string, message: RegExp) =>
      expect(
        badRequestOf(() => ebnfGrammar(text, "sampling_params.ebnf")),
        String(text),
      ).toMatch(message);
    refused(`start ::= "a"`, /"sampling_params\.ebnf": no rule "root"/);
    refused(`root ::= a\na ::= "x"\na ::= "y"`, /the rule "a" is defined twice/);
    refused(`root ::= item`, /the rule "root" refers to "item", which is not defined/);
    refused(`root ::= expr\nexpr ::= expr "+" "1" | "1"`, /the rule "expr" is left-recursive/);
    refused(`root ::= a "x"\na ::= "y"? root`, /the rule "root" is left-recursive/);
    refused(`root ::= ("a"?)*`, /in the rule "root", a repeated part can match nothing/);
    refused(`root ::= "abc`, /an unclosed string/);
    refused(`root ::= ("a"`, /an unclosed group/);
    refused(`root "a"`, /expected "::=" after "root"/);
    refused(`root ::= "a" )`, /unexpected "\)"/);
    refused(`root ::= "\\d"`, /a class escape in a string/);
    refused(`root ::= "a"{3,1}`, /\{3,1\} has its bounds the wrong way round/);
  });
});
