import { describe, expect, it } from "vitest";
import {
  checkRecord,
  normalizeQuestion,
  type RowContext,
  SEARCH_R1_ROWS,
} from "../../src/data/search-r1-rows.js";
import { VERL_TOOL_ROWS } from "../../src/data/verl-tool-rows.js";

const build = (value: unknown, c: RowContext) => {
  const r = checkRecord(value);
  if (!("record" in r)) throw new Error(r.invalid);
  return SEARCH_R1_ROWS.build(r.record, c);
};

const ctx: RowContext = {
  dataSource: "nq",
  split: "test",
  index: 7,
  row: 3,
  template: { name: "t", file: "t.txt", text: "Q: {question}\n" },
};

describe("Search-R1 rows", () => {
  it("normalises questions as Search-R1 does: strip, then end with ?", () => {
    expect(normalizeQuestion("  who wrote it \n")).toBe("who wrote it?");
    expect(normalizeQuestion("\twho wrote it?  ")).toBe("who wrote it?");
    expect(normalizeQuestion("what? no")).toBe("what? no?");
    expect(normalizeQuestion("Who wrote « Les Misérables » — in 1862")).toBe(
      "Who wrote « Les Misérables » — in 1862?",
    );
  });

  it("builds Search-R1's row, the question column normalised, numeric ids as strings", () => {
    expect(build({ id: 12, question: " why ", golden_answers: ["a", "b"], extra: 1 }, ctx)).toEqual(
      {
        id: "12",
        question: "why?",
        golden_answers: ["a", "b"],
        data_source: "nq",
        prompt: [{ role: "user", content: "Q: why?\n" }],
        ability: "fact-reasoning",
        reward_model: { style: "rule", ground_truth: { target: ["a", "b"] } },
        extra_info: { split: "test", index: 7, uid: "nq-test-7" },
      },
    );
    expect(build({ question: "q", golden_answers: ["a"] }, ctx).id).toBeNull();
    expect(build({ id: 2n ** 40n, question: "q", golden_answers: ["a"] }, ctx).id).toBe(
      "1099511627776",
    );
  });

  it("builds verl's tool-call row: system message, searchR1_ source, index in the file", () => {
    const r = checkRecord({ id: "x", question: " why ", golden_answers: ["a"] });
    if (!("record" in r)) throw new Error(r.invalid);
    const gt = { target: ["a"] };
    expect(VERL_TOOL_ROWS.build(r.record, ctx)).toEqual({
      data_source: "searchR1_nq",
      prompt: [
        { role: "system", content: "You are a helpful and harmless assistant." },
        { role: "user", content: "Q: why?\n" },
      ],
      ability: "fact-reasoning",
      reward_model: { style: "rule", ground_truth: gt },
      extra_info: {
        index: 3,
        need_tools_kwargs: true,
        question: "why?",
        split: "test",
        tools_kwargs: {
          search: {
            create_kwargs: { ground_truth: gt, question: "why?", data_source: "searchR1_nq" },
          },
        },
      },
      metadata: null,
    });
  });

  it.each([
    ["a JSON array", [1], "record is not a JSON object"],
    ["a JSON string", "q", "record is not a JSON object"],
    ["null", null, "record is not a JSON object"],
    ["no question", { golden_answers: ["a"] }, "question is missing"],
    ["a numeric question", { question: 5, golden_answers: ["a"] }, "question is not a string"],
    ["a blank question", { question: " \t", golden_answers: ["a"] }, "question is empty"],
    ["no golden_answers", { question: "q" }, "golden_answers is missing"],
    ["a string answer", { question: "q", golden_answers: "a" }, "golden_answers is not a list"],
    ["no answers", { question: "q", golden_answers: [] }, "golden_answers is empty"],
    [
      "a numeric answer",
      { question: "q", golden_answers: ["a", 1] },
      "golden_answers contains a non-string",
    ],
    [
      "an object id",
      { id: {}, question: "q", golden_answers: ["a"] },
      "id is not a string or number",
    ],
  ])("rejects %s", (_, value, reason) => {
    expect(checkRecord(value)).toEqual({ invalid: reason });
  });
});
