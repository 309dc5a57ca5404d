// `eval --lora` and `ask --lora` (model.lora_adapter_path): the agent runs with a PEFT adapter
// served unmerged over the model, by the native engine eval starts or by a running
// serve-engine (SGLang's /load_lora_adapter). The reference is the same adapter merged into
// the model by `searchr1 convert peft-to-hf`: greedy runs must give its trajectories, token
// for token, and differ from the base's. The adapter is a random one in PEFT's format for
// the agent's fixture model (every linear layer, r 4), so that it changes what the model says.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import type { EvalRecord } from "../../src/eval/record.js";
import { AGENT_MODEL as MODEL } from "../agent/helpers.js";
import { type RunningEngine, startEngine } from "../engine/helpers.js";
import { runCli, startCli } from "../helpers/cli.js";
import { request } from "../helpers/http.js";
import { writeRandomAdapter } from "../helpers/peft-adapter.js";
import { preprocessQa } from "../helpers/qa-data.js";
import { type ServedIndex, serveTestIndex } from "../retrieval/helpers.js";

const QUESTIONS = [
  {
    id: "test_0",
    question: "who played brian in the fast and the furious",
    golden_answers: ["Paul Walker"],
  },
  { id: "test_1", question: "largest city in switzerland", golden_answers: ["Zurich"] },
  { id: "test_2", question: "which lake is zurich at", golden_answers: ["Lake Zürich"] },
];
/** The fixture model's context is 512 tokens, and CI has two cores. */
const BUDGET = [
  "data.max_prompt_length=400",
  "data.max_response_length=16",
  "data.max_obs_length=48",
  "rollout.max_turns=2",
  "rollout.engine_device=cpu",
  "rollout.engine_threads=1",
];

let dir: string;
let data: string;
let adapter: string;
let merged: string;
let served: ServedIndex;

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-eval-lora-"));
  data = preprocessQa(dir, { nq: { test: QUESTIONS } }).test;
  adapter = path.join(dir, "adapter");
  await writeRandomAdapter(MODEL, adapter, { rank: 4, seed: 11, std: 0.3 });
  merged = path.join(dir, "merged");
  const merge = runCli([
    "convert",
    "peft-to-hf",
    "--input",
    adapter,
    "--hf-base",
    MODEL,
    "--out",
    merged,
  ]);
  expect(merge.code, merge.stderr).toBe(0);
  served = await serveTestIndex();
}, 60_000);

afterAll(async () => {
  await served?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** eval's records into `out`, keyed by question, with the extra arguments. */
function evaluate(out: string, extra: string[]): Map<string, EvalRecord> {
  const r = runCli([
    "eval",
    "--data",
    data,
    "--retriever-url",
    served.server.url,
    "--out",
    path.join(dir, out),
    ...BUDGET,
    ...extra,
  ]);
  expect(r.code, r.stderr).toBe(0);
  const lines = readFileSync(path.join(dir, out, "trajectories.jsonl"), "utf8").split("\n");
  const records = lines.filter((l) => l).map((l) => JSON.parse(l) as EvalRecord);
  return new Map(records.map((rec) => [rec.id, rec]));
}

const responses = (records: Map<string, EvalRecord>) =>
  QUESTIONS.map((q) => records.get(q.id)?.response);

it("eval --lora: the engine it starts serves the adapter; the trajectories are the merged model's, not the base's", () => {
  const withAdapter = evaluate("lora", ["--model", MODEL, "--lora", adapter]);
  const withMerged = evaluate("merged", ["--model", merged]);
  const base = evaluate("base", ["--model", MODEL]);
  expect(responses(withAdapter)).toEqual(responses(withMerged));
  for (const q of QUESTIONS) {
    expect(withAdapter.get(q.id)?.turns).toEqual(withMerged.get(q.id)?.turns);
  }
  expect(responses(withAdapter)).not.toEqual(responses(base));
  const report = JSON.parse(readFileSync(path.join(dir, "lora", "report.json"), "utf8"));
  expect(report.config.lora_adapter).toBe(adapter);
}, 240_000);

it("ask --lora against a running engine: loaded for the question, unloaded after; a bad folder is refused naming the key", async () => {
  let engine: RunningEngine | undefined;
  try {
    engine = await startEngine(["--model", MODEL, "--device", "cpu", "--threads", "1"]);
    const ask = (extra: string[]) =>
      startCli([
        "ask",
        "who played brian",
        "--retriever-url",
        served.server.url,
        "--json",
        ...BUDGET,
        ...extra,
      ]).result;
    const viaUrl = await ask(["--model", MODEL, "--engine-url", engine.base, "--lora", adapter]);
    expect(viaUrl.code, viaUrl.stderr).toBe(0);
    const reference = await ask(["--model", merged]);
    expect(reference.code, reference.stderr).toBe(0);
    expect(JSON.parse(viaUrl.stdout).response).toBe(JSON.parse(reference.stdout).response);
    // Unloaded again: the server lists the base model alone.
    const models = await request(engine.base, "GET", "/v1/models");
    expect(models.json.data.map((m: { id: string }) => m.id)).toEqual([MODEL]);

    const missing = path.join(dir, "no-adapter");
    const bad = await ask(["--model", MODEL, "--engine-url", engine.base, "--lora", missing]);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain(`model.lora_adapter_path=${missing}: `);
    expect(bad.stderr).toContain("is not a folder");
    // The server goes on serving.
    const again = await ask(["--model", MODEL, "--engine-url", engine.base, "--lora", adapter]);
    expect(JSON.parse(again.stdout).response).toBe(JSON.parse(reference.stdout).response);
  } finally {
    await engine?.stop();
  }
}, 240_000);

it("refuses an adapter for an engine whose client cannot load one (vLLM), before any request", async () => {
  const r = runCli([
    "ask",
    "who played brian",
    "--model",
    MODEL,
    "--engine",
    "vllm",
    "--engine-url",
    "http://127.0.0.1:9",
    "--retriever-url",
    served.server.url,
    "--lora",
    adapter,
  ]);
  expect(r.code).toBe(2);
  expect(r.stderr).toContain(
    `model.lora_adapter_path=${adapter}: this engine's client cannot load adapters`,
  );
});
