// Per-token estimators of KL(π‖π_ref) from the two log-probs of the sampled token, named as
// verl names them (algorithm.kl_penalty for the in-reward KL, actor.kl_loss_type for the KL
// loss) after J. Schulman, "Approximating KL divergence" (2020): k1, k2, k3.

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
 * k3: r − log r − 1 with r = π_ref/π, i.e. exp(d) − d − 1 for d = log π_ref − log π; never
 * negative, clamped to [−10, 10] as verl does. d itself is clamped to [−20, 20] first (verl
 * since 2025; Search-R1's fork has no such clamp): that changes no finite result, since
 * |d| > 20 already gives more than 10, and keeps −∞ log-probs from turning into NaN.
 */
export function klK3(logProb: number, refLogProb: number): number {
  const d = Math.min(20, Math.max(-20, refLogProb - logProb));
  return Math.min(10, Math.max(-10, Math.exp(d) - d - 1));
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
