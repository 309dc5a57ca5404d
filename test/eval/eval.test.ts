import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { parquetWriteFile } from "hyparquet-writer";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { EvalRecord } from "../../src/eval/record.js";
import { SUMMARY_FIELDS } from "../../src/eval/report.js";
import { EOS, AGENT_MODEL as MODEL, agentTokenizer as tokenizer } from "../agent/helpers.js";
import { startScriptedEngine } from "../agent/scripted-engine.js";
import { type CliResult, runCli, startCli } from "../helpers/cli.js";
import { preprocessQa } from "../helpers/qa-data.js";
import { type RunningRetriever, type ServedIndex, serveTestIndex } from "../retrieval/helpers.js";

const QUESTIONS = {
  nq: [
    {
      id: "test_0",
      question: "who played brian in the fast and the furious",
      golden_answers: ["Paul Walker"],
    },
    { id: "test_1", question: "largest city in switzerland", golden_answers: ["Zürich", "Zurich"] },
    { id: "test_2", question: "what is copy", golden_answers: ["duplicatum"] },
    { id: "test_3", question: "who is brian o'conner", golden_answers: ["a character"] },
  ],
  hotpotqa: [
    { id: "test_0", question: "which lake is zurich at", golden_answers: ["Lake Zürich"] },
    { id: "test_1", question: "what franchise", golden_answers: ["The Fast and the Furious"] },
    { id: "test_2", question: "paul walker's first name", golden_answers: ["Paul"] },
  ],
};

/** Budgets for the scripted engine: room for its replies and the first document. */
const SCRIPTED = [
  "data.max_prompt_length=400",
  "data.max_response_length=40",
  "data.max_obs_length=120",
  "rollout.max_turns=2",
];

/** Small budgets: the fixture model's context is 512 tokens, and CI has two cores. */
const BUDGET = [
  "data.max_prompt_length=400",
  "data.max_response_length=12",
  "data.max_obs_length=48",
  "rollout.max_turns=2",
];

let dir: string;
let data: string;
let served: ServedIndex;
let retriever: RunningRetriever;

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-eval-"));
  data = preprocessQa(dir, {
    nq: { test: QUESTIONS.nq },
    hotpotqa: { test: QUESTIONS.hotpotqa },
  }).test;
  served = await serveTestIndex();
  retriever = served.server;
}, 120_000);

afterAll(async () => {
  await served?.close();
  rmSync(dir, { recursive: true, force: true });
});

const readRecords = (out: string): EvalRecord[] =>
  readFileSync(path.join(out, "trajectories.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as EvalRecord);

/** The report recomputed from trajectories.jsonl, independently of src/eval/report.ts. */
function recompute(records: EvalRecord[]) {
  const sources: Record<string, Record<string, number>> = {};
  for (const source of new Set(records.map((r) => r.data_source))) {
    const list = records.filter((r) => r.data_source === source);
    const mean = (f: (r: EvalRecord) => number) => list.reduce((s, r) => s + f(r), 0) / list.length;
    sources[source] = {
      n: list.length,
      em: mean((r) => r.em),
      subem: mean((r) => r.subem),
      f1: mean((r) => r.f1),
      searches: mean(
        (r) => r.turns.filter((t) => t.action === "search" && t.observation !== "").length,
      ),
      turns: mean((r) => r.turns.length),
      response_tokens: mean((r) => r.response_tokens),
      no_answer: mean((r) => (r.prediction === null ? 1 : 0)),
      invalid_actions: mean((r) => r.turns.filter((t) => t.action === "invalid").length),
    };
  }
  return sources;
}

async function runCliAsync(args: string[]): Promise<CliResult> {
  return startCli(args).result;
}

describe("searchr1 eval with the real native engine and the real BM25 server", () => {
  const out = () => path.join(dir, "real");
  const args = () => [
    "eval",
    "--model",
    MODEL,
    "--data",
    data,
    "--retriever-url",
    retriever.url,
    "--out",
    out(),
    "rollout.engine_device=cpu",
    "rollout.engine_threads=1",
    ...BUDGET,
  ];

  it("starts the engine, evaluates every question, and the report equals a recomputation", async () => {
    const r = runCli(args());
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/evaluating 7 questions/);
    expect(r.stdout).toMatch(/\| nq \| 4 \|/);
    const records = readRecords(out());
    expect(records).toHaveLength(7);
    const report = JSON.parse(readFileSync(path.join(out(), "report.json"), "utf8"));
    const expected = recompute(records);
    expect(Object.keys(report.sources)).toEqual(["hotpotqa", "nq"]);
    for (const [source, summary] of Object.entries(expected)) {
      for (const [field, value] of Object.entries(summary)) {
        expect(report.sources[source][field], `${source}.${field}`).toBeCloseTo(value, 12);
      }
    }
    for (const field of SUMMARY_FIELDS) {
      const avg = (expected.nq?.[field] as number) / 2 + (expected.hotpotqa?.[field] as number) / 2;
      expect(report.average[field]).toBeCloseTo(avg, 12);
    }
    expect(report.average.n).toBe(7);
    expect(readFileSync(path.join(out(), "report.md"), "utf8")).toMatch(
      /\| \*\*average\*\* \| 7 \|/,
    );
    for (const rec of records) {
      expect(Object.keys(rec)).toEqual(
        expect.arrayContaining([
          "id",
          "data_source",
          "question",
          "golden_answers",
          "prediction",
          "em",
          "subem",
          "f1",
          "response",
          "turns",
          "searches",
          "finish_reason",
        ]),
      );
      expect(rec.turns.length).toBeGreaterThan(0);
      expect(rec.turns.length).toBeLessThanOrEqual(3);
    }
  }, 180_000);

  it("resumes: a re-run skips finished questions and redoes the rest (greedy: identical records)", async () => {
    const file = path.join(out(), "trajectories.jsonl");
    const lines = readFileSync(file, "utf8")
      .split("\n")
      .filter((l) => l);
    // Three questions lost, and the last line torn by an interruption.
    writeFileSync(file, `${lines.slice(0, 4).join("\n")}\n${lines[4]?.slice(0, 20)}`);
    const r = runCli(args());
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/resuming in .*: 4 of 7 questions already done/);
    const again = readFileSync(file, "utf8")
      .split("\n")
      .filter((l) => l);
    expect(again).toHaveLength(7);
    const key = (l: string) => {
      const rec = JSON.parse(l) as EvalRecord;
      return `${rec.data_source}/${rec.id}`;
    };
    const byKey = new Map(lines.map((l) => [key(l), l]));
    for (const line of again) expect(line).toBe(byKey.get(key(line)));
  }, 180_000);
});

describe("searchr1 eval against a scripted engine (exact numbers)", () => {
  /** Searches once, then answers the gold of nq questions and a wrong answer otherwise. */
  async function engine() {
    return startScriptedEngine(tokenizer, EOS, (context) => {
      // The prompt itself mentions <information>: look for a document instead.
      if (!context.includes("Doc 1(Title:")) {
        return { text: "<think> search </think>\n<search> Paul Walker </search>" };
      }
      const nq = QUESTIONS.nq.find((q) => context.includes(q.question));
      return { text: `<answer> ${nq ? nq.golden_answers[0] : "no idea"} </answer>`, eos: true };
    });
  }

  /** eval against the scripted engine at `url`, into `out`. */
  const scriptedEval = (url: string, out: string, extra: string[] = []) =>
    runCliAsync([
      ...["eval", "--model", MODEL, "--data", data, "--retriever-url", retriever.url],
      ...["--out", out, "--engine-url", url, ...SCRIPTED, ...extra],
    ]);

  it("scores per source, averages over sources, and --compare pairs two runs", async () => {
    const scripted = await engine();
    try {
      const outA = path.join(dir, "scripted-a");
      const r = await scriptedEval(scripted.url, outA);
      expect(r.code, r.stderr).toBe(0);
      const report = JSON.parse(readFileSync(path.join(outA, "report.json"), "utf8"));
      expect(report.sources.nq.em).toBe(1);
      expect(report.sources.hotpotqa.em).toBe(0);
      expect(report.average.em).toBe(0.5);
      expect(report.sources.nq.searches).toBe(1);
      expect(report.sources.nq.turns).toBe(2);
      expect(report.sources.nq.no_answer).toBe(0);
      const rec = readRecords(outA).find(
        (x) => x.data_source === "nq" && x.id === "test_0",
      ) as EvalRecord;
      expect(rec.prediction).toBe("Paul Walker");
      expect(rec.turns[0]?.action).toBe("search");
      expect(rec.turns[0]?.documents[0]?.id).toBe("0");
      expect(rec.response).toContain('</search>\n\n<information>Doc 1(Title: "Paul Walker")');
      // Generation stopped at the stop string "</answer>", before the scripted EOS.
      expect(rec.response.endsWith("<answer> Paul Walker </answer>")).toBe(true);

      // --sources and --limit select questions.
      const outB = path.join(dir, "scripted-b");
      const b = await scriptedEval(scripted.url, outB, ["--sources", "nq", "--limit", "2"]);
      expect(b.code, b.stderr).toBe(0);
      expect(
        readRecords(outB)
          .map((x) => x.id)
          .sort(),
      ).toEqual(["test_0", "test_1"]);

      const cmp = runCli(["eval", "--compare", outA, outB]);
      expect(cmp.code, cmp.stderr).toBe(0);
      expect(cmp.stdout).toMatch(/^nq\s+2\s+1\.000\s+1\.000\s+\+0\.000\s+\[\+0\.000, \+0\.000\]/m);
      expect(cmp.stdout).not.toMatch(/^hotpotqa/m);
    } finally {
      await scripted.close();
    }
  }, 120_000);

  it("bad input and unreachable servers are one-line errors naming them", async () => {
    const base = ["eval", "--model", MODEL, "--retriever-url", retriever.url, ...BUDGET];
    const missing = runCli([
      ...base,
      "--data",
      path.join(dir, "nope.parquet"),
      "--out",
      path.join(dir, "x"),
    ]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/nope\.parquet: no such file/);

    const noReward = path.join(dir, "no-reward.parquet");
    await parquetWriteFile({
      filename: noReward,
      columnData: [
        { name: "data_source", data: ["nq"], type: "STRING" },
        { name: "question", data: ["q?"], type: "STRING" },
      ],
    });
    const bad = runCli([...base, "--data", noReward, "--out", path.join(dir, "y")]);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/no-reward\.parquet.*reward_model\.ground_truth\.target is missing/);

    const gpus = runCli([...base, "--data", data, "--out", path.join(dir, "g"), "--gpus", "2"]);
    expect(gpus.code).toBe(2);
    expect(gpus.stderr).toMatch(/gpus=2: eval runs one engine on one device/);
    expect(existsSync(path.join(dir, "g"))).toBe(false);

    const noModel = runCli(["eval", "--data", data]);
    expect(noModel.code).toBe(2);
    expect(noModel.stderr).toMatch(/model\.path.*--model/);

    const deadEngine = runCli([
      ...base,
      "--data",
      data,
      "--out",
      path.join(dir, "z"),
      "--engine-url",
      "http://127.0.0.1:9",
    ]);
    expect(deadEngine.code).toBe(1);
    expect(deadEngine.stderr).toMatch(
      /engine http:\/\/127\.0\.0\.1:9\/generate is unreachable: connection refused/,
    );
    expect(deadEngine.stderr.trim().split("\n").at(-1)).toMatch(/^searchr1 eval: |unreachable/);

    const scripted = await engine();
    try {
      const deadRetriever = await runCliAsync([
        "eval",
        "--model",
        MODEL,
        "--data",
        data,
        "--out",
        path.join(dir, "w"),
        "--engine-url",
        scripted.url,
        "--retriever-url",
        "http://127.0.0.1:9/retrieve",
        "retriever.max_retries=1",
        ...SCRIPTED,
      ]);
      expect(deadRetriever.code).toBe(1);
      expect(deadRetriever.stderr).toMatch(
        /retriever http:\/\/127\.0\.0\.1:9\/retrieve failed 2 times \(connection refused/,
      );
    } finally {
      await scripted.close();
    }
  }, 120_000);
});
