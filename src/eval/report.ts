import type { EvalRecord } from "./record.js";

/** Per data source: questions, then means per question (no_answer is a share). */
export interface SourceSummary {
  n: number;
  em: number;
  subem: number;
  f1: number;
  searches: number;
  turns: number;
  response_tokens: number;
  no_answer: number;
  invalid_actions: number;
}

export interface Report {
  sources: Record<string, SourceSummary>;
  /** Each field's mean over the sources (the paper's "Avg." column); n is the total. */
  average: SourceSummary;
  config: Record<string, unknown>;
}

export const SUMMARY_FIELDS = [
  "em",
  "subem",
  "f1",
  "searches",
  "turns",
  "response_tokens",
  "no_answer",
  "invalid_actions",
] as const satisfies readonly (keyof SourceSummary)[];

/** What one record adds to its source's means. */
export function recordValues(r: EvalRecord): Record<(typeof SUMMARY_FIELDS)[number], number> {
  return {
    em: r.em,
    subem: r.subem,
    f1: r.f1,
    searches: r.searches,
    turns: r.turns.length,
    response_tokens: r.response_tokens,
    no_answer: r.prediction === null ? 1 : 0,
    invalid_actions: r.invalid_actions,
  };
}

/** The report of a set of records, sources in name order; floats unrounded. */
export function summarize(records: readonly EvalRecord[], config: Record<string, unknown>): Report {
  const bySource = new Map<string, EvalRecord[]>();
  for (const r of records) {
    const list = bySource.get(r.data_source) ?? [];
    list.push(r);
    bySource.set(r.data_source, list);
  }
  const sources: Record<string, SourceSummary> = {};
  for (const name of [...bySource.keys()].sort()) {
    const list = bySource.get(name) as EvalRecord[];
    const summary = { n: list.length } as SourceSummary;
    for (const field of SUMMARY_FIELDS) {
      summary[field] = list.reduce((sum, r) => sum + recordValues(r)[field], 0) / list.length;
    }
    sources[name] = summary;
  }
  const all = Object.values(sources);
  const average = { n: all.reduce((sum, s) => sum + s.n, 0) } as SourceSummary;
  for (const field of SUMMARY_FIELDS) {
    average[field] = all.length ? all.reduce((sum, s) => sum + s[field], 0) / all.length : 0;
  }
  return { sources, average, config };
}

const COLUMNS: { field: keyof SourceSummary; title: string; digits: number }[] = [
  { field: "n", title: "questions", digits: 0 },
  { field: "em", title: "EM", digits: 3 },
  { field: "subem", title: "sub-EM", digits: 3 },
  { field: "f1", title: "F1", digits: 3 },
  { field: "searches", title: "searches", digits: 2 },
  { field: "turns", title: "turns", digits: 2 },
  { field: "response_tokens", title: "response tokens", digits: 0 },
  { field: "no_answer", title: "no answer", digits: 3 },
  { field: "invalid_actions", title: "invalid actions", digits: 2 },
];

/** The per-source table with the average row, in Markdown (also what eval prints). */
export function reportTable(report: Report): string {
  const row = (name: string, s: SourceSummary) =>
    `| ${name} | ${COLUMNS.map((c) => s[c.field].toFixed(c.digits)).join(" | ")} |`;
  return [
    `| source | ${COLUMNS.map((c) => c.title).join(" | ")} |`,
    `|---|${COLUMNS.map(() => "---:").join("|")}|`,
    ...Object.entries(report.sources).map(([name, s]) => row(name, s)),
    row("**average**", report.average),
  ].join("\n");
}

/** report.md: the table, what its numbers are, and the settings of the run. */
export function reportMarkdown(report: Report): string {
  return [
    "# searchr1 eval",
    "",
    reportTable(report),
    "",
    "Means per question; the average row is the mean over sources (as the Search-R1 paper " +
      "averages), with the total number of questions.",
    "",
    "```json",
    JSON.stringify(report.config, null, 2),
    "```",
    "",
  ].join("\n");
}
