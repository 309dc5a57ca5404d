import { describe, expect, it } from "vitest";
import {
  Analyzer,
  DEFAULT_ANALYZER,
  LUCENE_STOPWORDS,
  stripPossessive,
  tokenize,
} from "../../src/retrieval/analyzer.js";

const analyze = (text: string) => new Analyzer().analyze(text);

describe("tokenize (UAX #29 words)", () => {
  it.each([
    ["wi-fi e-mail", ["wi", "fi", "e", "mail"]],
    ["U.S.A. x.y.z. I.B.M.", ["U.S.A", "x.y.z", "I.B.M"]],
    ["3.14 1,000,000 a,b 1.a", ["3.14", "1,000,000", "a", "b", "1", "a"]],
    ["can't John's rock'n'roll", ["can't", "John's", "rock'n'roll"]],
    ["foo_bar __ _x", ["foo_bar", "_x"]],
    ["abc123 3rd x86_64", ["abc123", "3rd", "x86_64"]],
    ["@user #tag (paren) [br] {x}", ["user", "tag", "paren", "br", "x"]],
    ["“quoted” ‘single’ it’s", ["quoted", "single", "it’s"]],
    ["trailing. dots... end.", ["trailing", "dots", "end"]],
    ["日本語の文章", ["日", "本", "語", "の", "文", "章"]],
    ["カタカナ ひらがな", ["カタカナ", "ひ", "ら", "が", "な"]],
    ["Ångström naïve Москва Σίσυφος", ["Ångström", "naïve", "Москва", "Σίσυφος"]],
    ["e\u0301cole", ["e\u0301cole"]],
    ["😀 smile 𝔘nicode", ["smile", "𝔘nicode"]],
    ["", []],
  ])("%j", (text, expected) => {
    expect(tokenize(text)).toEqual(expected);
  });

  it("agrees with ICU's word segmentation (Intl.Segmenter) on alphabetic text", () => {
    const text =
      "The 2018 FIFA World Cup: France won 4–2 over Croatia, in Moscow's Luzhniki " +
      "Stadium (capacity 78,011). Mbappé, 19, scored; e.g. U.S. viewers: 11.8 million. " +
      "Don't stop—it's rock'n'roll! Über naïve café déjà-vu, 3.14159 and 1,000.5 items.";
    const icu = [...new Intl.Segmenter("en", { granularity: "word" }).segment(text)]
      .filter((s) => s.isWordLike)
      .map((s) => s.segment);
    expect(tokenize(text)).toEqual(icu);
  });
});

describe("analyzer (Pyserini's DefaultEnglishAnalyzer)", () => {
  it("uses Lucene's 33 English stop words", () => {
    expect(LUCENE_STOPWORDS).toHaveLength(33);
    expect(analyze(LUCENE_STOPWORDS.join(" "))).toEqual([]);
    expect(analyze("The AND Is")).toEqual([]);
  });

  it("strips possessives before lower-casing, in all of Lucene's apostrophes", () => {
    expect(stripPossessive("John's")).toBe("John");
    expect(stripPossessive("CAT’S")).toBe("CAT");
    expect(stripPossessive("ｘ＇s")).toBe("ｘ");
    expect(stripPossessive("'s")).toBe("");
    expect(stripPossessive("boss")).toBe("boss");
    expect(analyze("Paul Walker's car, THE CAT’S toys, it's")).toEqual([
      "paul",
      "walker",
      "car",
      "cat",
      "toi",
    ]);
  });

  it("stems with Porter (the examples of Porter's 1980 paper)", () => {
    const pairs: [string, string][] = [
      ["caresses", "caress"],
      ["ponies", "poni"],
      ["ties", "ti"],
      ["cats", "cat"],
      ["agreed", "agre"],
      ["plastered", "plaster"],
      ["motoring", "motor"],
      ["conflated", "conflat"],
      ["hopping", "hop"],
      ["filing", "file"],
      ["happy", "happi"],
      ["relational", "relat"],
      ["conditional", "condit"],
      ["digitizer", "digit"],
      ["vietnamization", "vietnam"],
      ["hopefulness", "hope"],
      ["sensibiliti", "sensibl"],
      ["generalizations", "gener"],
    ];
    for (const [word, stem] of pairs) expect(analyze(word), word).toEqual([stem]);
  });

  it("keeps numbers, dotted abbreviations and non-Latin words as terms", () => {
    expect(analyze("Über 2018 FIFA World Cup: France won 4–2")).toEqual([
      "über",
      "2018",
      "fifa",
      "world",
      "cup",
      "franc",
      "won",
      "4",
      "2",
    ]);
    expect(analyze("I.B.M. 1,234.56 Москва")).toEqual(["i.b.m", "1,234.56", "москва"]);
  });

  it("can keep stop words and skip stemming", () => {
    const plain = new Analyzer({ ...DEFAULT_ANALYZER, stopwords: [], stem: false });
    expect(plain.analyze("The running dogs")).toEqual(["the", "running", "dogs"]);
  });

  it("gives the same terms for the same token, memoised or not", () => {
    const a = new Analyzer();
    const text = "Running runs RUNNING runner's";
    expect(a.analyze(text)).toEqual(a.analyze(text));
    expect(a.analyze(text)).toEqual(["run", "run", "run", "runner"]);
  });
});
