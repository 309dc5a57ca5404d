/**
 * The run's charts as vega-lite specs: small pure functions from the rows of `metrics.jsonl`
 * to a spec (or null when none of the chart's metrics has a value yet). Rendering and
 * writing live in `plots.ts`; keeping the specs pure lets a test read them without drawing.
 *
 * A row is one JSON object per step with flat keys (`step`, `reward/mean`, `val/em/nq`, ...).
 * A key that is missing, null, non-numeric or not finite is absent, never zero. Rows are
 * merged per step, later values winning, so a step logged twice (a resumed run) or a
 * validation written as its own row with the step's number draws one point.
 */
import type { TopLevelSpec } from "vega-lite";

/** A row of metrics.jsonl as read back (metrics-log's MetricsRow fits): only finite numbers count. */
export type PlotRow = Readonly<Record<string, unknown>>;

/** One line of a chart: the metric key in metrics.jsonl and the label the legend shows. */
export interface Series {
  key: string;
  label: string;
}

/** The folded ("long") table every chart draws from: one row per step, series and value. */
export interface LongRow {
  step: number;
  series: string;
  value: number;
}

export interface ChartSpec {
  /** File stem: `<name>.svg` and `<name>.png`. */
  name: string;
  spec: TopLevelSpec;
}

/** Width of every chart in CSS pixels (the SVG; the PNG is this times its scale). */
export const PLOT_WIDTH = 640;

/**
 * The family of the font that `plots.ts` hands to the PNG renderer (bundled with the package, so
 * a machine without system fonts still draws every word); the SVG names it first so that both
 * images set text in the same face, and falls back to any sans-serif in a browser without it.
 */
export const PLOT_FONT_FAMILY = "DejaVu Sans";
const FONT = `'${PLOT_FONT_FAMILY}', sans-serif`;
/** Tableau 10, vega's default categorical scheme, listed so colours stay fixed per series. */
const PALETTE = [
  "#4c78a8",
  "#f58518",
  "#e45756",
  "#72b7b2",
  "#54a24b",
  "#eeca3b",
  "#b279a2",
  "#ff9da6",
  "#9d755d",
  "#bab0ac",
];

export const REWARD_SERIES: readonly Series[] = [
  { key: "reward/mean", label: "reward (mean)" },
  { key: "em/mean", label: "exact match (mean)" },
];
/** The one line drawn when reward and exact match are the same number at every step. */
export const REWARD_IS_EM: Series = { key: "reward/mean", label: "reward = exact match (mean)" };
/** Dashes of the reward chart's lines: exact match dashed, so where it runs on reward both show. */
const REWARD_DASHES: readonly (readonly number[])[] = [
  [1, 0],
  [7, 4],
];
export const COUNT_SERIES: readonly Series[] = [
  { key: "searches/mean", label: "searches" },
  { key: "turns/mean", label: "turns" },
];
export const RATIO_SERIES: readonly Series[] = [
  { key: "valid_action/ratio", label: "valid actions" },
  { key: "answer/ratio", label: "answered" },
];
export const LENGTH_SERIES: readonly Series[] = [
  { key: "response_length/mean", label: "mean" },
  { key: "response_length/max", label: "max" },
  { key: "response_length/min", label: "min" },
];
/**
 * What a collapsing run shows first (docs/commands/train.md, "Collapse warnings"): the
 * policy's entropy, the clip fraction, the gradient norm, the engine–trainer mismatch
 * (`rollout_corr/kl`, logged whenever the engine gives its log-probs) and, with dynamic
 * sampling, the share of groups dropped for carrying no signal.
 */
export const OPTIMISATION_SERIES: readonly Series[] = [
  { key: "actor/kl_loss", label: "KL loss" },
  { key: "actor/entropy", label: "entropy" },
  { key: "actor/pg_clipfrac", label: "clip fraction" },
  { key: "actor/grad_norm", label: "grad norm" },
  { key: "rollout_corr/kl", label: "engine–trainer KL" },
  { key: "train/filtered_group_ratio", label: "filtered groups" },
];
const VAL_PREFIX = "val/em/";
const VAL_MEAN: Series = { key: "val/em/mean", label: "mean over sources" };
const TIMING_PREFIX = "timing/";

/** Finite numbers only: anything else in a row counts as absent. */
function num(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}

/** Rows merged per step (later values win), in step order; rows without a numeric step are skipped. */
export function mergeBySteps(rows: readonly PlotRow[]): Map<number, Map<string, number>> {
  const bySteps = new Map<number, Map<string, number>>();
  for (const row of rows) {
    const step = num(row.step);
    if (step === undefined) continue;
    let merged = bySteps.get(step);
    if (merged === undefined) {
      merged = new Map();
      bySteps.set(step, merged);
    }
    for (const [key, value] of Object.entries(row)) {
      const v = num(value);
      if (key !== "step" && v !== undefined) merged.set(key, v);
    }
  }
  return new Map([...bySteps].sort((a, b) => a[0] - b[0]));
}

/** The long table of the given series: one entry per step where the series has a value. */
export function longTable(rows: readonly PlotRow[], series: readonly Series[]): LongRow[] {
  const out: LongRow[] = [];
  for (const [step, values] of mergeBySteps(rows)) {
    for (const s of series) {
      const value = values.get(s.key);
      if (value !== undefined) out.push({ step, series: s.label, value });
    }
  }
  return out;
}

/** The series (in the given order) that have at least one value. */
function present(data: readonly LongRow[], series: readonly Series[]): Series[] {
  const seen = new Set(data.map((d) => d.series));
  return series.filter((s) => seen.has(s.label));
}

/** "step 37: reward (mean) 0.612 · exact match (mean) 0.580" (each series' last value). */
function latestLine(data: readonly LongRow[], series: readonly Series[]): string {
  const last = new Map<string, LongRow>();
  for (const d of data) last.set(d.series, d);
  const rows = series.flatMap((s) => last.get(s.label) ?? []);
  const sameStep = rows.every((d) => d.step === rows[0]?.step);
  const parts = rows.map(
    (d) => `${d.series} ${formatValue(d.value)}${sameStep ? "" : ` (step ${d.step})`}`,
  );
  return `${sameStep ? `step ${rows[0]?.step}: ` : ""}${parts.join(" · ")}`;
}

function formatValue(v: number): string {
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return a >= 100 ? v.toFixed(0) : v.toFixed(3);
}

const CONFIG = {
  font: FONT,
  background: "white",
  title: { fontSize: 15, anchor: "start", offset: 8, subtitleFontSize: 11, subtitleColor: "#555" },
  axis: {
    labelFontSize: 11,
    titleFontSize: 12,
    titleFontWeight: "normal",
    gridColor: "#e8e8e8",
    domainColor: "#888",
    tickColor: "#888",
  },
  legend: {
    orient: "bottom",
    direction: "horizontal",
    labelFontSize: 12,
    labelLimit: 0,
    symbolType: "stroke",
    symbolSize: 400, // a 20-pixel stroke: long enough to show a dashed line as dashed
    symbolStrokeWidth: 3,
    columnPadding: 16,
  },
  header: { labelFontSize: 12, labelFontWeight: "bold" },
  view: { stroke: "#ddd" },
  line: { strokeWidth: 2 },
} as const;

const STEP_AXIS = {
  field: "step",
  type: "quantitative",
  title: "step",
  axis: { format: "d", tickMinStep: 1 },
} as const;

function colorEncoding(series: readonly Series[], range?: readonly string[]) {
  const domain = series.map((s) => s.label);
  return {
    field: "series",
    type: "nominal",
    title: null,
    sort: domain,
    scale: { domain, range: [...(range ?? PALETTE.slice(0, domain.length))] },
  } as const;
}

interface LineChartOptions {
  title: string;
  subtitle?: string;
  yTitle: string;
  data: LongRow[];
  series: readonly Series[];
  colors?: readonly string[];
  points?: boolean;
  yDomain?: readonly [number, number];
  zero?: boolean;
  /** Stroke dash per series (in `series` order); solid lines when absent. */
  dashes?: readonly (readonly number[])[];
}

/** One panel: lines (optionally with points) of the long table, coloured by series. */
function linePanel(o: LineChartOptions) {
  return {
    mark: { type: "line", point: o.points === true ? { size: 40, filled: true } : false },
    encoding: {
      x: STEP_AXIS,
      y: {
        field: "value",
        type: "quantitative",
        title: o.yTitle,
        scale:
          o.yDomain !== undefined
            ? { domain: [...o.yDomain] }
            : { zero: o.zero ?? false, nice: true },
      },
      color: colorEncoding(o.series, o.colors),
      ...(o.dashes === undefined ? {} : { strokeDash: dashEncoding(o.series, o.dashes) }),
    },
  } as const;
}

/** Dash by series; same field, title and domain as the colour, so the legend stays one. */
function dashEncoding(series: readonly Series[], dashes: readonly (readonly number[])[]) {
  const domain = series.map((s) => s.label);
  return {
    field: "series",
    type: "nominal",
    title: null,
    sort: domain,
    scale: { domain, range: domain.map((_, i) => [...(dashes[i % dashes.length] ?? [])]) },
  } as const;
}

/** Up to this many steps, lines also mark their points (one step alone would draw nothing). */
const POINTS_UP_TO_STEPS = 20;

function fewSteps(data: readonly LongRow[]): boolean {
  return new Set(data.map((d) => d.step)).size <= POINTS_UP_TO_STEPS;
}

/** A single-view line chart exactly PLOT_WIDTH wide (autosize fit-x), legend below. */
function lineChart(o: LineChartOptions): TopLevelSpec {
  return {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    title: o.subtitle === undefined ? o.title : { text: o.title, subtitle: o.subtitle },
    width: PLOT_WIDTH,
    height: 280,
    autosize: { type: "fit-x", contains: "padding" },
    padding: 12,
    config: CONFIG,
    data: { values: o.data },
    ...linePanel({ ...o, points: o.points ?? fewSteps(o.data) }),
  } as TopLevelSpec;
}

/** Equal within this, reward and exact match count as the same number (sums in another order). */
const SAME_VALUE = 1e-9;

/**
 * True when reward and exact match are both logged at the same steps (at least one) and are the
 * same number at each: an exact-match reward without format terms, as in the quickstart.
 */
export function rewardIsExactMatch(rows: readonly PlotRow[]): boolean {
  const [reward, em] = REWARD_SERIES as [Series, Series];
  let steps = 0;
  for (const values of mergeBySteps(rows).values()) {
    const r = values.get(reward.key);
    const e = values.get(em.key);
    if (r === undefined && e === undefined) continue;
    if (r === undefined || e === undefined || Math.abs(r - e) > SAME_VALUE) return false;
    steps++;
  }
  return steps > 0;
}

/**
 * reward.svg: reward mean and EM mean of the training batches vs step, exact match dashed over
 * solid reward so that a stretch where they agree still shows both. Where they agree at every
 * step, one line labelled "reward = exact match" instead of one line hiding the other.
 */
export function rewardSpec(rows: readonly PlotRow[]): TopLevelSpec | null {
  const same = rewardIsExactMatch(rows);
  const all = same ? [REWARD_IS_EM] : REWARD_SERIES;
  const data = longTable(rows, all);
  if (data.length === 0) return null;
  const series = present(data, all);
  return lineChart({
    title: "Reward and exact match (training batches)",
    subtitle: latestLine(data, series),
    yTitle: "score",
    data,
    series,
    zero: true,
    ...(series.length > 1 ? { dashes: REWARD_DASHES } : {}),
  });
}

/** The validation series: every `val/em/<source>` (sorted) then `val/em/mean`. */
export function validationSeries(rows: readonly PlotRow[]): Series[] {
  const sources = new Set<string>();
  for (const row of rows) {
    for (const [key, value] of Object.entries(row)) {
      if (key.startsWith(VAL_PREFIX) && key !== VAL_MEAN.key && num(value) !== undefined) {
        sources.add(key.slice(VAL_PREFIX.length));
      }
    }
  }
  return [...[...sources].sort().map((s) => ({ key: `${VAL_PREFIX}${s}`, label: s })), VAL_MEAN];
}

/** validation.svg: validation EM per data source and their mean vs step, points and lines. */
export function validationSpec(rows: readonly PlotRow[]): TopLevelSpec | null {
  const all = validationSeries(rows);
  const data = longTable(rows, all);
  if (data.length === 0) return null;
  const series = present(data, all);
  const sources = series.filter((s) => s !== VAL_MEAN);
  const colors = series.map((s) =>
    s === VAL_MEAN ? "#222222" : (PALETTE[sources.indexOf(s) % PALETTE.length] as string),
  );
  const mean = data.filter((d) => d.series === VAL_MEAN.label);
  const best = mean.reduce<LongRow | undefined>(
    (b, d) => (b === undefined || d.value > b.value ? d : b),
    undefined,
  );
  return lineChart({
    title: "Validation exact match",
    subtitle:
      best === undefined
        ? latestLine(data, series)
        : `mean over sources: ${formatValue(mean.at(-1)?.value ?? Number.NaN)} at step ${mean.at(-1)?.step}, best ${formatValue(best.value)} at step ${best.step}`,
    yTitle: "exact match",
    data,
    series,
    colors,
    points: true,
    yDomain: [0, 1],
  });
}

/** length.svg: response length (mean, and max/min where logged) in tokens vs step. */
export function lengthSpec(rows: readonly PlotRow[]): TopLevelSpec | null {
  const data = longTable(rows, LENGTH_SERIES);
  if (data.length === 0) return null;
  return lineChart({
    title: "Response length",
    yTitle: "tokens per trajectory",
    data,
    series: present(data, LENGTH_SERIES),
    zero: true,
  });
}

/** The `timing/<phase>` series in the order they first appear; `_s` dropped from labels. */
export function timingSeries(rows: readonly PlotRow[]): Series[] {
  const keys = new Set<string>();
  for (const row of rows) {
    for (const [key, value] of Object.entries(row)) {
      if (key.startsWith(TIMING_PREFIX) && num(value) !== undefined) keys.add(key);
    }
  }
  return [...keys].map((key) => {
    const label = key.slice(TIMING_PREFIX.length).replace(/_s$/, "").replaceAll("_", " ");
    return { key, label: label === "step" ? "whole step" : label };
  });
}

/** timing.svg: seconds per step and per phase (every `timing/*` key) vs step. */
export function timingSpec(rows: readonly PlotRow[]): TopLevelSpec | null {
  // At most as many phases as the palette has colours, in the order they were logged.
  const all = timingSeries(rows).slice(0, PALETTE.length);
  const data = longTable(rows, all);
  if (data.length === 0) return null;
  return lineChart({
    title: "Time per step",
    yTitle: "seconds",
    data,
    series: present(data, all),
    zero: true,
  });
}

/** Width of one panel in a composed chart so the whole stays close to PLOT_WIDTH. */
const CONCAT_PANEL_WIDTH = PLOT_WIDTH - 94;

/**
 * behaviour.svg: two panels over the same steps: searches and turns per trajectory (counts),
 * then the shares of valid actions and of answered trajectories (0..1). One legend for both.
 * A panel whose metrics are all absent is left out.
 */
export function behaviourSpec(rows: readonly PlotRow[]): TopLevelSpec | null {
  const counts = longTable(rows, COUNT_SERIES);
  const ratios = longTable(rows, RATIO_SERIES);
  const panels: object[] = [];
  const countSeries = present(counts, COUNT_SERIES);
  const ratioSeries = present(ratios, RATIO_SERIES);
  const all = [...countSeries, ...ratioSeries];
  const colors = all.map((_, i) => PALETTE[i] as string);
  const panel = (data: LongRow[], yTitle: string, yDomain?: readonly [number, number]) => {
    const points = fewSteps(data);
    const p = linePanel({
      title: "",
      yTitle,
      data,
      series: all,
      colors,
      yDomain,
      zero: true,
      points,
    });
    return { width: CONCAT_PANEL_WIDTH, height: 170, data: { values: data }, ...p };
  };
  if (counts.length > 0) panels.push(panel(counts, "per trajectory (mean)"));
  if (ratios.length > 0) panels.push(panel(ratios, "share of trajectories", [0, 1]));
  if (panels.length === 0) return null;
  return {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    title: "Search behaviour",
    padding: 12,
    spacing: 18,
    config: CONFIG,
    vconcat: panels,
  } as TopLevelSpec;
}

/**
 * optimisation.svg: KL loss, entropy, clip fraction, grad norm, the engine–trainer KL and
 * the filtered-group share as small multiples (a facet over the folded table, two columns,
 * each panel with its own y scale), a panel for each that was logged.
 */
export function optimisationSpec(rows: readonly PlotRow[]): TopLevelSpec | null {
  const data = longTable(rows, OPTIMISATION_SERIES);
  if (data.length === 0) return null;
  const series = present(data, OPTIMISATION_SERIES);
  const columns = series.length === 1 ? 1 : 2;
  const width = columns === 1 ? CONCAT_PANEL_WIDTH : Math.floor((PLOT_WIDTH - 130) / 2);
  const points = fewSteps(data);
  const { mark, encoding } = linePanel({ title: "", yTitle: "", data, series, points });
  return {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    title: "Optimisation and stability",
    padding: 12,
    config: CONFIG,
    data: { values: data },
    facet: {
      field: "series",
      type: "nominal",
      title: null,
      sort: series.map((s) => s.label),
    },
    columns,
    spacing: { row: 16, column: 24 },
    spec: {
      width,
      height: 140,
      mark,
      encoding: {
        ...encoding,
        y: { ...encoding.y, title: null },
        color: { ...encoding.color, legend: null },
      },
    },
    resolve: { scale: { y: "independent" }, axis: { x: "independent" } },
  } as TopLevelSpec;
}

/** Every chart that has data, in a fixed order. */
export function chartSpecs(rows: readonly PlotRow[]): ChartSpec[] {
  const charts: [string, (rows: readonly PlotRow[]) => TopLevelSpec | null][] = [
    ["reward", rewardSpec],
    ["validation", validationSpec],
    ["behaviour", behaviourSpec],
    ["length", lengthSpec],
    ["optimisation", optimisationSpec],
    ["timing", timingSpec],
  ];
  return charts.flatMap(([name, make]) => {
    const spec = make(rows);
    return spec === null ? [] : [{ name, spec }];
  });
}
