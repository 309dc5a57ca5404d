// Rollout correction: the engine that sampled a trajectory (π_rollout: bf16 kernels, another
// batching) is not the trainer that computes its old log-probs (π_old), so PPO's "old" policy
// is not the one the tokens came from. verl's decoupled mode corrects for the gap with
// truncated importance weights ρ = π_old/π_rollout on the policy loss (IS) and with rejection
// of tokens or sequences whose mismatch is too large (RS), and logs the mismatch: Liu, Li et
// al. 2025, "When Speed Kills Stability" (https://richardli.xyz/rl-collapse).
//
// Everything below follows verl/trainer/ppo/rollout_corr_helper.py (volcengine/verl main,
// 2026-01; docs/algo/rollout_corr.md; keys algorithm.rollout_correction.*):
// compute_rollout_correction_weights, compute_is_metrics, compute_rollout_rejection_mask and
// compute_offpolicy_metrics, with verl's metric names (prefixed `rollout_corr/` by
// rolloutCorrection); their masked means are verl's masked_mean (src/rl/masked-mean.ts), so a
// row with no token gives 0 as it does there. Not here: bypass_mode (π_old := π_rollout) and
// its loss_type, and the per-option RS statistics beyond the mean, max, min and masked
// fractions. test/rl/make_offpolicy_fixtures.py computes the same from verl's
// formulas in PyTorch; test/rl/rollout-correction.test.ts holds the two together.

import { maskedMean, maskedTotals } from "./masked-mean.js";
import { checkRows, type Rows } from "./rows.js";

/** exp(±20) bounds every weight (verl's SAFETY_BOUND). */
export const SAFETY_BOUND = 20;

export type RolloutIsLevel = "token" | "sequence";

/** verl's SUPPORTED_ROLLOUT_RS_OPTIONS, in its documentation's order. */
export const ROLLOUT_RS_OPTIONS = [
  "token_k1",
  "token_k2",
  "token_k3",
  "seq_sum_k1",
  "seq_sum_k2",
  "seq_sum_k3",
  "seq_mean_k1",
  "seq_mean_k2",
  "seq_mean_k3",
  "seq_max_k2",
  "seq_max_k3",
] as const;
export type RolloutRsOption = (typeof ROLLOUT_RS_OPTIONS)[number];

/** One rejection criterion: `lower` only for the k1 options (bounds on π_rollout/π_old). */
export interface RsCriterion {
  option: RolloutRsOption;
  lower: number | null;
  upper: number;
}

export type Metrics = Record<string, number>;

const clampLog = (x: number) => Math.min(SAFETY_BOUND, Math.max(-SAFETY_BOUND, x));

/** Per row: Σ values over the mask, its masked mean (verl's masked_mean, axis=-1) and Σ mask. */
function rowSums(values: Rows, mask: Rows): { sum: number[]; mean: number[]; count: number[] } {
  const sum: number[] = [];
  const mean: number[] = [];
  const count: number[] = [];
  values.forEach((row, b) => {
    const one = [row];
    const m = [mask[b] as ArrayLike<number>];
    const totals = maskedTotals(one, m);
    sum.push(totals.sum);
    mean.push(maskedMean(one, m));
    count.push(totals.count);
  });
  return { sum, mean, count };
}

const mapRows = (rows: Rows, f: (x: number, b: number, t: number) => number): Float64Array[] =>
  rows.map((row, b) =>
    Float64Array.from({ length: row.length }, (_, t) => f(row[t] as number, b, t)),
  );

const average = (xs: readonly number[]) =>
  xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : Number.NaN;

/** torch.std (n − 1); 0 for fewer than two values, as verl writes it. */
function unbiasedStd(xs: readonly number[]): number {
  if (xs.length < 2) return 0;
  const m = average(xs);
  return Math.sqrt(xs.reduce((a, x) => a + (x - m) ** 2, 0) / (xs.length - 1));
}

/** Max (or min) over the masked positions. */
function maskedExtreme(values: Rows, mask: Rows, max: boolean): number {
  let best = max ? Number.NEGATIVE_INFINITY : Number.POSITIVE_INFINITY;
  values.forEach((row, b) => {
    const m = mask[b] as ArrayLike<number>;
    for (let t = 0; t < row.length; t++) {
      if (m[t] === 0) continue;
      const x = row[t] as number;
      best = max ? Math.max(best, x) : Math.min(best, x);
    }
  });
  return best;
}

function hasToken(mask: Rows): boolean {
  return mask.some((row) => Array.prototype.some.call(row, (x: number) => x !== 0));
}

export interface IsOptions {
  /** algorithm.rollout_correction.rollout_is */
  rolloutIs: RolloutIsLevel;
  /** algorithm.rollout_correction.rollout_is_threshold: the truncation cap (> 0). */
  threshold: number;
  /** algorithm.rollout_correction.rollout_is_batch_normalize */
  batchNormalize?: boolean;
}

/**
 * verl's compute_rollout_correction_weights: with log ρ_t = log π_old − log π_rollout,
 *   token:    w_t = exp(clamp(log ρ_t, ±20))
 *   sequence: w_t = exp(clamp(Σ_mask log ρ, ±20)) on every token of the row
 * times the mask, then truncated: w = min(w, threshold) (TIS). The metrics (compute_is_metrics)
 * describe the weights before the truncation. With batchNormalize the truncated weights are
 * divided by their mean (token: over the tokens; sequence: over the rows with a token), when
 * that mean is above 1e-8. The weights are constants of the loss (verl detaches them).
 */
export function computeRolloutCorrectionWeights(
  logRatio: Rows,
  mask: Rows,
  opts: IsOptions,
): { weights: Float64Array[]; metrics: Metrics } {
  checkRows("logRatio", logRatio, mask, "mask");
  const { rolloutIs, threshold } = opts;
  if (rolloutIs !== "token" && rolloutIs !== "sequence") {
    throw new Error(`rollout_is: expected token or sequence, got ${String(rolloutIs)}`);
  }
  if (!(threshold > 0)) throw new Error(`rollout_is_threshold must be positive, got ${threshold}`);
  const seqLogRatio = rowSums(logRatio, mask).sum;
  let weights =
    rolloutIs === "token"
      ? mapRows(
          logRatio,
          (x, b, t) => Math.exp(clampLog(x)) * ((mask[b] as ArrayLike<number>)[t] as number),
        )
      : mapRows(
          logRatio,
          (_, b, t) =>
            Math.exp(clampLog(seqLogRatio[b] as number)) *
            ((mask[b] as ArrayLike<number>)[t] as number),
        );
  const metrics = isMetrics(weights, seqLogRatio, mask, rolloutIs, threshold);
  weights = weights.map((row) => row.map((w) => Math.min(w, threshold)));
  if (opts.batchNormalize) {
    let mean: number;
    if (rolloutIs === "token") {
      mean = maskedMean(weights, mask);
    } else {
      const { mean: perRow, count } = rowSums(weights, mask);
      const valid = count.map((n) => (n > 0 ? 1 : 0));
      const n = valid.reduce((a: number, v) => a + v, 0);
      mean = perRow.reduce((a, w, b) => a + w * (valid[b] as number), 0) / Math.max(n, 1e-8);
    }
    if (mean > 1e-8) {
      weights = weights.map((row) => row.map((w) => w / mean));
      metrics.rollout_is_batch_norm_factor = mean;
    } else {
      metrics.rollout_is_batch_norm_factor = 1;
    }
  }
  return { weights, metrics };
}

/** verl's compute_is_metrics, on the weights before truncation. */
function isMetrics(
  weights: Float64Array[],
  seqLogRatio: number[],
  mask: Rows,
  rolloutIs: RolloutIsLevel,
  threshold: number,
): Metrics {
  if (!hasToken(mask)) throw new Error("the mask must contain at least one token");
  const lower = 1 / threshold;
  const m: Metrics = {};
  if (rolloutIs === "sequence") {
    const logMax = Math.max(...seqLogRatio);
    const logMin = Math.min(...seqLogRatio);
    m.rollout_is_max = Math.exp(Math.min(logMax, SAFETY_BOUND));
    m.rollout_is_min = Math.exp(logMin);
    m.rollout_is_mean = maskedMean(weights, mask);
    m.rollout_is_ratio_fraction_high = average(
      seqLogRatio.map((s) => (s > Math.log(threshold) ? 1 : 0)),
    );
    m.rollout_is_ratio_fraction_low = average(
      seqLogRatio.map((s) => (s < Math.log(lower) ? 1 : 0)),
    );
  } else {
    m.rollout_is_mean = maskedMean(weights, mask);
    m.rollout_is_ratio_fraction_high = maskedMean(
      mapRows(weights, (w) => (w > threshold ? 1 : 0)),
      mask,
    );
    m.rollout_is_ratio_fraction_low = maskedMean(
      mapRows(weights, (w) => (w < lower ? 1 : 0)),
      mask,
    );
    m.rollout_is_max = maskedExtreme(weights, mask, true);
    m.rollout_is_min = maskedExtreme(weights, mask, false);
  }
  const clamped = mapRows(weights, (w) => Math.min(threshold, Math.max(lower, w)));
  if (rowSums(mask, mask).count.reduce((a, n) => a + n, 0) > 1) {
    const mean = maskedMean(clamped, mask);
    const variance =
      maskedMean(
        mapRows(clamped, (w) => w * w),
        mask,
      ) -
      mean * mean;
    m.rollout_is_std = Math.sqrt(Math.max(variance, 0));
  } else {
    m.rollout_is_std = 0;
  }
  const essMean = maskedMean(clamped, mask);
  m.rollout_is_eff_sample_size =
    1 /
    maskedMean(
      mapRows(clamped, (w) => (w / (essMean + 1e-8)) ** 2),
      mask,
    );
  const seqMean = rowSums(weights, mask).mean;
  m.rollout_is_seq_mean = average(seqMean);
  m.rollout_is_seq_std = unbiasedStd(seqMean);
  m.rollout_is_seq_max = Math.max(...seqMean);
  m.rollout_is_seq_min = Math.min(...seqMean);
  m.rollout_is_seq_max_deviation = Math.max(...seqMean.map((w) => Math.abs(w - 1)));
  m.rollout_is_seq_fraction_high = average(seqMean.map((w) => (w > threshold ? 1 : 0)));
  m.rollout_is_seq_fraction_low = average(seqMean.map((w) => (w < lower ? 1 : 0)));
  return m;
}

/**
 * algorithm.rollout_correction.rollout_rs and rollout_rs_threshold as verl reads them
 * (compute_rollout_rejection_mask, _parse_rollout_rs_thresholds): a comma-separated list of
 * options (duplicates dropped), and one threshold shared by all or one per option. A k1
 * option takes "lower_upper" (or one number u: lower 1/u); the others one upper bound.
 * Errors name the key they are about.
 */
export function parseRolloutRs(rs: string, threshold: string | number | null): RsCriterion[] {
  const RS = "algorithm.rollout_correction.rollout_rs";
  const TH = "algorithm.rollout_correction.rollout_rs_threshold";
  const options: RolloutRsOption[] = [];
  for (const raw of rs.split(",")) {
    const opt = raw.trim();
    if (!opt) continue;
    if (!(ROLLOUT_RS_OPTIONS as readonly string[]).includes(opt)) {
      throw new Error(`${RS}: '${opt}' is not one of ${ROLLOUT_RS_OPTIONS.join(", ")}`);
    }
    if (!options.includes(opt as RolloutRsOption)) options.push(opt as RolloutRsOption);
  }
  if (options.length === 0) throw new Error(`${RS}: name at least one option`);
  if (threshold === null) throw new Error(`${TH} must be set when ${RS} is`);
  let specs =
    typeof threshold === "number"
      ? [String(threshold)]
      : threshold
          .split(",")
          .map((s) => s.trim())
          .filter((s) => s);
  if (specs.length === 0) throw new Error(`${TH}: give at least one threshold`);
  if (specs.length !== 1 && specs.length !== options.length) {
    throw new Error(
      `${TH}: ${specs.length} thresholds for ${options.length} ${RS} options (give one for all, or one per option)`,
    );
  }
  if (specs.length === 1) specs = options.map(() => specs[0] as string);
  const number = (text: string, option: string): number => {
    const x = /^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text.trim())
      ? Number(text)
      : Number.NaN;
    if (!Number.isFinite(x)) throw new Error(`${TH}: '${text}' is not a number (option ${option})`);
    if (!(x > 0))
      throw new Error(`${TH}: thresholds must be positive, got '${text}' (option ${option})`);
    return x;
  };
  return options.map((option, i) => {
    const spec = specs[i] as string;
    if (option.endsWith("k1")) {
      const [lo, hi] = spec.includes("_") ? (spec.split("_", 2) as [string, string]) : [null, spec];
      const upper = number(hi, option);
      const lower = lo === null ? 1 / upper : number(lo, option);
      return { option, lower, upper };
    }
    if (spec.includes("_")) {
      throw new Error(`${TH}: option ${option} takes one upper bound without '_', got '${spec}'`);
    }
    return { option, lower: null, upper: number(spec, option) };
  });
}

/**
 * verl's compute_rollout_rejection_mask: per token, with r = clamp(log ρ, ±20),
 *   k1 = −r,  k2 = r²/2,  k3 = exp(r) − 1 − r;
 * token_kX judges each token by its own value, seq_sum_kX / seq_mean_kX / seq_max_kX each row
 * by the sum / mean / max of its tokens' values (a row with no token: 0) and keep or reject
 * the whole row. A k1 criterion keeps log(lower) ≤ stat ≤ log(upper): for token_k1 that is
 * lower ≤ π_rollout/π_old ≤ upper, as verl's code reads its bounds (1/upper ≤ ρ ≤ 1/lower);
 * the others keep stat ≤ upper. A token stays only if every criterion keeps it. Returns the
 * mask with the rejected tokens set to 0 and verl's masked fractions per option and overall.
 */
export function computeRolloutRejectionMask(
  logRatio: Rows,
  mask: Rows,
  criteria: readonly RsCriterion[],
): { mask: Float64Array[]; metrics: Metrics } {
  checkRows("logRatio", logRatio, mask, "mask");
  const safe = mapRows(logRatio, clampLog);
  const stats = {
    k1: mapRows(safe, (r) => -r),
    k2: mapRows(safe, (r) => 0.5 * r * r),
    k3: mapRows(safe, (r) => Math.exp(r) - 1 - r),
  };
  const combined = mapRows(mask, () => 1);
  const metrics: Metrics = {};
  const valid = mask.map((row) => Array.prototype.some.call(row, (x: number) => x !== 0));
  const nValid = valid.filter(Boolean).length;
  for (const { option, lower, upper } of criteria) {
    const k = option.slice(-2) as "k1" | "k2" | "k3";
    const token = stats[k];
    const isK1 = k === "k1";
    const lo = isK1 ? Math.log(lower as number) : 0;
    const hi = isK1 ? Math.log(upper) : upper;
    const keeps = (x: number) => (isK1 ? x >= lo && x <= hi : x <= hi);
    let perToken: Float64Array[]; // the statistic each token is judged by
    if (option.startsWith("token_")) {
      perToken = token;
    } else {
      let perRow: number[];
      if (option.startsWith("seq_sum")) perRow = rowSums(token, mask).sum;
      else if (option.startsWith("seq_mean")) perRow = rowSums(token, mask).mean;
      else {
        perRow = token.map((row, b) => {
          const mx = maskedExtreme([row], [mask[b] as ArrayLike<number>], true);
          return mx === Number.NEGATIVE_INFINITY ? 0 : mx;
        });
      }
      perToken = mapRows(mask, (_, b) => perRow[b] as number);
    }
    const keep = mapRows(perToken, (x) => (keeps(x) ? 1 : 0));
    keep.forEach((row, b) => {
      const c = combined[b] as Float64Array;
      for (let t = 0; t < row.length; t++) c[t] = (c[t] as number) * (row[t] as number);
    });
    metrics[`rollout_rs_${option}_mean`] = maskedMean(perToken, mask);
    metrics[`rollout_rs_${option}_max`] = maskedExtreme(perToken, mask, true);
    metrics[`rollout_rs_${option}_min`] = maskedExtreme(perToken, mask, false);
    metrics[`rollout_rs_${option}_masked_fraction`] = maskedMean(
      mapRows(keep, (x) => 1 - x),
      mask,
    );
    const rejectedRows = keep.map((row, b) => rowRejected(row, mask[b] as ArrayLike<number>));
    metrics[`rollout_rs_${option}_seq_masked_fraction`] =
      nValid > 0 ? rejectedRows.filter((r, b) => r && valid[b]).length / nValid : 0;
  }
  metrics.rollout_rs_masked_fraction = maskedMean(
    mapRows(combined, (x) => 1 - x),
    mask,
  );
  metrics.rollout_rs_seq_masked_fraction = average(
    combined.map((row, b) => (rowRejected(row, mask[b] as ArrayLike<number>) ? 1 : 0)),
  );
  const modified = mapRows(mask, (m, b, t) => m * ((combined[b] as Float64Array)[t] as number));
  return { mask: modified, metrics };
}

/** Whether a masked token of the row was rejected (keep below 0.5). */
function rowRejected(keep: ArrayLike<number>, mask: ArrayLike<number>): boolean {
  for (let t = 0; t < keep.length; t++)
    if (mask[t] !== 0 && (keep[t] as number) <= 0.5) return true;
  return false;
}

/**
 * verl's compute_offpolicy_metrics: how far the trainer (π_old) is from the engine (π_rollout)
 * on the sampled tokens.
 *   kl                 masked mean of log π_rollout − log π_old (KL(π_rollout‖π_old), k1)
 *   k3_kl              masked mean of ρ − log ρ − 1
 *   training_ppl       batch mean of each row's exp(−mean log π_old); training_log_ppl its log form
 *   rollout_ppl        the same for π_rollout; rollout_log_ppl
 *   log_ppl_diff       batch mean of each row's mean log π_rollout − mean log π_old
 *                      (= log(training ppl/rollout ppl)); _abs_diff, _max, _min
 *   ppl_ratio          batch mean of exp(log_ppl_diff) per row
 *   chi2_token         masked mean of ρ² − 1 (ρ bounded by exp(±20))
 *   chi2_seq           batch mean of (Π ρ)² − 1 per row (bounded likewise)
 */
export function computeOffpolicyMetrics(
  oldLogProbs: Rows,
  rolloutLogProbs: Rows,
  mask: Rows,
): Metrics {
  checkRows("oldLogProbs", oldLogProbs, mask, "mask");
  checkRows("rolloutLogProbs", rolloutLogProbs, mask, "mask");
  if (!hasToken(mask)) throw new Error("the mask must contain at least one token");
  const meanOld = rowSums(oldLogProbs, mask).mean;
  const meanRollout = rowSums(rolloutLogProbs, mask).mean;
  const logRatio = mapRows(
    oldLogProbs,
    (x, b, t) => x - ((rolloutLogProbs[b] as ArrayLike<number>)[t] as number),
  );
  const diff = meanRollout.map((r, b) => r - (meanOld[b] as number));
  const seqLogRatio = rowSums(logRatio, mask).sum;
  return {
    training_ppl: average(meanOld.map((m) => Math.exp(-m))),
    training_log_ppl: average(meanOld.map((m) => -m)),
    kl: maskedMean(
      mapRows(logRatio, (x) => -x),
      mask,
    ),
    k3_kl: maskedMean(
      mapRows(logRatio, (x) => Math.exp(x) - x - 1),
      mask,
    ),
    rollout_ppl: average(meanRollout.map((m) => Math.exp(-m))),
    rollout_log_ppl: average(meanRollout.map((m) => -m)),
    log_ppl_diff: average(diff),
    log_ppl_abs_diff: average(diff.map(Math.abs)),
    log_ppl_diff_max: Math.max(...diff),
    log_ppl_diff_min: Math.min(...diff),
    ppl_ratio: average(diff.map(Math.exp)),
    chi2_token:
      maskedMean(
        mapRows(logRatio, (x) => Math.exp(clampLog(x)) ** 2),
        mask,
      ) - 1,
    chi2_seq: average(seqLogRatio.map((s) => Math.exp(2 * clampLog(s)))) - 1,
  };
}

export interface RolloutCorrectionConfig {
  /** algorithm.rollout_correction.rollout_is: null = no weights (all 1). */
  rolloutIs: RolloutIsLevel | null;
  rolloutIsThreshold: number;
  rolloutIsBatchNormalize: boolean;
  /** Parsed algorithm.rollout_correction.rollout_rs(_threshold); empty = no rejection. */
  rejection: readonly RsCriterion[];
}

export interface RolloutCorrectionResult {
  /** Per token: the truncated weight where the mask is 1, 1 elsewhere (all 1 without IS). */
  weights: Float64Array[];
  /** Per token: 0 where rejection sampling rejected it, 1 elsewhere (multiply the loss mask by it). */
  keep: Float64Array[];
  /** verl's metrics, prefixed `rollout_corr/`; empty when the mask has no token. */
  metrics: Metrics;
}

/**
 * verl's compute_rollout_correction_and_rejection_mask over the tokens of `mask` (those with
 * both log-probs): IS weights, the rejection mask and the off-policy metrics, all named
 * `rollout_corr/<verl's name>`. Positions off the mask get weight 1 and are never rejected,
 * so the result can be laid over a wider loss mask. A mask with no token changes nothing.
 */
export function rolloutCorrection(
  oldLogProbs: Rows,
  rolloutLogProbs: Rows,
  mask: Rows,
  config: RolloutCorrectionConfig,
): RolloutCorrectionResult {
  checkRows("oldLogProbs", oldLogProbs, mask, "mask");
  checkRows("rolloutLogProbs", rolloutLogProbs, mask, "mask");
  const ones = mapRows(mask, () => 1);
  if (!hasToken(mask)) return { weights: ones, keep: ones, metrics: {} };
  const logRatio = mapRows(oldLogProbs, (x, b, t) => {
    if ((mask[b] as ArrayLike<number>)[t] === 0) return 0;
    return x - ((rolloutLogProbs[b] as ArrayLike<number>)[t] as number);
  });
  const metrics: Metrics = {};
  let weights = ones;
  if (config.rolloutIs !== null) {
    const is = computeRolloutCorrectionWeights(logRatio, mask, {
      rolloutIs: config.rolloutIs,
      threshold: config.rolloutIsThreshold,
      batchNormalize: config.rolloutIsBatchNormalize,
    });
    weights = is.weights.map((row, b) =>
      row.map((w, t) => ((mask[b] as ArrayLike<number>)[t] === 0 ? 1 : w)),
    );
    Object.assign(metrics, is.metrics);
  }
  let keep = ones;
  if (config.rejection.length > 0) {
    const rs = computeRolloutRejectionMask(logRatio, mask, config.rejection);
    keep = rs.mask.map((row, b) =>
      row.map((k, t) => ((mask[b] as ArrayLike<number>)[t] === 0 ? 1 : k)),
    );
    Object.assign(metrics, rs.metrics);
  }
  Object.assign(metrics, computeOffpolicyMetrics(oldLogProbs, rolloutLogProbs, mask));
  return {
    weights,
    keep,
    metrics: Object.fromEntries(Object.entries(metrics).map(([k, v]) => [`rollout_corr/${k}`, v])),
  };
}
