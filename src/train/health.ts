/**
 * The signs of a run that learns and then falls apart, read from each step's metrics: a
 * metric that is not finite, the policy's entropy collapsing, the gradient norm spiking.
 * Pure functions over the rows of metrics.jsonl, and `RunHealth`, which keeps the little
 * history they need (fed the rows a resumed run already has, so the first steps' entropy is
 * the run's and not the resumed process's). `train` prints each warning as one line and,
 * with trainer.stop_on_nan, stops on a non-finite metric before checkpointing its step.
 *
 * The rules (docs/commands/train.md, "Collapse warnings"):
 * - **Not finite**: a metric that is NaN or ±Infinity. The trainer reports such a value as
 *   null (JSON has no NaN), so a null `actor/*` or `critic/*` metric counts too, except the
 *   keys that are null by design (`actor/kl_loss` without a KL loss: `nullable`).
 * - **Entropy collapse**: `actor/entropy` below ENTROPY_COLLAPSE_RATIO (0.1) times its
 *   baseline, the mean of the first ENTROPY_BASELINE_STEPS (5) training steps that logged a
 *   finite entropy; checked from the step after the baseline is complete. Said once when it
 *   falls below, and again only after it has come back above.
 * - **Gradient-norm spike**: `actor/grad_norm` (or `critic/grad_norm`) above
 *   GRAD_NORM_SPIKE_FACTOR (10) times the median of its previous GRAD_NORM_WINDOW (20)
 *   finite values, once it has at least GRAD_NORM_MIN_HISTORY (5) of them. Said at every
 *   step that spikes (the norm is the one before clipping, as the trainer reports it).
 */
export const ENTROPY_KEY = "actor/entropy";
export const ENTROPY_BASELINE_STEPS = 5;
export const ENTROPY_COLLAPSE_RATIO = 0.1;
export const GRAD_NORM_KEYS = ["actor/grad_norm", "critic/grad_norm"] as const;
export const GRAD_NORM_WINDOW = 20;
export const GRAD_NORM_MIN_HISTORY = 5;
export const GRAD_NORM_SPIKE_FACTOR = 10;
/** Metrics the trainer computes: null there means NaN or ±Inf (protocol.ts, `Metric`). */
const TRAINER_PREFIXES = ["actor/", "critic/"];

type Row = Readonly<Record<string, unknown>>;

/** A finite number, or undefined for anything else (absent, null, NaN, ±Inf, not a number). */
function finite(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}

/**
 * The metrics of a row that are not finite, in the row's order: a number that is NaN or
 * ±Infinity, or null under `actor/` or `critic/` (the trainer's NaN/Inf) unless the key is
 * in `nullable`. `step` and `epoch` are not metrics.
 */
export function nonFiniteMetrics(row: Row, nullable: ReadonlySet<string> = new Set()): string[] {
  return Object.entries(row).flatMap(([key, v]) => {
    if (key === "step" || key === "epoch") return [];
    if (typeof v === "number") return Number.isFinite(v) ? [] : [key];
    if (v === null && TRAINER_PREFIXES.some((p) => key.startsWith(p)) && !nullable.has(key)) {
      return [key];
    }
    return [];
  });
}

/** The median of a non-empty list (the mean of the middle two for an even length). */
export function median(xs: readonly number[]): number {
  const sorted = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1
    ? (sorted[mid] as number)
    : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

/**
 * The entropy baseline: the mean of the first ENTROPY_BASELINE_STEPS values (the run's first
 * training steps with a finite entropy, in step order); null until there are that many.
 */
export function entropyBaseline(firstEntropies: readonly number[]): number | null {
  if (firstEntropies.length < ENTROPY_BASELINE_STEPS) return null;
  const first = firstEntropies.slice(0, ENTROPY_BASELINE_STEPS);
  return first.reduce((a, b) => a + b, 0) / first.length;
}

/** True when `entropy` is below ENTROPY_COLLAPSE_RATIO × a positive baseline. */
export function entropyCollapsed(entropy: number, baseline: number): boolean {
  return baseline > 0 && entropy < ENTROPY_COLLAPSE_RATIO * baseline;
}

/**
 * The median of the previous values when `current` is above GRAD_NORM_SPIKE_FACTOR times it
 * (the last GRAD_NORM_WINDOW of `previous`, at least GRAD_NORM_MIN_HISTORY of them); null
 * otherwise.
 */
export function gradNormSpike(previous: readonly number[], current: number): number | null {
  const window = previous.slice(-GRAD_NORM_WINDOW);
  if (window.length < GRAD_NORM_MIN_HISTORY) return null;
  const m = median(window);
  return current > GRAD_NORM_SPIKE_FACTOR * m ? m : null;
}

/** A value as the warnings print it: 3 significant digits, NaN/Infinity/null spelled out. */
export function formatMetric(v: unknown): string {
  if (v === null) return "null";
  if (typeof v !== "number") return String(v);
  if (!Number.isFinite(v) || v === 0) return String(v);
  const a = Math.abs(v);
  return a < 1e-3 || a >= 1e5 ? v.toExponential(2) : Number(v.toPrecision(3)).toString();
}

export interface HealthReport {
  /** The row's non-finite metrics (nonFiniteMetrics). */
  nonFinite: string[];
  /** One line each, without a "warning:" prefix. */
  warnings: string[];
}

/** The history the checks need, fed one row per step in step order. */
export class RunHealth {
  /** The first ENTROPY_BASELINE_STEPS finite entropies of training steps, and their steps. */
  private readonly firstEntropy: { step: number; value: number }[] = [];
  private collapsed = false;
  private readonly gradNorms = new Map<string, number[]>();

  constructor(private readonly nullable: ReadonlySet<string> = new Set()) {}

  /** Rows logged before this process (a resumed run's metrics.jsonl): history, no warnings. */
  replay(rows: readonly Row[]): void {
    for (const row of rows) this.observe(row);
  }

  /** Checks one step's row against the history, then adds it to the history. */
  observe(row: Row): HealthReport {
    const step = finite(row.step) ?? 0;
    const nonFinite = nonFiniteMetrics(row, this.nullable);
    const warnings: string[] = [];
    if (nonFinite.length > 0) {
      const fromTrainer = nonFinite.some((k) => row[k] === null);
      warnings.push(
        `step ${step}: not finite: ${nonFinite.map((k) => `${k}=${formatMetric(row[k])}`).join(", ")}` +
          (fromTrainer ? " (the trainer reports NaN and ±Inf as null)" : ""),
      );
    }

    const entropy = finite(row[ENTROPY_KEY]);
    if (entropy !== undefined && step > 0) {
      const baseline = entropyBaseline(this.firstEntropy.map((e) => e.value));
      if (baseline === null) {
        this.firstEntropy.push({ step, value: entropy });
      } else if (entropyCollapsed(entropy, baseline)) {
        if (!this.collapsed) {
          const steps = this.firstEntropy.map((e) => e.step);
          warnings.push(
            `step ${step}: entropy collapse: ${ENTROPY_KEY} ${formatMetric(entropy)} is below ` +
              `${ENTROPY_COLLAPSE_RATIO} × its mean over steps ${steps[0]}–${steps.at(-1)} ` +
              `(${formatMetric(baseline)}); the policy has almost stopped exploring`,
          );
        }
        this.collapsed = true;
      } else {
        this.collapsed = false;
      }
    }

    for (const key of GRAD_NORM_KEYS) {
      const norm = finite(row[key]);
      if (norm === undefined) continue;
      const previous = this.gradNorms.get(key) ?? [];
      const m = gradNormSpike(previous, norm);
      if (m !== null) {
        const n = Math.min(previous.length, GRAD_NORM_WINDOW);
        warnings.push(
          `step ${step}: gradient-norm spike: ${key} ${formatMetric(norm)} is above ` +
            `${GRAD_NORM_SPIKE_FACTOR} × the median of its previous ${n} steps (${formatMetric(m)})`,
        );
      }
      previous.push(norm);
      if (previous.length > GRAD_NORM_WINDOW) previous.shift();
      this.gradNorms.set(key, previous);
    }
    return { nonFinite, warnings };
  }
}

/** The keys of a train run's rows that are null by design (nonFiniteMetrics' `nullable`). */
export function nullableMetrics(useKlLoss: boolean): Set<string> {
  return new Set(useKlLoss ? [] : ["actor/kl_loss"]);
}
