// The layout conversion on its own: rows of different lengths into [B, T] tensors aligned as
// the trainer's log-probs, and back.
import { describe, expect, it } from "vitest";
import type { NamedTensor } from "../../src/tensors/safetensors.js";
import { batchTensors, layoutOf, responseRows, type Sequence } from "../../src/trainer/batch.js";
import { get } from "../native/helpers.js";

const values = (t: Map<string, NamedTensor>, name: string) => Array.from(get(t, name).data, Number);

const SEQS: Sequence[] = [
  { promptIds: [5, 6], responseIds: [7, 8, 9] },
  { promptIds: [10, 11, 12], responseIds: [13] },
  { promptIds: [14], responseIds: [] },
];

describe("trainer batch layout", () => {
  it("puts response token j of row i at P_i + j, right-padded, zeros elsewhere", () => {
    const t = new Map(
      batchTensors(SEQS, {
        response_mask: [[1, 0, 1], [1], []],
        advantages: [Float64Array.of(0.5, -1, 2), [3], []],
      }).map((x) => [x.name, x]),
    );
    expect([...t.keys()]).toEqual(["input_ids", "attention_mask", "response_mask", "advantages"]);
    expect(get(t, "input_ids").dtype).toBe("I32");
    expect(get(t, "input_ids").shape).toEqual([3, 5]);
    expect(values(t, "input_ids")).toEqual([
      ...[5, 6, 7, 8, 9],
      ...[10, 11, 12, 13, 0],
      ...[14, 0, 0, 0, 0],
    ]);
    expect(get(t, "attention_mask").dtype).toBe("U8");
    expect(values(t, "attention_mask")).toEqual([
      ...[1, 1, 1, 1, 1],
      ...[1, 1, 1, 1, 0],
      ...[1, 0, 0, 0, 0],
    ]);
    expect(get(t, "response_mask").dtype).toBe("F32");
    expect(values(t, "response_mask")).toEqual([
      ...[0, 0, 1, 0, 1],
      ...[0, 0, 0, 1, 0],
      ...[0, 0, 0, 0, 0],
    ]);
    expect(values(t, "advantages")).toEqual([
      ...[0, 0, 0.5, -1, 2],
      ...[0, 0, 0, 3, 0],
      ...[0, 0, 0, 0, 0],
    ]);
  });

  it("reads [B, T] outputs back as response-aligned rows", () => {
    const data = Float32Array.from({ length: 15 }, (_, i) => i);
    const rows = responseRows("log_probs", { dtype: "F32", shape: [3, 5], data }, SEQS);
    expect(rows.map((r) => [...r])).toEqual([[2, 3, 4], [8], []]);
    rows[0]?.fill(-1); // a copy: the caller may keep or change it
    expect(data[2]).toBe(2);
    expect(() => responseRows("x", { dtype: "F32", shape: [3, 4], data }, SEQS)).toThrow(
      "x: shape [3, 4], expected [3, 5]",
    );
  });

  it("refuses rows that do not match the responses, and sequences without a prompt", () => {
    expect(() => batchTensors(SEQS, { returns: [[1, 2], [1], []] })).toThrow(
      "returns[0]: 2 values for 3 response tokens",
    );
    expect(() => batchTensors(SEQS, { values: [[1, 2, 3]] })).toThrow("values: 1 rows for 3");
    expect(() => layoutOf([{ promptIds: [], responseIds: [1] }])).toThrow(
      "sequence 0 has no prompt",
    );
    expect(() => layoutOf([])).toThrow("at least one sequence");
  });
});
