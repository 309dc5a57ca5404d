// Per-token estimators of KL(π‖π_ref) from the two log-probs of the sampled token, named as
// verl names them (algorithm.kl_penalty for the in-reward KL, actor.kl_loss_type for the KL
// loss) after J. Schulman, "Approximating KL divergence" (2020): k1, k2, k3.
//
// One rule, verl's: kl_penalty_forward in verl/trainer/ppo/core_algos.py (volcengine/verl
// main, 2026-01), which kl_penalty calls for both KLs. The native trainer's KL loss
// (native/src/train/ppo_loss.cpp, kl_k1 … kl_k3) computes the same rule in double;
// test/native/kl.test.ts feeds both the same log-probs and checks they agree.

export type KlEstimator = "kl" | "abs" | "mse" | "low_var_kl";

export const KL_ESTIMATORS: readonly KlEstimator[] = ["kl", "abs", "mse", "low_var_kl"];

/** k1: log π − log π_ref. Unbiased, high variance, can be negative per token. */
export function klK1(logProb: number, refLogProb: number): number {
  return logProb - refLogProb;
}

/** |log π − log π_ref|. */
export function klAbs(logProb: number, refLogProb: number): number {
  return Math.abs(logProb - refLogProb);
}

/** k2: ½ (log π − log π_ref)². */
export function klK2(logProb: number, refLogProb: number): number {
  const d = logProb - refLogProb;
  return 0.5 * d * d;
}

/**
 * k3: r − log r − 1 with r = π_ref/π, as verl computes it: k = clamp(log π_ref − log π, −20,
 * 20), then clamp(exp(k) − k − 1, −10, 10). Never negative. The clamp of k (verl since #1779,
 * 2025-06; Search-R1's fork has none) changes no finite result, since |k| > 20 already gives
 * more than 10, and keeps a −∞ log-prob from turning into NaN.
 */
export function klK3(logProb: number, refLogProb: number): number {
  const k = Math.min(20, Math.max(-20, refLogProb - logProb));
  const kld = Math.exp(k) - k - 1;
  return Math.min(10, Math.max(-10, kld));
}

/** The estimator by its config name: kl (k1), abs, mse (k2), low_var_kl (k3). */
export function klPenalty(logProb: number, refLogProb: number, estimator: KlEstimator): number {
  switch (estimator) {
    case "kl":
      return klK1(logProb, refLogProb);
    case "abs":
      return klAbs(logProb, refLogProb);
    case "mse":
      return klK2(logProb, refLogProb);
    case "low_var_kl":
      return klK3(logProb, refLogProb);
    default:
      throw new Error(
        `KL estimator: expected one of ${KL_ESTIMATORS.join(", ")}, got ${estimator}`,
      );
  }
}
