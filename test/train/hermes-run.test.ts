// The Hermes format end to end (issue 43): a rollout, `searchr1 eval` and a 2-step
// `searchr1 train` with rollout.multi_turn.format=hermes, against a BM25 `serve-retriever` on
// loopback and the real native engine, with verl's search tool_config. The model
// (test/agent/hermes-model.ts) writes one search call per turn, so every trajectory is:
// call, <|im_end|>, the tool turn (the retriever's documents rendered as verl renders them,
// through the chat template, masked out), call, <|im_end|> — then max_assistant_turns=2.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promptIds } from "../../src/agent/prompt.js";
import { RetrieverClient } from "../../src/agent/retriever-client.js";
import { type AgentSettings, rollout } from "../../src/agent/rollout.js";
import { passagesToText, truncateToolResponse } from "../../src/agent/search-tool.js";
import { loadToolConfig } from "../../src/agent/tool-config.js";
import { SglangClient } from "../../src/engine/client/sglang.js";
import type { EvalRecord } from "../../src/eval/record.js";
import { ModelTokenizer } from "../../src/text/model-tokenizer.js";
import { CALL_QUERY, CALL_TEXT, TOOL_CONFIG, writeHermesModel } from "../agent/hermes-model.js";
import { startEngine } from "../engine/helpers.js";
import { type ServingCli, startCli, startServing } from "../helpers/cli.js";
import { preprocessQa, type QaRow } from "../helpers/qa-data.js";
import { buildTestIndex, type TestIndex } from "../retrieval/helpers.js";

const PROMPT = fileURLToPath(new URL("../agent/fixtures/question-prompt.txt", import.meta.url));
const TOOL_LENGTH = 60;
/** Budgets for the tiny model's 512 positions: the prompt with its tools is ~370 tokens. */
const HERMES = [
  "rollout.multi_turn.format=hermes",
  `rollout.multi_turn.tool_config_path=${TOOL_CONFIG}`,
  "rollout.multi_turn.max_assistant_turns=2",
  `rollout.multi_turn.max_tool_response_length=${TOOL_LENGTH}`,
  "data.max_start_length=400",
  "data.max_prompt_length=500",
  "data.max_response_length=150",
  "retriever.topk=2",
  "rollout.engine_device=cpu",
  "rollout.engine_threads=1",
];

const rows = (split: string, n: number): QaRow[] =>
  Array.from({ length: n }, (_, i) => ({
    id: `${split}_${i}`,
    question: `who is paul walker number ${i}`,
    golden_answers: ["an actor"],
  }));

let dir: string;
let data: { train: string; test: string };
let ix: TestIndex;
let model: string;
let tokenizer: ModelTokenizer;
let retriever: ServingCli;
/** What the tool turn must be: verl's text for the call, through the chat template. */
let toolTurn: string;

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-hermes-run-"));
  data = preprocessQa(
    dir,
    { nq: { train: rows("train", 4), test: rows("test", 2) } },
    // verl's rows (system message, searchR1_nq, question in extra_info), with a short prompt.
    { template: PROMPT, format: "verl" },
  );
  ix = buildTestIndex({ rows: 200 });
  model = path.join(dir, "model");
  mkdirSync(model);
  await writeHermesModel(model);
  tokenizer = ModelTokenizer.load(model);
  retriever = await startServing(
    ["serve-retriever", "--index", ix.index, "--corpus", ix.corpus, "--port", "0"],
    /serving \S+ retrieval over .* at (http:\/\/\S+\/retrieve)/,
    { timeoutMs: 30_000 },
  );
  const docs = await new RetrieverClient({
    url: retriever.url,
    topk: 2,
    timeoutMs: 10_000,
    maxRetries: 0,
  }).search(CALL_QUERY);
  expect(docs[0]?.contents).toMatch(/^"Paul Walker"/);
  const result = truncateToolResponse(
    `{"result": ${JSON.stringify(passagesToText(docs))}}`,
    TOOL_LENGTH,
    "middle",
  );
  toolTurn = `<|im_start|>user\n<tool_response>\n${result}\n</tool_response><|im_end|>\n<|im_start|>assistant\n`;
}, 120_000);

afterAll(async () => {
  await retriever?.stop();
  ix?.cleanup();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const id = (token: string) => tokenizer.tokenizer.tokenToId(token) as number;

describe("rollout.multi_turn.format=hermes end to end", () => {
  it("a rollout on the native engine: the tool turn rendered by the template, masked, token in = token out", async () => {
    const engine = await startEngine(["--model", model]);
    try {
      const settings: AgentSettings = {
        maxTurns: 4,
        maxStartLength: 400,
        maxPromptLength: 500,
        maxResponseLength: 150,
        maxObsLength: 500,
        sampling: { temperature: 1, topP: 1, topK: -1 },
        compat: "none",
        format: {
          kind: "hermes",
          tools: loadToolConfig(TOOL_CONFIG),
          maxAssistantTurns: 2,
          maxParallelCalls: 1,
          maxToolResponseLength: TOOL_LENGTH,
          truncateSide: "middle",
        },
      };
      const client = new RetrieverClient({
        url: retriever.url,
        topk: 2,
        timeoutMs: 10_000,
        maxRetries: 0,
      });
      const prompt = await promptIds(
        tokenizer,
        [{ role: "user", content: "Question: who is paul walker?" }],
        settings.format,
      );
      const t = await rollout({ promptIds: prompt, seed: 5 }, settings, {
        engine: new SglangClient(engine.base),
        retriever: client,
        tokenizer: tokenizer.tokenizer,
        chat: tokenizer,
      });
      const call = id(CALL_TEXT);
      const eos = id("<|im_end|>");
      const toolIds = await tokenizer.encode(toolTurn, { addSpecialTokens: false });
      // The template's tool turn, encoded once, between the engine's own ids.
      expect(t.responseIds).toEqual([call, eos, ...toolIds, call, eos]);
      expect(t.lossMask).toEqual([1, 1, ...toolIds.map(() => 0), 1, 1]);
      expect(t.turns[0]?.observation).toBe(toolTurn);
      // The engine's log-probs for its tokens (the model is sure of them), none for the tool's.
      const generated = [0, 1, toolIds.length + 2, toolIds.length + 3];
      for (const i of generated) expect(t.logprobs[i]).toBeCloseTo(0, 3);
      expect(t.logprobs.filter((l) => l === null)).toHaveLength(toolIds.length);
      expect(t.turns.map((turn) => turn.action)).toEqual(["search", "search"]);
      expect(t.searches).toBe(1);
      expect(client.stats.requests).toBe(1);
      expect(t.finishReason).toBe("max_turns");
    } finally {
      await engine.stop();
    }
  }, 120_000);

  it("searchr1 eval: every trajectory searches once and records verl's tool turn", async () => {
    const out = path.join(dir, "eval");
    const r = await startCli([
      "eval",
      "--model",
      model,
      `data.val_files=[${data.test}]`,
      `retriever.url=${retriever.url}`,
      `output_dir=${out}`,
      ...HERMES,
    ]).result;
    expect(r.code, r.stderr.slice(-3000)).toBe(0);
    const records = readFileSync(path.join(out, "trajectories.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as EvalRecord);
    expect(records).toHaveLength(2);
    // verl's rows: ids from the searchR1_ source and the row's index in the file.
    // (Records are written as questions finish: in either order.)
    const rows = records.map((rec) => [rec.id, rec.data_source, rec.question]);
    expect(rows.sort((a, b) => String(a[0]).localeCompare(String(b[0])))).toEqual([
      ["searchR1_nq_0", "searchR1_nq", "who is paul walker number 0?"],
      ["searchR1_nq_1", "searchR1_nq", "who is paul walker number 1?"],
    ]);
    for (const rec of records) {
      expect(rec.turns.map((turn) => turn.action)).toEqual(["search", "search"]);
      expect(rec.turns[0]?.query).toBe(JSON.stringify([CALL_QUERY]));
      expect(rec.turns[0]?.documents[0]?.contents).toMatch(/^"Paul Walker"/);
      expect(rec.turns[0]?.observation).toBe(toolTurn);
      expect(rec.searches).toBe(1);
      expect(rec.finish_reason).toBe("max_turns");
      expect(rec.prediction).toBeNull();
      expect(rec.em).toBe(0);
    }
  }, 180_000);

  it("searchr1 train: 2 GRPO steps; the trainer scores the engine's tokens, the tool turns masked out", async () => {
    const out = path.join(dir, "train");
    const r = await startCli([
      "train",
      "--model",
      model,
      "--output-dir",
      out,
      `data.train_files=${data.train}`,
      `data.val_files=${data.test}`,
      `retriever.index=${ix.index}`,
      `retriever.corpus=${ix.corpus}`,
      "data.train_batch_size=2",
      "rollout.n=2",
      "actor.ppo_mini_batch_size=2",
      "trainer.total_training_steps=2",
      "trainer.save_freq=100",
      "trainer.test_freq=100",
      "trainer.val_before_train=false",
      "trainer.device=cpu",
      "trainer.threads=1",
      ...HERMES,
    ]).result;
    expect(r.code, r.stderr.slice(-3000)).toBe(0);
    const [run] = readdirSync(path.join(out, "searchr1"));
    const metrics = readFileSync(path.join(out, "searchr1", run as string, "metrics.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, number>);
    const steps = metrics.filter((m) => m["generated_tokens/mean"] !== undefined);
    expect(steps).toHaveLength(2);
    const toolIds = await tokenizer.encode(toolTurn, { addSpecialTokens: false });
    for (const m of steps) {
      expect(m["generated_tokens/mean"]).toBe(4);
      expect(m["response_length/mean"]).toBe(4 + toolIds.length);
      expect(m["searches/mean"]).toBe(1);
      expect(m["turns/mean"]).toBe(2);
      // The trainer's log-probs of the same ids agree with the engine's: nothing re-encoded.
      expect(Math.abs(m["rollout/logprob_gap"] as number)).toBeLessThan(1e-3);
    }
  }, 360_000);

  it("searchr1 ask: verl's system message and <tool_call> prompt, the tool turn as in eval", async () => {
    const r = await startCli([
      "ask",
      "who is paul walker",
      "--model",
      model,
      "--json",
      `retriever.url=${retriever.url}`,
      ...HERMES.filter((o) => !o.startsWith("data.max_prompt_length")),
    ]).result;
    expect(r.code, r.stderr.slice(-3000)).toBe(0);
    const out = JSON.parse(r.stdout);
    // The prompt `preprocess --format verl` writes, through the template with the tools.
    expect(out.prompt).toBe(
      tokenizer.applyChatTemplate(
        [
          { role: "system", content: "You are a helpful and harmless assistant." },
          {
            role: "user",
            content: readFileSync(
              fileURLToPath(new URL("../../templates/verl-tool-call.txt", import.meta.url)),
              "utf8",
            ).replace("{question}", "who is paul walker?"),
          },
        ],
        { addGenerationPrompt: true, tools: loadToolConfig(TOOL_CONFIG) },
      ),
    );
    expect(out.turns.map((t: { action: string }) => t.action)).toEqual(["search", "search"]);
    expect(out.turns[0].observation).toBe(toolTurn);
    expect(out.finish_reason).toBe("max_turns");
  }, 120_000);

  it("refuses Search-R1's tag-judging reward switches, naming them, before anything runs", async () => {
    const evalOut = path.join(dir, "eval-refused");
    const evalRun = await startCli([
      "eval",
      "--model",
      model,
      `data.val_files=[${data.test}]`,
      `retriever.url=${retriever.url}`,
      `output_dir=${evalOut}`,
      "reward.search_r1_extract=true",
      ...HERMES,
    ]).result;
    expect(evalRun.code).not.toBe(0);
    expect(evalRun.stderr).toMatch(
      /reward\.search_r1_extract=true judges Search-R1's tags; rollout\.multi_turn\.format=hermes .*set reward\.search_r1_extract=false/,
    );
    expect(existsSync(path.join(evalOut, "trajectories.jsonl"))).toBe(false);
    const trainOut = path.join(dir, "train-refused");
    const trainRun = await startCli([
      "train",
      "--model",
      model,
      "--output-dir",
      trainOut,
      `data.train_files=${data.train}`,
      `retriever.url=${retriever.url}`,
      "reward.format_reward=true",
      ...HERMES,
    ]).result;
    expect(trainRun.code).not.toBe(0);
    expect(trainRun.stderr).toMatch(/reward\.format_reward=true judges Search-R1's tags/);
    expect(existsSync(trainOut)).toBe(false);
  }, 60_000);
});
