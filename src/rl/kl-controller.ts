// The coefficient β of the in-reward KL (algorithm.use_kl_in_reward), as verl's
// FixedKLController and AdaptiveKLController define it; the adaptive rule is Ziegler et al.
// 2019 (arXiv 1909.08593, §2.2). Search-R1's scripts use the fixed one with β = 0.001.
// A controller is a plain value: update returns the next one instead of mutating.

export type KlController =
  | { readonly type: "fixed"; readonly value: number }
  | {
      readonly type: "adaptive";
      readonly value: number;
      /** The KL per token the coefficient steers toward (verl: kl_ctrl.target_kl). */
      readonly targetKl: number;
      /** Trajectories over which a full ±20% correction is spread (verl: kl_ctrl.horizon). */
      readonly horizon: number;
    };

export function fixedKlController(klCoef: number): KlController {
  return { type: "fixed", value: klCoef };
}

export function adaptiveKlController(
  initKlCoef: number,
  targetKl: number,
  horizon: number,
): KlController {
  if (!(horizon > 0)) {
    throw new Error(`adaptive KL controller: horizon must be > 0, got ${horizon}`);
  }
  if (!(targetKl > 0)) {
    throw new Error(`adaptive KL controller: target_kl must be > 0, got ${targetKl}`);
  }
  return { type: "adaptive", value: initKlCoef, targetKl, horizon };
}

/**
 * After a step whose mean KL was `currentKl` over `nSteps` trajectories (verl passes the batch
 * size): fixed stays; adaptive multiplies β by 1 + clip(KL/target − 1, −0.2, 0.2)·nSteps/horizon.
 * The β used to shape a step's rewards is the value before this update (verl reads
 * kl_ctrl.value, then updates).
 */
export function updateKlController(
  ctrl: KlController,
  currentKl: number,
  nSteps: number,
): KlController {
  if (ctrl.type === "fixed") return ctrl;
  const error = Math.min(0.2, Math.max(-0.2, currentKl / ctrl.targetKl - 1));
  return { ...ctrl, value: ctrl.value * (1 + (error * nSteps) / ctrl.horizon) };
}
