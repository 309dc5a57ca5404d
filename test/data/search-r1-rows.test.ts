import { describe, expect, it } from "vitest";
import { buildVerlRow, normalizeQuestion, type RowContext } from "../../src/data/search-r1-rows.js";

const ctx: RowContext = {
  dataSource: "nq",
  split: "test",
  index: 7,
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

  it("builds the verl row, keeping the original question and stringifying numeric ids", () => {
    expect(
      buildVerlRow({ id: 12, question: " why ", golden_answers: ["a", "b"], extra: 1 }, ctx),
    ).toEqual({
      row: {
        id: "12",
        question: " why ",
        golden_answers: ["a", "b"],
        data_source: "nq",
        prompt: [{ role: "user", content: "Q: why?\n" }],
        ability: "fact-reasoning",
        reward_model: { style: "rule", ground_truth: { target: ["a", "b"] } },
        extra_info: { split: "test", index: 7, uid: "nq-test-7" },
      },
    });
    const noId = buildVerlRow({ question: "q", golden_answers: ["a"] }, ctx);
    expect("row" in noId && noId.row.id).toBeNull();
    const bigId = buildVerlRow({ id: 2n ** 40n, question: "q", golden_answers: ["a"] }, ctx);
    expect("row" in bigId && bigId.row.id).toBe("1099511627776");
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
    expect(buildVerlRow(value, ctx)).toEqual({ invalid: reason });
  });
});
