import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { InputError, UsageError } from "../runtime/errors.js";
import { Rng } from "../runtime/rng.js";
import { table } from "../runtime/table.js";
import type { EvalRecord } from "./record.js";
import { readRecords, TRAJECTORIES } from "./run.js";

/** Bootstrap resamples: enough for the second decimal of a 95% interval. */
const RESAMPLES = 2000;

export interface SourceComparison {
  source: string;
  /** Questions both runs answered (the paired set). */
  n: number;
  emA: number;
  emB: number;
  /** 95% paired-bootstrap interval of emB − emA. */
  low: number;
  high: number;
  f1A: number;
  f1B: number;
  searchesA: number;
  searchesB: number;
}

/**
 * `searchr1 eval --compare A B`: the questions both runs answered, paired by data source and
 * id, per source and averaged over sources as the paper averages; the EM difference with a
 * 95% paired bootstrap interval (questions resampled with replacement within each source).
 */
export function compareRuns(runs: readonly string[], seed = 1): SourceComparison[] {
  if (runs.length !== 2) {
    throw new UsageError(`--compare takes two eval output folders, got ${runs.length}`);
  }
  const [a, b] = runs.map((dir) => byKey(loadRun(dir)));
  const sources = new Map<string, [EvalRecord, EvalRecord][]>();
  for (const [key, ra] of a as Map<string, EvalRecord>) {
    const rb = (b as Map<string, EvalRecord>).get(key);
    if (!rb) continue;
    const list = sources.get(ra.data_source) ?? [];
    list.push([ra, rb]);
    sources.set(ra.data_source, list);
  }
  if (sources.size === 0) {
    throw new InputError(
      `${runs[0]} and ${runs[1]} have no question in common (paired by data_source and id)`,
    );
  }
  const rng = new Rng(seed);
  const names = [...sources.keys()].sort();
  const pairs = names.map((s) => sources.get(s) as [EvalRecord, EvalRecord][]);
  const rows = names.map((source, i) => {
    const list = pairs[i] as [EvalRecord, EvalRecord][];
    const deltas = bootstrap([list], rng);
    return summarizePairs(source, list, deltas);
  });
  // The average row: the mean over sources, resampled within each source.
  const average = rows.reduce(
    (acc, r) => {
      for (const k of ["n", "emA", "emB", "f1A", "f1B", "searchesA", "searchesB"] as const) {
        acc[k] += k === "n" ? r[k] : r[k] / rows.length;
      }
      return acc;
    },
    {
      source: "average",
      n: 0,
      emA: 0,
      emB: 0,
      low: 0,
      high: 0,
      f1A: 0,
      f1B: 0,
      searchesA: 0,
      searchesB: 0,
    },
  );
  const interval = percentiles(bootstrap(pairs, rng));
  rows.push({ ...average, low: interval[0], high: interval[1] });
  return rows;
}

function summarizePairs(
  source: string,
  list: [EvalRecord, EvalRecord][],
  deltas: number[],
): SourceComparison {
  const mean = (f: (p: [EvalRecord, EvalRecord]) => number) =>
    list.reduce((s, p) => s + f(p), 0) / list.length;
  const [low, high] = percentiles(deltas);
  return {
    source,
    n: list.length,
    emA: mean((p) => p[0].em),
    emB: mean((p) => p[1].em),
    low,
    high,
    f1A: mean((p) => p[0].f1),
    f1B: mean((p) => p[1].f1),
    searchesA: mean((p) => p[0].searches),
    searchesB: mean((p) => p[1].searches),
  };
}

/** Resampled values of the mean over groups of each group's mean EM difference (B − A). */
function bootstrap(groups: readonly (readonly [EvalRecord, EvalRecord][])[], rng: Rng): number[] {
  const out: number[] = [];
  for (let r = 0; r < RESAMPLES; r++) {
    let total = 0;
    for (const list of groups) {
      let sum = 0;
      for (let i = 0; i < list.length; i++) {
        const [ra, rb] = list[rng.int(list.length)] as [EvalRecord, EvalRecord];
        sum += rb.em - ra.em;
      }
      total += sum / list.length;
    }
    out.push(total / groups.length);
  }
  return out;
}

/** The 2.5th and 97.5th percentiles. */
function percentiles(values: number[]): [number, number] {
  const sorted = [...values].sort((x, y) => x - y);
  const at = (q: number) =>
    sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number;
  return [at(0.025), at(0.975)];
}

function loadRun(dir: string): EvalRecord[] {
  const file = join(resolve(dir), TRAJECTORIES);
  if (!existsSync(file)) {
    throw new InputError(
      `${file}: no such file; --compare takes the output folders of two eval runs`,
    );
  }
  return readRecords(file);
}

function byKey(records: EvalRecord[]): Map<string, EvalRecord> {
  return new Map(records.map((r) => [`${r.data_source}/${r.id}`, r]));
}

/** The comparison as a text table for the terminal. */
export function comparisonTable(
  rows: readonly SourceComparison[],
  names: readonly string[],
): string {
  const signed = (x: number) => `${x >= 0 ? "+" : ""}${x.toFixed(3)}`;
  const header = ["source", "n", "EM A", "EM B", "ΔEM", "95% CI", "F1 A", "F1 B", "searches A → B"];
  const body = rows.map((r) => [
    r.source,
    String(r.n),
    r.emA.toFixed(3),
    r.emB.toFixed(3),
    signed(r.emB - r.emA),
    `[${signed(r.low)}, ${signed(r.high)}]`,
    r.f1A.toFixed(3),
    r.f1B.toFixed(3),
    `${r.searchesA.toFixed(2)} → ${r.searchesB.toFixed(2)}`,
  ]);
  const lines = table([header, ...body], new Set([1, 2, 3, 4, 6, 7]));
  return [`A = ${names[0]}`, `B = ${names[1]}`, "", ...lines].join("\n");
}
