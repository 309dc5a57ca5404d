// src/reward/ against Search-R1's reward functions as make_fixtures.py restates them in Python
// (fixtures/reward.json), then a few cases by hand. Every value is compared exactly: the F1
// and the format scores are the same float64 operations in the same order on both sides.

import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { extractAnswer, extractAnswerSearchR1 } from "../../src/reward/extract.js";
import {
  formatReward,
  informationBlocks,
  isRetrievalCorrect,
  isValidResponse,
  isValidSequence,
} from "../../src/reward/format.js";
import { emCheck, f1Score, subemCheck } from "../../src/reward/metrics.js";
import { normalizeAnswer } from "../../src/reward/normalize.js";
import { type RewardConfig, scoreTrajectory } from "../../src/reward/score.js";
import { pythonSplit, pythonStrip } from "../../src/text/python-string.js";

type Golds = string[] | string;
interface Fixtures {
  prompts: Record<"search_r1" | "plain", string>;
  responses: Record<string, string>;
  normalize: { s: string; normalized: string }[];
  metrics: { prediction: string | null; golds: Golds; em: number; subem: number; f1: number }[];
  sequences: {
    name: string;
    response: string;
    answer: string | null;
    answer_search_r1: string | null;
    answer_search_r1_plain_prompt: string | null;
    valid: boolean;
    valid_sequence: boolean;
    reason: string;
  }[];
  marker: { text: string; valid: boolean; reason: string }[];
  retrieval: { text: string; golds: string[]; correct: boolean; correct_after_prompt: boolean }[];
  format_table: {
    answered: boolean;
    exact_match: boolean;
    format_valid: boolean;
    retrieval_correct: boolean;
    structure_format_score: number;
    final_format_score: number;
    retrieval_score: number;
    reward: number;
  }[];
  score: {
    configs: Record<string, RewardConfig>;
    columns: string[];
    cases: {
      response: string;
      prompt: "search_r1" | "plain";
      golds: Golds;
      expected: Record<string, [number, string | null, number, number, number, boolean | null]>;
    }[];
  };
  /** verl's search_r1_like_qa_em.compute_score: [reward, prediction, em, subem, f1]. */
  verl_search_r1_like: {
    name: string;
    response: string;
    golds: Golds;
    expected: [number, string | null, number, number, number];
  }[];
}

const fx: Fixtures = JSON.parse(
  readFileSync(new URL("./fixtures/reward.json", import.meta.url), "utf8"),
);

describe("normalizeAnswer (SQuAD / Search-R1 normalize_answer)", () => {
  it("matches Python on every fixture string", () => {
    for (const c of fx.normalize)
      expect(normalizeAnswer(c.s), JSON.stringify(c.s)).toBe(c.normalized);
  });

  it("drops ASCII punctuation only, and articles only as whole Unicode words", () => {
    expect(normalizeAnswer("The “Beijing”!")).toBe("“beijing”");
    expect(normalizeAnswer("théa a1 a² 中a, a\u0301")).toBe("théa a1 a² 中a \u0301");
  });

  it("splits and strips on Python's whitespace, not JavaScript's", () => {
    expect(pythonSplit("a\x1cb\x85c\ufeffd")).toEqual(["a", "b", "c\ufeffd"]);
    expect(pythonStrip("\u3000\x1f x \u00a0")).toBe("x");
    expect(pythonStrip("\u200bx\ufeff")).toBe("\u200bx\ufeff");
  });
});

describe("emCheck, subemCheck, f1Score", () => {
  it("match Python on every fixture case", () => {
    for (const c of fx.metrics) {
      const what = JSON.stringify([c.prediction, c.golds]);
      expect(emCheck(c.prediction, c.golds), `em ${what}`).toBe(c.em);
      expect(subemCheck(c.prediction, c.golds), `subem ${what}`).toBe(c.subem);
      expect(f1Score(c.prediction, c.golds), `f1 ${what}`).toBe(c.f1);
    }
  });

  it("read a bare gold as a list of one, and a missing answer as 0", () => {
    expect(emCheck("the Paris.", "paris")).toBe(1);
    expect(subemCheck("Paris, France", ["Lyon", "France"])).toBe(1);
    expect(f1Score("Paris France", "France")).toBeCloseTo(2 / 3, 15);
    expect([emCheck(null, "x"), subemCheck(null, "x"), f1Score(null, "x")]).toEqual([0, 0, 0]);
    expect(f1Score("", "")).toBe(0);
  });
});

describe("answer extraction", () => {
  it("matches Python on every response, alone and after the prompts", () => {
    for (const c of fx.sequences) {
      expect(extractAnswer(c.response), c.name).toBe(c.answer);
      expect(extractAnswerSearchR1(fx.prompts.search_r1 + c.response), c.name).toBe(
        c.answer_search_r1,
      );
      expect(extractAnswerSearchR1(fx.prompts.plain + c.response), c.name).toBe(
        c.answer_search_r1_plain_prompt,
      );
    }
  });

  it("keeps the original's quirk: the Search-R1 prompt alone extracts 'Beijing'", () => {
    expect(extractAnswerSearchR1(fx.prompts.search_r1)).toBe("Beijing");
    expect(extractAnswerSearchR1(`${fx.prompts.search_r1}I don't know.`)).toBe("Beijing");
    expect(extractAnswer("I don't know.")).toBeNull();
    expect(extractAnswerSearchR1("<answer>only one</answer>")).toBeNull();
    expect(extractAnswer("<answer> one </answer> <answer>\ntwo\n</answer>")).toBe("two");
  });
});

describe("format: the state machine", () => {
  it("matches is_valid_sequence on every response (named and fuzzed)", () => {
    for (const c of fx.sequences) {
      expect(isValidResponse(c.response), `${c.name}: ${c.reason}`).toBe(c.valid);
      expect(isValidSequence(fx.prompts.search_r1 + c.response), `${c.name}: ${c.reason}`).toBe(
        c.valid_sequence,
      );
    }
    const fuzzed = fx.sequences.filter((c) => c.name.startsWith("fuzz_"));
    expect(fuzzed.length).toBeGreaterThan(200);
    expect(fuzzed.filter((c) => c.valid).length).toBeGreaterThan(20);
  });

  it("matches the original's search for the first assistant marker", () => {
    for (const c of fx.marker)
      expect(isValidSequence(c.text), `${c.text}: ${c.reason}`).toBe(c.valid);
  });

  it("accepts think, search rounds, answer, with only whitespace between tags", () => {
    const round = "<search> q </search>\n\n<information>Doc 1</information>\n\n<think>b</think>\n";
    expect(isValidResponse(`<think>a</think>\n${round}${round}<answer> x </answer>\n`)).toBe(true);
    expect(isValidResponse("<think>a</think>\n<answer>x</answer><|im_end|>")).toBe(false);
    expect(isValidResponse("<think>a</think>\n<search>q</search><answer>x</answer>")).toBe(false);
    expect(isValidSequence("<think>a</think><answer>x</answer>")).toBe(false);
  });
});

describe("isRetrievalCorrect", () => {
  it("matches Python on the response and on prompt + response", () => {
    for (const c of fx.retrieval) {
      expect(isRetrievalCorrect(c.text, c.golds), c.text).toBe(c.correct);
      expect(isRetrievalCorrect(fx.prompts.search_r1 + c.text, c.golds), c.text).toBe(
        c.correct_after_prompt,
      );
    }
  });

  it("reads the prompt's own '<information> and </information>' as a block", () => {
    expect(informationBlocks(fx.prompts.search_r1)).toEqual([" and "]);
    expect(isRetrievalCorrect(fx.prompts.search_r1, "AND")).toBe(true);
    expect(isRetrievalCorrect("<information>Bei-jing</information>", "Beijing")).toBe(true);
  });
});

describe("formatReward (qa_em_format.compute_score_em's table)", () => {
  it("matches every branch for three score settings", () => {
    for (const c of fx.format_table) {
      const got = formatReward(
        {
          answered: c.answered,
          exactMatch: c.exact_match,
          formatValid: c.format_valid,
          retrievalCorrect: c.retrieval_correct,
        },
        c,
      );
      expect(got, JSON.stringify(c)).toBe(c.reward);
    }
  });

  it("gives Search-R1's values with its scripts' scores", () => {
    const s = { structure_format_score: 0.2, final_format_score: 0.1, retrieval_score: 0 };
    const r = (answered: boolean, exactMatch: boolean, formatValid: boolean) =>
      formatReward({ answered, exactMatch, formatValid, retrievalCorrect: true }, s);
    expect([r(true, true, true), r(true, true, false)]).toEqual([1, 0.8]);
    expect([r(true, false, true), r(true, false, false)]).toEqual([0.2, 0.1]);
    expect([r(false, false, true), r(false, false, false)]).toEqual([0.2, 0]);
  });
});

describe("scoreTrajectory", () => {
  it("matches the original (search_r1_extract) and our default mode on every case", () => {
    const { configs, columns, cases } = fx.score;
    expect(columns).toEqual(["reward", "prediction", "em", "subem", "f1", "format_valid"]);
    let n = 0;
    for (const c of cases) {
      const input = {
        promptText: fx.prompts[c.prompt],
        responseText: fx.responses[c.response] as string,
        golds: c.golds,
      };
      for (const [name, expected] of Object.entries(c.expected)) {
        const r = scoreTrajectory(input, configs[name] as RewardConfig);
        const got = [r.reward, r.prediction, r.em, r.subem, r.f1, r.formatValid];
        expect(got, `${c.response} / ${c.prompt} / ${JSON.stringify(c.golds)} / ${name}`).toEqual(
          expected,
        );
        n++;
      }
    }
    expect(n).toBeGreaterThan(1000);
  });

  const base: RewardConfig = {
    format_reward: false,
    structure_format_score: 0.2,
    final_format_score: 0.1,
    retrieval_score: 0,
    search_r1_extract: false,
  };
  const silent = { promptText: fx.prompts.search_r1, responseText: "Hmm.", golds: ["Paris"] };

  it("scores a silent trajectory 0 by default and 0.1 the original way with format reward", () => {
    expect(scoreTrajectory(silent, { ...base, format_reward: true })).toEqual({
      reward: 0,
      prediction: null,
      em: 0,
      subem: 0,
      f1: 0,
      formatValid: false,
    });
    const original = scoreTrajectory(silent, {
      ...base,
      format_reward: true,
      search_r1_extract: true,
    });
    expect([original.reward, original.prediction]).toEqual([0.1, "Beijing"]);
  });

  it("is plain EM without the format reward, with subem and f1 beside it", () => {
    const r = scoreTrajectory(
      { promptText: "", responseText: "<answer>Paris, France</answer>", golds: ["Paris"] },
      base,
    );
    expect(r).toEqual({
      reward: 0,
      prediction: "Paris, France",
      em: 0,
      subem: 1,
      f1: 2 / 3,
      formatValid: null,
    });
  });
});

describe("scoreTrajectory, verl_search_r1_like (the Hermes format's scorer)", () => {
  // Format reward and Search-R1's extraction are refused with the Hermes format
  // (src/agent/session.ts); the scorer reads neither.
  const off: RewardConfig = {
    format_reward: false,
    structure_format_score: 0,
    final_format_score: 0,
    retrieval_score: 0,
    search_r1_extract: false,
  };

  it("matches verl's compute_score on every case, the quarter for answer-tag spam included", () => {
    const cases = fx.verl_search_r1_like;
    expect(cases.length).toBeGreaterThan(100);
    for (const c of cases) {
      // The prompt never counts: verl scores the decoded response alone.
      const r = scoreTrajectory(
        { promptText: fx.prompts.search_r1, responseText: c.response, golds: c.golds },
        off,
        "verl_search_r1_like",
      );
      expect(
        [r.reward, r.prediction, r.em, r.subem, r.f1],
        `${c.name} ${JSON.stringify(c.golds)}`,
      ).toEqual(c.expected);
      expect(r.formatValid).toBeNull();
    }
    const spam = cases.filter((c) => c.expected[0] === 0.25).map((c) => c.name);
    expect(new Set(spam)).toEqual(new Set(["spam_open", "spam_close"]));
  });

  it("differs from the default scorer exactly on the spam", () => {
    const c = fx.verl_search_r1_like.find((x) => x.name === "spam_close");
    const input = { promptText: "", responseText: c?.response ?? "", golds: ["Paris"] };
    expect(scoreTrajectory(input, off).reward).toBe(1);
    expect(scoreTrajectory(input, off, "verl_search_r1_like").reward).toBe(0.25);
  });
});
