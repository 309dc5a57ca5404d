import { describe, expect, it } from "vitest";
import {
  ENTROPY_BASELINE_STEPS,
  ENTROPY_COLLAPSE_RATIO,
  entropyBaseline,
  entropyCollapsed,
  formatMetric,
  GRAD_NORM_MIN_HISTORY,
  GRAD_NORM_SPIKE_FACTOR,
  GRAD_NORM_WINDOW,
  gradNormSpike,
  median,
  nonFiniteMetrics,
  nullableMetrics,
  RunHealth,
} from "../../src/train/health.js";

describe("nonFiniteMetrics", () => {
  it("names NaN and ±Inf numbers, and the trainer's nulls, in the row's order", () => {
    const row = {
      step: 3,
      epoch: Number.NaN, // not a metric
      "reward/mean": 0.5,
      "rollout/logprob_gap": Number.NaN,
      "actor/pg_loss": null,
      "actor/entropy": 0.7,
      "critic/vf_loss": Number.POSITIVE_INFINITY,
      "actor/grad_norm": Number.NEGATIVE_INFINITY,
      "algorithm/kl": null, // a null outside actor/ and critic/ is an absent value
    };
    expect(nonFiniteMetrics(row)).toEqual([
      "rollout/logprob_gap",
      "actor/pg_loss",
      "critic/vf_loss",
      "actor/grad_norm",
    ]);
  });

  it("leaves out the keys that are null by design", () => {
    const row = { step: 1, "actor/kl_loss": null, "actor/entropy": 0.5 };
    expect(nonFiniteMetrics(row, nullableMetrics(false))).toEqual([]);
    expect(nonFiniteMetrics(row, nullableMetrics(true))).toEqual(["actor/kl_loss"]);
    // null by design is still caught when it is a NaN number
    expect(
      nonFiniteMetrics({ step: 1, "actor/kl_loss": Number.NaN }, nullableMetrics(false)),
    ).toEqual(["actor/kl_loss"]);
  });
});

describe("the pieces", () => {
  it("median", () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(median([7])).toBe(7);
  });

  it("entropy baseline: the mean of the first steps, none before there are enough", () => {
    expect(ENTROPY_BASELINE_STEPS).toBe(5);
    expect(entropyBaseline([1, 1, 1, 1])).toBeNull();
    expect(entropyBaseline([1, 2, 3, 4, 5])).toBe(3);
    expect(entropyBaseline([1, 2, 3, 4, 5, 100])).toBe(3);
    expect(ENTROPY_COLLAPSE_RATIO).toBe(0.1);
    expect(entropyCollapsed(0.39, 4)).toBe(true);
    expect(entropyCollapsed(0.4, 4)).toBe(false); // strictly below
    expect(entropyCollapsed(0, 0)).toBe(false); // no baseline to fall from
  });

  it("grad-norm spike: above 10 × the median of the last 20, once there are 5", () => {
    expect([GRAD_NORM_SPIKE_FACTOR, GRAD_NORM_WINDOW, GRAD_NORM_MIN_HISTORY]).toEqual([10, 20, 5]);
    expect(gradNormSpike([1, 1, 1, 1], 100)).toBeNull(); // too little history
    expect(gradNormSpike([1, 2, 3, 4, 5], 30.01)).toBe(3);
    expect(gradNormSpike([1, 2, 3, 4, 5], 30)).toBeNull(); // strictly above
    // only the last 20 count: 30 old values of 100, then 20 of 1
    const previous = [...Array(30).fill(100), ...Array(20).fill(1)];
    expect(gradNormSpike(previous, 11)).toBe(1);
  });

  it("formats values for one line", () => {
    expect(formatMetric(null)).toBe("null");
    expect(formatMetric(Number.NaN)).toBe("NaN");
    expect(formatMetric(Number.NEGATIVE_INFINITY)).toBe("-Infinity");
    expect(formatMetric(0.123456)).toBe("0.123");
    expect(formatMetric(41.234)).toBe("41.2");
    expect(formatMetric(1e-5)).toBe("1.00e-5");
    expect(formatMetric(0)).toBe("0");
  });
});

describe("RunHealth", () => {
  const rows = (entropies: number[], from = 1) =>
    entropies.map((e, i) => ({ step: from + i, "actor/entropy": e, "actor/grad_norm": 1 }));

  it("warns once when entropy falls below 0.1 × its first five steps' mean, again after it recovers", () => {
    const health = new RunHealth();
    // The baseline: steps 1-5, mean 0.6; the threshold 0.06.
    const seen = rows([0.5, 0.6, 0.7, 0.6, 0.6, 0.3, 0.05, 0.04, 0.2, 0.01]).map(
      (r) => health.observe(r).warnings,
    );
    expect(seen.map((w) => w.length)).toEqual([0, 0, 0, 0, 0, 0, 1, 0, 0, 1]);
    expect(seen[6]?.[0]).toBe(
      "step 7: entropy collapse: actor/entropy 0.05 is below 0.1 × its mean over steps 1–5 (0.6); the policy has almost stopped exploring",
    );
    expect(seen[9]?.[0]).toMatch(/^step 10: entropy collapse: actor\/entropy 0.01 is below/);
  });

  it("a resumed run's baseline is the run's first steps, replayed from metrics.jsonl", () => {
    const health = new RunHealth();
    // step 0 is the validation before training: no entropy; a NaN step does not count
    health.replay([{ step: 0, "val/em/mean": 0.1 }, ...rows([1, 1, Number.NaN, 1, 1, 1])]);
    expect(health.observe({ step: 7, "actor/entropy": 0.09 }).warnings).toEqual([
      "step 7: entropy collapse: actor/entropy 0.09 is below 0.1 × its mean over steps 1–6 (1); the policy has almost stopped exploring",
    ]);
  });

  it("warns at each grad-norm spike against the running median, per key", () => {
    const health = new RunHealth();
    const norms = [1, 2, 1, 2, 1, 50, 1, 30, 1];
    const warned = norms.map(
      (n, i) =>
        health.observe({ step: i + 1, "actor/grad_norm": n, "critic/grad_norm": 1 }).warnings,
    );
    expect(warned.map((w) => w.length)).toEqual([0, 0, 0, 0, 0, 1, 0, 1, 0]);
    expect(warned[5]?.[0]).toBe(
      "step 6: gradient-norm spike: actor/grad_norm 50 is above 10 × the median of its previous 5 steps (1)",
    );
    // the spike joins the window: median of [1,2,1,2,1,50,1] is 1, so 30 still spikes
    expect(warned[7]?.[0]).toMatch(
      /actor\/grad_norm 30 is above 10 × the median of its previous 7 steps \(1\)/,
    );
    const critic = new RunHealth();
    for (let i = 1; i <= 5; i++) critic.observe({ step: i, "critic/grad_norm": 0.5 });
    expect(critic.observe({ step: 6, "critic/grad_norm": 6 }).warnings[0]).toMatch(
      /^step 6: gradient-norm spike: critic\/grad_norm 6 is above 10 × the median of its previous 5 steps \(0.5\)$/,
    );
  });

  it("says which step and which metrics are not finite", () => {
    const health = new RunHealth(nullableMetrics(true));
    const report = health.observe({
      step: 4,
      "actor/pg_loss": null,
      "actor/entropy": null,
      "rollout/logprob_gap": Number.NaN,
    });
    expect(report.nonFinite).toEqual(["actor/pg_loss", "actor/entropy", "rollout/logprob_gap"]);
    expect(report.warnings).toEqual([
      "step 4: not finite: actor/pg_loss=null, actor/entropy=null, rollout/logprob_gap=NaN (the trainer reports NaN and ±Inf as null)",
    ]);
    expect(health.observe({ step: 5, "reward/mean": Number.POSITIVE_INFINITY }).warnings).toEqual([
      "step 5: not finite: reward/mean=Infinity",
    ]);
  });
});
