// src/rl/rollout-correction.ts against verl's formulas restated in PyTorch float64 by
// make_offpolicy_fixtures.py (fixtures/rollout-correction.json): IS weights at token and
// sequence level (truncation, batch normalisation, exp(±20) bound), every rejection option,
// two options at once, IS with RS, and the off-policy metrics, on a batch with a hole in a
// row, a row with no token, a row of one token and a row far enough off to pass the bound.
//
// Tolerance: the same float64 formulas summed in another order (measured under 1e-14
// relative); allowed 1e-10 relative + 1e-12, far below what the cases tell apart (a weight
// truncated or not, a token kept or rejected, a mean over tokens vs rows: order 1e-2 or more).

import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import {
  computeOffpolicyMetrics,
  computeRolloutCorrectionWeights,
  computeRolloutRejectionMask,
  parseRolloutRs,
  type RolloutIsLevel,
  rolloutCorrection,
} from "../../src/rl/rollout-correction.js";

type M = number[][];
interface Case {
  name: string;
  rollout_is?: RolloutIsLevel;
  rollout_is_threshold?: number;
  batch_normalize?: boolean;
  rollout_rs?: string;
  rollout_rs_threshold?: string | number;
  weights: M | null;
  mask: M;
  metrics: Record<string, number>;
}
const fx = JSON.parse(
  readFileSync(new URL("./fixtures/rollout-correction.json", import.meta.url), "utf8"),
) as { inputs: { old: M; rollout: M; mask: M }; cases: Case[] };
const { old, rollout, mask } = fx.inputs;

function close(actual: number, expected: number, what: string): void {
  const err = Math.abs(actual - expected);
  if (!(err <= 1e-10 * Math.abs(expected) + 1e-12)) {
    throw new Error(`${what}: got ${actual}, expected ${expected}`);
  }
}

function rowsClose(actual: ArrayLike<number>[], expected: M, what: string): void {
  expect(actual.length, what).toBe(expected.length);
  expected.forEach((row, b) => {
    row.forEach((e, t) => {
      close((actual[b] as ArrayLike<number>)[t] as number, e, `${what}[${b}][${t}]`);
    });
  });
}

const logRatio = old.map((row, b) => row.map((x, t) => x - (rollout[b]?.[t] as number)));

describe("rollout correction against verl's formulas", () => {
  it("has the cases the fixtures promise", () => {
    expect(fx.cases.length).toBe(19);
  });

  it.each(fx.cases.map((c) => [c.name, c] as const))("%s", (_, c) => {
    const got = rolloutCorrection(old, rollout, mask, {
      rolloutIs: c.rollout_is ?? null,
      rolloutIsThreshold: c.rollout_is_threshold ?? 2,
      rolloutIsBatchNormalize: c.batch_normalize ?? false,
      rejection: c.rollout_rs ? parseRolloutRs(c.rollout_rs, c.rollout_rs_threshold ?? null) : [],
    });
    expect(Object.keys(got.metrics).sort()).toEqual(Object.keys(c.metrics).sort());
    for (const [k, v] of Object.entries(c.metrics)) close(got.metrics[k] as number, v, k);
    // verl's weights are 0 off the mask; rolloutCorrection's are 1 there (no correction).
    const wantWeights = (c.weights ?? mask.map((r) => r.map(() => 1))).map((row, b) =>
      row.map((w, t) => (mask[b]?.[t] === 0 ? 1 : w)),
    );
    rowsClose(got.weights, wantWeights, "weights");
    // verl's modified mask is mask·keep; keep is 1 off the mask.
    const keptMask = got.keep.map((row, b) => row.map((k, t) => k * (mask[b]?.[t] as number)));
    rowsClose(keptMask, c.mask, "mask");
  });

  it("the pieces alone give verl's weights and masks (0 off the mask)", () => {
    const is = fx.cases.find((c) => c.name === "sequence_is_norm") as Case;
    const w = computeRolloutCorrectionWeights(logRatio, mask, {
      rolloutIs: "sequence",
      threshold: 5,
      batchNormalize: true,
    });
    rowsClose(w.weights, is.weights as M, "weights");
    const rs = fx.cases.find((c) => c.name === "rs_two") as Case;
    const r = computeRolloutRejectionMask(
      logRatio,
      mask,
      parseRolloutRs("token_k1,seq_max_k3", "0.4_1.8,3.0"),
    );
    rowsClose(r.mask, rs.mask, "mask");
    const off = computeOffpolicyMetrics(old, rollout, mask);
    close(off.kl as number, rs.metrics["rollout_corr/kl"] as number, "kl");
  });

  it("ignores whatever the rollout log-probs hold off the mask", () => {
    const poisoned = rollout.map((row, b) =>
      row.map((x, t) => (mask[b]?.[t] === 0 ? Number.NaN : x)),
    );
    const config = {
      rolloutIs: "token" as const,
      rolloutIsThreshold: 2,
      rolloutIsBatchNormalize: false,
      rejection: parseRolloutRs("token_k1,seq_mean_k3", "0.5_2,0.3"),
    };
    const a = rolloutCorrection(old, rollout, mask, config);
    const b = rolloutCorrection(old, poisoned, mask, config);
    expect(b).toEqual(a);
  });

  it("changes nothing and reports nothing when no token has both log-probs", () => {
    const none = mask.map((row) => row.map(() => 0));
    const r = rolloutCorrection(old, rollout, none, {
      rolloutIs: "token",
      rolloutIsThreshold: 2,
      rolloutIsBatchNormalize: false,
      rejection: [],
    });
    expect(r.metrics).toEqual({});
    expect(r.weights.every((row) => row.every((w) => w === 1))).toBe(true);
    expect(r.keep.every((row) => row.every((k) => k === 1))).toBe(true);
  });
});

describe("parseRolloutRs: verl's option and threshold syntax, errors naming the key", () => {
  it("reads k1 bounds, a lone upper bound (lower = 1/upper) and one threshold for all", () => {
    expect(parseRolloutRs("token_k1, seq_max_k2 ,token_k1", "0.5_1.5, 2")).toEqual([
      { option: "token_k1", lower: 0.5, upper: 1.5 },
      { option: "seq_max_k2", lower: null, upper: 2 },
    ]);
    expect(parseRolloutRs("seq_sum_k1,seq_mean_k3", 4)).toEqual([
      { option: "seq_sum_k1", lower: 0.25, upper: 4 },
      { option: "seq_mean_k3", lower: null, upper: 4 },
    ]);
  });

  it.each([
    ["token_k4", "2", /rollout_correction\.rollout_rs: 'token_k4' is not one of token_k1/],
    [" , ", "2", /rollout_correction\.rollout_rs: name at least one option/],
    ["token_k1", null, /rollout_rs_threshold must be set when .*rollout_rs is/],
    ["token_k1,token_k2", "1,2,3", /rollout_rs_threshold: 3 thresholds for 2/],
    ["token_k2", "0.5_1.5", /rollout_rs_threshold: option token_k2 takes one upper bound/],
    ["token_k1", "0_1.5", /rollout_rs_threshold: thresholds must be positive/],
    ["token_k3", "-1", /rollout_rs_threshold: thresholds must be positive/],
    ["token_k3", "abc", /rollout_rs_threshold: 'abc' is not a number/],
  ])("%s with %s: refused", (rs, th, message) => {
    expect(() => parseRolloutRs(rs, th)).toThrow(message);
  });
});
