// src/rl/ against the PyTorch float64 references of make_fixtures.py (fixtures/advantages.json).
//
// Tolerance: both sides evaluate the same float64 formulas and differ only in summation order
// and in how pow/div/sqrt are sequenced, which costs a few ulps (measured: under 5e-15
// relative). The bound is |a − e| ≤ 1e-12·|e| + 1e-13, far below the effects the cases are
// there to catch: biased vs unbiased variance (≥ 1%), ε inside vs outside the square root
// (~1e-6), a misplaced score or a broken mask (order 1).

import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { type AdvantageEstimator, computeAdvantages } from "../../src/rl/advantages.js";
import { gaeAdvantageReturn } from "../../src/rl/gae.js";
import { grpoOutcomeAdvantage } from "../../src/rl/grpo.js";
import { KL_ESTIMATORS, type KlEstimator, klPenalty } from "../../src/rl/kl.js";
import {
  adaptiveKlController,
  fixedKlController,
  updateKlController,
} from "../../src/rl/kl-controller.js";
import { maskedWhiten } from "../../src/rl/masked-whiten.js";
import { reinforcePlusPlusOutcomeAdvantage } from "../../src/rl/reinforce-plus-plus.js";
import { rlooOutcomeAdvantage } from "../../src/rl/rloo.js";
import type { Rows } from "../../src/rl/rows.js";
import { applyKlPenalty, tokenLevelScores } from "../../src/rl/token-rewards.js";

type M = number[][];
const fx = JSON.parse(readFileSync(new URL("./fixtures/advantages.json", import.meta.url), "utf8"));

const REL = 1e-12;
const ABS = 1e-13;

function expectClose(actual: number, expected: number, what: string): void {
  const err = Math.abs(actual - expected);
  if (!(err <= REL * Math.abs(expected) + ABS)) {
    throw new Error(`${what}: got ${actual}, expected ${expected} (error ${err})`);
  }
}

function expectRowsClose(actual: Rows, expected: M, what: string): void {
  expect(actual.length, `${what}: rows`).toBe(expected.length);
  expected.forEach((row, b) => {
    const a = actual[b] as ArrayLike<number>;
    expect(a.length, `${what}[${b}]: length`).toBe(row.length);
    row.forEach((e, t) => {
      expectClose(a[t] as number, e, `${what}[${b}][${t}]`);
    });
  });
}

/** Each row cut after its last response token: the controller's ragged, unpadded layout. */
function trim(rows: M, lengths: number[]): Float64Array[] {
  return rows.map((row, b) => Float64Array.from(row.slice(0, lengths[b])));
}

function lengthsOf(mask: M): number[] {
  return mask.map((row) => row.lastIndexOf(1) + 1);
}

describe("KL estimators", () => {
  for (const kind of KL_ESTIMATORS) {
    it(`${kind} matches the reference, clamps included`, () => {
      fx.kl.logp.forEach((logp: number, i: number) => {
        expectClose(klPenalty(logp, fx.kl.ref[i], kind), fx.kl[kind][i], `${kind}[${i}]`);
      });
    });
  }

  it("k3 is 10, not NaN, when a log-prob is -Infinity", () => {
    expect(klPenalty(Number.NEGATIVE_INFINITY, -1, "low_var_kl")).toBe(10);
    expect(klPenalty(-1, Number.NEGATIVE_INFINITY, "low_var_kl")).toBe(10);
  });

  it("refuses an unknown estimator by name", () => {
    expect(() => klPenalty(0, 0, "k4" as KlEstimator)).toThrow(/kl, abs, mse, low_var_kl.*k4/);
  });
});

describe("KL controllers", () => {
  it("adaptive: beta follows the reference through clipped and unclipped updates", () => {
    const c = fx.adaptive_kl_controller;
    let ctrl = adaptiveKlController(c.init_kl_coef, c.target_kl, c.horizon);
    c.steps.forEach(
      (s: { current_kl: number; n_steps: number; value_after: number }, i: number) => {
        ctrl = updateKlController(ctrl, s.current_kl, s.n_steps);
        expectClose(ctrl.value, s.value_after, `step ${i}`);
      },
    );
  });

  it("fixed: beta never moves", () => {
    const ctrl = fixedKlController(0.001);
    expect(updateKlController(ctrl, 5, 512).value).toBe(0.001);
  });

  it("adaptive: refuses a horizon or target that is not positive", () => {
    expect(() => adaptiveKlController(0.1, 0.1, 0)).toThrow(/horizon/);
    expect(() => adaptiveKlController(0.1, 0, 10)).toThrow(/target_kl/);
  });
});

describe("masked whitening", () => {
  it("uses the batch's masked mean and unbiased variance; 0 outside the mask", () => {
    const w = fx.masked_whiten;
    expectRowsClose(maskedWhiten(w.values, w.mask), w.whitened, "whitened");
  });

  it("refuses batches with fewer than two masked tokens, as verl does", () => {
    expect(() => maskedWhiten([[1, 2]], [[0, 0]])).toThrow(/no 1/);
    expect(() => maskedWhiten([[1, 2]], [[0, 1]])).toThrow(/single 1/);
  });
});

describe("GRPO", () => {
  for (const c of fx.grpo) {
    it(`${c.name}: singleton, all-equal group, holes in the mask, interleaved uids`, () => {
      const a = grpoOutcomeAdvantage({
        tokenLevelRewards: c.token_level_rewards,
        responseMask: c.response_mask,
        uids: c.uids,
        normAdvByStd: c.norm_adv_by_std,
      });
      expectRowsClose(a, c.advantages, c.name);
    });
  }

  it("all-equal rewards give exactly 0 and a singleton R/(1 + 1e-6)", () => {
    const a = grpoOutcomeAdvantage({
      tokenLevelRewards: [
        [0, 1],
        [0, 1],
        [0, 0.5],
      ],
      responseMask: [
        [1, 1],
        [1, 1],
        [1, 1],
      ],
      uids: ["x", "x", "y"],
    });
    expect([...(a[0] as Float64Array), ...(a[1] as Float64Array)]).toEqual([0, 0, 0, 0]);
    expect(a[2]?.[0]).toBe(0.5 / (1 + 1e-6));
  });

  it("groups by uid, not by position", () => {
    const rewards = [[1], [0], [1], [0]];
    const mask = [[1], [1], [1], [1]];
    const byUid = grpoOutcomeAdvantage({
      tokenLevelRewards: rewards,
      responseMask: mask,
      uids: ["a", "b", "a", "b"],
    });
    // groups {1, 1} and {0, 0}: everything 0; grouping by adjacency would give ±0.707
    expect(byUid.map((r) => r[0])).toEqual([0, 0, 0, 0]);
  });
});

describe("RLOO", () => {
  it("leave-one-out baseline; a singleton keeps its reward", () => {
    const c = fx.rloo;
    const a = rlooOutcomeAdvantage({
      tokenLevelRewards: c.token_level_rewards,
      responseMask: c.response_mask,
      uids: c.uids,
    });
    expectRowsClose(a, c.advantages, "rloo");
  });
});

describe("GAE", () => {
  for (const c of fx.gae) {
    it(`${c.name}: advantages (whitened) and returns`, () => {
      const r = gaeAdvantageReturn({
        tokenLevelRewards: c.token_level_rewards,
        values: c.values,
        mask: c.mask,
        gamma: c.gamma,
        lam: c.lam,
      });
      expectRowsClose(r.advantages, c.advantages, `${c.name} advantages`);
      expectRowsClose(r.returns, c.returns, `${c.name} returns`);
    });
  }

  it("checks that every row has the mask's length", () => {
    expect(() =>
      gaeAdvantageReturn({
        tokenLevelRewards: [[1, 2, 3]],
        values: [[0, 0]],
        mask: [[1, 1, 1]],
        gamma: 1,
        lam: 1,
      }),
    ).toThrow(/values\[0\]: 2 tokens, but mask\[0\] has 3/);
  });
});

describe("REINFORCE++", () => {
  for (const c of fx.reinforce_plus_plus) {
    it(`${c.name}: discounted return-to-go, whitened`, () => {
      const r = reinforcePlusPlusOutcomeAdvantage({
        tokenLevelRewards: c.token_level_rewards,
        mask: c.mask,
        gamma: c.gamma,
      });
      expectRowsClose(r.advantages, c.advantages, `${c.name} advantages`);
      expectRowsClose(r.returns, c.returns, `${c.name} returns`);
    });
  }
});

describe("token-level rewards", () => {
  const batch = fx.pipeline.batch;

  it("puts each score on the last response token, an observation token included", () => {
    expectRowsClose(
      tokenLevelScores(batch.scores, batch.response_mask),
      batch.token_level_scores,
      "scores",
    );
  });

  it("finds the last token of a mask with holes (sum − 1 would not)", () => {
    const s = tokenLevelScores([1], [[1, 0, 0, 1, 1, 0]]);
    expect([...(s[0] as Float64Array)]).toEqual([0, 0, 0, 0, 1, 0]);
  });

  it("refuses a trajectory without a response token", () => {
    expect(() => tokenLevelScores([1, 1], [[1], [0]])).toThrow(/responseMask\[1\]/);
  });

  it("current KL leaves out rows without loss tokens instead of turning NaN", () => {
    const r = applyKlPenalty({
      tokenLevelScores: [
        [0, 1],
        [0, 1],
      ],
      oldLogProbs: [
        [-1, -1],
        [-1, -1],
      ],
      refLogProbs: [
        [-1.5, -2],
        [-1, -1],
      ],
      mask: [
        [1, 1],
        [0, 0],
      ],
      estimator: "kl",
      klCoef: 0.1,
    });
    expect(r.currentKl).toBe(0.75);
    expect([...(r.tokenLevelRewards[0] as Float64Array)]).toEqual([-0.05, 0.9]);
    expect([...(r.tokenLevelRewards[1] as Float64Array)]).toEqual([0, 1]);
  });
});

describe("one step, Search-R1-shaped (retrieved blocks, padding, groups)", () => {
  const batch = fx.pipeline.batch;
  const lengths = lengthsOf(batch.response_mask);

  for (const c of fx.pipeline.cases) {
    const opts = {
      estimator: c.estimator as AdvantageEstimator,
      gamma: c.gamma,
      lam: c.lam,
      normAdvByStdInGrpo: c.norm_adv_by_std_in_grpo,
      ...(c.kl_in_reward
        ? { klInReward: { estimator: c.kl_in_reward.estimator, klCoef: c.kl_in_reward.kl_coef } }
        : {}),
    };

    it(`${c.name}: padded rows`, () => {
      const r = computeAdvantages(
        {
          uids: batch.uids,
          scores: batch.scores,
          responseMask: batch.response_mask,
          lossMask: batch.loss_mask,
          oldLogProbs: batch.old_log_probs,
          refLogProbs: batch.ref_log_probs,
          values: batch.values,
        },
        opts,
      );
      expectRowsClose(r.tokenLevelScores, batch.token_level_scores, "scores");
      expectRowsClose(
        r.tokenLevelRewards,
        c.token_level_rewards ?? batch.token_level_scores,
        "rewards",
      );
      expectRowsClose(r.advantages, c.advantages, "advantages");
      if (c.returns) expectRowsClose(r.returns, c.returns, "returns");
      else expect(r.returns).toBe(r.advantages);
      if (c.current_kl === undefined) expect(r.currentKl).toBeUndefined();
      else expectClose(r.currentKl as number, c.current_kl, "current_kl");
    });

    it(`${c.name}: ragged Float32Array/Uint8Array rows give the same values`, () => {
      const f32 = (rows: M) => trim(rows, lengths).map((row) => Float32Array.from(row));
      const u8 = (rows: M) => trim(rows, lengths).map((row) => Uint8Array.from(row));
      const rounded = (rows: M) => rows.map((row) => Float64Array.from(Float32Array.from(row)));
      // log-probs and values go through float32 here, so compare against a float64 run on the
      // same rounded inputs rather than the fixture
      const ragged = computeAdvantages(
        {
          uids: batch.uids,
          scores: batch.scores,
          responseMask: u8(batch.response_mask),
          lossMask: u8(batch.loss_mask),
          oldLogProbs: f32(batch.old_log_probs),
          refLogProbs: f32(batch.ref_log_probs),
          values: f32(batch.values),
        },
        opts,
      );
      const padded = computeAdvantages(
        {
          uids: batch.uids,
          scores: batch.scores,
          responseMask: batch.response_mask,
          lossMask: batch.loss_mask,
          oldLogProbs: rounded(batch.old_log_probs),
          refLogProbs: rounded(batch.ref_log_probs),
          values: rounded(batch.values),
        },
        opts,
      ).advantages.map((row, b) => [...row.slice(0, lengths[b])]);
      expectRowsClose(ragged.advantages, padded, "ragged advantages");
    });
  }

  it("names what is missing", () => {
    const base = {
      uids: ["a"],
      scores: [1],
      responseMask: [[1, 1]],
      lossMask: [[1, 1]],
    };
    expect(() => computeAdvantages(base, { estimator: "gae" })).toThrow(/values/);
    expect(() =>
      computeAdvantages(base, {
        estimator: "grpo",
        klInReward: { estimator: "kl", klCoef: 0.1 },
      }),
    ).toThrow(/oldLogProbs and refLogProbs/);
    expect(() => computeAdvantages({ ...base, lossMask: [[1]] }, { estimator: "grpo" })).toThrow(
      /lossMask\[0\]: 1 tokens, but responseMask\[0\] has 2/,
    );
  });
});
