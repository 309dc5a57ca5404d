// `searchr1 train` end to end with its real children: the native trainer, the native engine
// (serving the tiny test model) and serve-retriever (BM25, started from retriever.index).
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { modelDir } from "../engine/helpers.js";
import { type CliResult, runCli, startCli } from "../helpers/cli.js";
import { preprocessQa, type QaRow } from "../helpers/qa-data.js";
import { buildTestIndex, type TestIndex } from "../retrieval/helpers.js";

const MODEL = modelDir("qwen-bpe");
const rows = (split: string, n: number): QaRow[] =>
  Array.from({ length: n }, (_, i) => ({
    id: `${split}_${i}`,
    question: `who is paul walker number ${i}`,
    golden_answers: ["an actor"],
  }));

let dir: string;
let data: { train: string; test: string };
let ix: TestIndex;

beforeAll(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-train-"));
  data = preprocessQa(dir, {
    nq: { train: rows("train", 8), test: rows("test", 2) },
    hotpotqa: { train: rows("train", 4), test: rows("test", 2) },
  });
  ix = buildTestIndex({ rows: 200 });
}, 60_000);

afterAll(() => {
  ix?.cleanup();
  rmSync(dir, { recursive: true, force: true });
});

/** A run small enough for two shared cores: 4 prompts × 2 per step, short turns. */
function args(out: string, extra: string[] = []): string[] {
  return [
    "train",
    "--model",
    MODEL,
    "--output-dir",
    out,
    `data.train_files=${data.train}`,
    `data.val_files=${data.test}`,
    `retriever.index=${ix.index}`,
    `retriever.corpus=${ix.corpus}`,
    "data.train_batch_size=4",
    "rollout.n=2",
    "actor.ppo_mini_batch_size=2",
    "data.max_prompt_length=400",
    "data.max_response_length=8",
    "data.max_obs_length=24",
    "rollout.max_turns=1",
    "actor.lr=1e-3",
    "actor.lr_warmup_steps_ratio=0",
    "trainer.total_training_steps=3",
    "trainer.save_freq=1",
    "trainer.test_freq=2",
    "rollout.engine_device=cpu",
    "rollout.engine_threads=1",
    "trainer.device=cpu",
    "trainer.threads=1",
    ...extra,
  ];
}

const runDir = (out: string) => path.join(out, "searchr1", "nq_hotpotqa-grpo");
const metrics = (out: string) =>
  readFileSync(path.join(runDir(out), "metrics.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l)
    .map((l) => JSON.parse(l) as Record<string, number>);

/**
 * What must be equal between two runs of the same steps: everything but the timings, and the
 * engine-vs-trainer log-prob gap (the engine's log-probs round differently with the batch it
 * happens to run in; the sampled tokens do not change, so everything downstream is equal).
 */
const deterministic = (row: Record<string, number>) =>
  Object.fromEntries(
    Object.entries(row).filter(
      ([k]) =>
        !k.startsWith("timing/") && !k.startsWith("throughput/") && k !== "rollout/logprob_gap",
    ),
  );

describe("searchr1 train", () => {
  const straight = () => path.join(dir, "straight");

  it("runs GRPO steps: metrics.jsonl, plots, validation, checkpoints, config.yaml", () => {
    const r = runCli(args(straight()));
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/^step 1\/3 {2}reward /m);
    const m = metrics(straight());
    expect(m.map((x) => x.step)).toEqual([0, 1, 2, 3]);
    expect(m[0]).toHaveProperty("val/em/mean");
    expect(m[2]).toHaveProperty("val/em/nq");
    for (const row of m.slice(1)) {
      for (const key of [
        "reward/mean",
        "em/mean",
        "response_length/mean",
        "searches/mean",
        "valid_action/ratio",
        "actor/pg_loss",
        "actor/entropy",
        "actor/kl_loss",
        "actor/grad_norm",
        "actor/lr",
        "rollout/logprob_gap",
        "timing/rollout_s",
        "timing/step_s",
      ]) {
        expect(row, key).toHaveProperty(key);
      }
      // The engine and the trainer compute the same model.
      expect(row["rollout/logprob_gap"]).toBeLessThan(1e-4);
    }
    const run = runDir(straight());
    for (const step of [1, 2, 3]) {
      expect(existsSync(path.join(run, `global_step_${step}`, "controller.json"))).toBe(true);
      expect(existsSync(path.join(run, `global_step_${step}`, "policy", "config.json"))).toBe(true);
    }
    expect(readFileSync(path.join(run, "latest_checkpointed_iteration.txt"), "utf8").trim()).toBe(
      "3",
    );
    for (const chart of ["reward", "validation", "behaviour", "optimisation"]) {
      expect(readFileSync(path.join(run, "plots", `${chart}.svg`), "utf8")).toContain("<svg");
      expect(
        readFileSync(path.join(run, "plots", `${chart}.png`))
          .subarray(1, 4)
          .toString(),
      ).toBe("PNG");
    }
    expect(parse(readFileSync(path.join(run, "config.yaml"), "utf8")).rollout.n).toBe(2);
    expect(
      readFileSync(path.join(run, "validation", "step_2.jsonl"), "utf8")
        .split("\n")
        .filter((l) => l),
    ).toHaveLength(4);
  }, 240_000);

  it("PPO trains a critic beside the actor (GAE, KL in the reward) and checkpoints it", () => {
    const out = path.join(dir, "ppo");
    const r = runCli(
      args(out, [
        "--algorithm",
        "ppo",
        "algorithm.use_kl_in_reward=true",
        "actor.use_kl_loss=false",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "rollout.n=1",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "trainer.experiment_name=ppo",
      ]),
    );
    expect(r.code, r.stderr).toBe(0);
    const rows = readFileSync(path.join(out, "searchr1", "ppo", "metrics.jsonl"), "utf8")
      .split("\n")
      .filter((l) => l)
      .map((l) => JSON.parse(l));
    expect(rows.map((x) => x.step)).toEqual([1, 2]);
    // Step 1: values start at 0 and every return is 0 (no reward, no KL yet); after the
    // first update the policy has moved (entropy bonus), so step 2's returns carry KL.
    expect(rows[0]["critic/vf_loss"]).toBe(0);
    expect(rows[1]["critic/vf_loss"]).toBeGreaterThan(0);
    expect(rows[1]["algorithm/kl"]).toBeGreaterThan(0);
    for (const row of rows) {
      expect(row["algorithm/kl_coef"]).toBe(0.001);
      expect(row).not.toHaveProperty("actor/kl_loss", expect.any(Number));
    }
    expect(
      existsSync(path.join(out, "searchr1", "ppo", "global_step_2", "critic", "config.json")),
    ).toBe(true);
  }, 240_000);

  it("RLOO and REINFORCE++ run through the same step", () => {
    for (const name of ["rloo", "reinforce_plus_plus"]) {
      const out = path.join(dir, name);
      const r = runCli(
        args(out, [
          `algorithm.name=${name}`,
          "trainer.total_training_steps=1",
          "trainer.val_before_train=false",
        ]),
      );
      expect(r.code, `${name}: ${r.stderr}`).toBe(0);
      expect(r.stderr).toMatch(/^step 1\/1 {2}reward /m);
    }
  }, 240_000);

  it("trainer.logger and trainer.log_every decide where metrics go and how often", () => {
    const out = path.join(dir, "loggers");
    const r = runCli(
      args(out, [
        "trainer.logger=[console]",
        "trainer.log_every=2",
        "trainer.test_freq=5",
        "trainer.val_before_train=false",
      ]),
    );
    expect(r.code, r.stderr).toBe(0);
    // Every log_every steps, and the last step (with its validation); no file, no plots.
    expect(r.stderr).not.toMatch(/^step 1\/3/m);
    expect(r.stderr).toMatch(/^step 2\/3 {2}reward /m);
    expect(r.stderr).toMatch(/^step 3\/3 {2}reward .*val EM/m);
    expect(existsSync(path.join(runDir(out), "metrics.jsonl"))).toBe(false);
    expect(existsSync(path.join(runDir(out), "plots"))).toBe(false);
    const quiet = runCli(
      args(path.join(dir, "quiet"), [
        "trainer.logger=[jsonl]",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
      ]),
    );
    expect(quiet.code, quiet.stderr).toBe(0);
    expect(quiet.stderr).not.toMatch(/^step /m);
    expect(metrics(path.join(dir, "quiet")).map((x) => x.step)).toEqual([1]);
  }, 240_000);

  it("Ctrl-C stops cleanly (exit 130); the resumed run equals the uninterrupted one", async () => {
    const out = path.join(dir, "interrupted");
    const cli = startCli(args(out));
    // Interrupt once step 2 is checkpointed, while step 3 runs.
    const checkpoint = path.join(runDir(out), "global_step_2", "controller.json");
    while (!existsSync(checkpoint) && cli.child.exitCode === null)
      await new Promise((r) => setTimeout(r, 50));
    cli.child.kill("SIGINT");
    const stopped: CliResult = await cli.result;
    expect(stopped.code, stopped.stderr).toBe(130);
    expect(stopped.stderr).toMatch(/interrupted; the checkpoints in .* are intact/);
    // No child is left behind.
    expect(execFileSync("ps", ["-eo", "args"], { encoding: "utf8" })).not.toContain(out);

    const resumed = runCli(args(out));
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(resumed.stderr).toMatch(/resuming from .*global_step_2 \(step 2\)/);
    expect(metrics(out).map(deterministic)).toEqual(metrics(straight()).map(deterministic));
  }, 240_000);

  it.each([
    { child: "serve-engine", message: /the engine \(searchr1 serve-engine\) died \(SIGKILL\)/ },
    {
      child: "serve-retriever",
      message: /the retriever \(searchr1 serve-retriever\) died \(SIGKILL\)/,
    },
    {
      child: "searchr1-trainer serve",
      message: /the trainer \(searchr1-trainer serve\) died \(SIGKILL\)/,
    },
  ])(
    "a dying $child stops the run with its name and last words; checkpoints stay",
    async ({ child, message }) => {
      const out = path.join(dir, `crash-${child.replace(/\W+/g, "-")}`);
      const cli = startCli(args(out));
      const checkpoint = path.join(runDir(out), "global_step_1", "controller.json");
      while (!existsSync(checkpoint) && cli.child.exitCode === null)
        await new Promise((r) => setTimeout(r, 50));
      const children = execFileSync("ps", ["-o", "pid=,args=", "--ppid", String(cli.child.pid)], {
        encoding: "utf8",
      });
      const victim = children.split("\n").find((l) => l.includes(child));
      expect(victim, children).toBeDefined();
      process.kill(Number(victim?.trim().split(/\s+/)[0]), "SIGKILL");
      const r = await cli.result;
      expect(r.code, r.stderr).toBe(1);
      expect(r.stderr).toMatch(message);
      expect(existsSync(checkpoint)).toBe(true);
    },
    240_000,
  );

  it("refuses what this build cannot do, naming the key", () => {
    const gpus = runCli([...args(path.join(dir, "x")), "--gpus", "2"]);
    expect(gpus.code).toBe(2);
    expect(gpus.stderr).toMatch(/trainer\.gpus=2.*one device/);
    const vllm = runCli([
      ...args(path.join(dir, "x")),
      "rollout.engine=vllm",
      "rollout.engine_url=http://127.0.0.1:1",
    ]);
    expect(vllm.code).toBe(2);
    expect(vllm.stderr).toMatch(/rollout\.engine=vllm/);
    const tp = runCli([...args(path.join(dir, "x")), "rollout.tensor_parallel_size=2"]);
    expect(tp.code).toBe(2);
    expect(tp.stderr).toMatch(/rollout\.tensor_parallel_size=2: the native engine runs/);
    const batch = runCli([...args(path.join(dir, "x")), "data.train_batch_size=64"]);
    expect(batch.code).toBe(1);
    expect(batch.stderr).toMatch(/data\.train_batch_size is 64 but .* hold 12 questions/);
    const missing = runCli([
      ...args(path.join(dir, "x")),
      `data.train_files=${path.join(dir, "nope.parquet")}`,
    ]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/nope\.parquet: no such file/);
  }, 60_000);
});
