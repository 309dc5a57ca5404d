// `searchr1 train` end to end with its real children: the native trainer, the native engine
// (serving the tiny test model) and serve-retriever (BM25, started from retriever.index).
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { overlongPenalty } from "../../src/rl/overlong-reward.js";
import { type CliResult, runCli, startCli } from "../helpers/cli.js";
import { type ScriptedTurn, startScriptedEngine } from "../helpers/scripted-engine.js";
import { readEvents } from "../helpers/tfevents.js";
import { startWandbStandIn } from "../helpers/wandb-server.js";
import { deterministic, MODEL, metrics, runDir, type SmallRun, smallRun } from "./small-run.js";

let run: SmallRun;
let dir: string;

beforeAll(() => {
  run = smallRun("searchr1-train-");
  dir = run.dir;
}, 60_000);

afterAll(() => run?.cleanup());

const args = (out: string, extra: string[] = []) => run.args(out, extra);

/**
 * Starts `train` on `out` and waits for its first checkpoint (or its exit): the moment the
 * crash tests kill one of its children. Returns the run, the checkpoint's controller.json
 * and the `ps` lines of the run's direct children.
 */
async function untilFirstCheckpoint(out: string, extra: string[] = []) {
  const cli = startCli(args(out, extra));
  const checkpoint = path.join(runDir(out), "global_step_1", "controller.json");
  while (!existsSync(checkpoint) && cli.child.exitCode === null)
    await new Promise((r) => setTimeout(r, 50));
  const children = execFileSync("ps", ["-o", "pid=,args=", "--ppid", String(cli.child.pid)], {
    encoding: "utf8",
  });
  return { cli, checkpoint, children };
}

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
        "rollout_corr/kl",
        "rollout_corr/k3_kl",
        "rollout_corr/ppl_ratio",
        "rollout_corr/chi2_token",
        "timing/rollout_s",
        "timing/step_s",
      ]) {
        expect(row, key).toHaveProperty(key);
      }
      // The engine and the trainer compute the same model; the mismatch is logged every step.
      expect(row["rollout/logprob_gap"]).toBeLessThan(1e-4);
      expect(Math.abs(row["rollout_corr/kl"] as number)).toBeLessThan(1e-4);
      expect(Math.abs((row["rollout_corr/ppl_ratio"] as number) - 1)).toBeLessThan(1e-4);
      expect(row).not.toHaveProperty("rollout_corr/rollout_is_mean");
      expect(row).not.toHaveProperty("train/num_gen_batches");
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

  // Two trainer ranks (CPU, Gloo) and two engine replicas (CPU, a core each) stand in for two
  // GPUs. The seeds and the data order are the same, and every request carries its seed to
  // whichever replica the router gives its trajectory, so the rollouts are the same too (the
  // replicas run other batches than one engine would, which moves the engine's log-probs by
  // rounding, not the tokens sampled), as long as the weights the engine receives
  // after each update sample the same tokens: the ranks' weights differ from one rank's only
  // by the rounding of the gradient sum (test/native/ranks.test.ts: at most 6.7e-7 after 6
  // steps), far too little to change a sampled token here. So every rollout metric and the
  // validation answers (greedy, on the updated weights) are equal, and the trainer's metrics
  // (sums over the same tokens in another order, on weights that drift apart by rounding as
  // the steps go) agree within 1e-4 of max(|value|, 1). Measured: 1.4e-7 at step 1, 5.6e-7 at
  // step 2, 2.6e-6 at step 3 (kl_loss, which grows with the weights' drift from the
  // reference); pg_loss is 0 here (the random model earns no reward; ranks.test.ts checks
  // the policy-gradient part).
  // trainer.profile and ref.param_offload are on in this run: timing the operations and
  // parking the reference in host memory must change no number.
  it("--gpus 2 with trainer.device=cpu: two trainer ranks and two engine replicas give the run of one", () => {
    const out = path.join(dir, "two-ranks");
    const r = runCli(args(out, ["--gpus", "2", "trainer.profile=true", "ref.param_offload=true"]));
    expect(r.code, r.stderr).toBe(0);
    // profile.jsonl: each step, each rank, the device time of its operations since the step
    // before (log-probs, the actor's update, the weights' export).
    const profile = readFileSync(path.join(runDir(out), "profile.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map(
        (l) =>
          JSON.parse(l) as {
            step: number;
            rank: number;
            device_ms: number;
            ops: { op: string; calls: number; ms: number }[];
          },
      );
    expect(profile.map((p) => [p.step, p.rank])).toEqual(
      [1, 1, 2, 2, 3, 3].map((st, i) => [st, i % 2]),
    );
    for (const p of profile) {
      const ops = new Map(p.ops.map((o) => [o.op, o]));
      for (const op of [
        "attention_forward",
        "attention_backward",
        "adamw_update",
        "logprob_backward",
      ]) {
        expect(ops.get(op)?.calls, `step ${p.step} rank ${p.rank}: ${op}`).toBeGreaterThan(0);
      }
      const sum = p.ops.reduce((a, o) => a + o.ms, 0);
      expect(Math.abs(sum - p.device_ms)).toBeLessThan(1e-6 * Math.max(1, sum));
      expect(p.ops.map((o) => o.ms)).toEqual([...p.ops.map((o) => o.ms)].sort((a, b) => b - a));
    }
    expect(r.stderr).toMatch(/^profile, step 1, rank 0: [\d.]+ ms on the device: \S+/m);
    expect(r.stderr).toMatch(/^engine replica 0 serving at http:\/\/127\.0\.0\.1:\d+$/m);
    expect(r.stderr).toMatch(/^engine replica 1 serving at http:\/\/127\.0\.0\.1:\d+$/m);
    const [one, two] = [metrics(straight()), metrics(out)];
    expect(two.map((x) => x.step)).toEqual(one.map((x) => x.step));
    const trainerKey = (k: string) => k.startsWith("actor/") || k.startsWith("critic/");
    for (const [k, row] of one.entries()) {
      const [a, b] = [deterministic(row), deterministic(two[k] ?? {})];
      expect(Object.keys(b).sort()).toEqual(Object.keys(a).sort());
      const exact = (x: Record<string, number>) =>
        Object.fromEntries(Object.entries(x).filter(([key]) => !trainerKey(key)));
      expect(exact(b), `step ${row.step}`).toEqual(exact(a));
      for (const key of Object.keys(a).filter(trainerKey)) {
        const [x, y] = [a[key] as number, b[key] as number];
        expect(Math.abs(x - y), `step ${row.step} ${key}: ${x} vs ${y}`).toBeLessThanOrEqual(
          1e-4 * Math.max(Math.abs(x), 1),
        );
      }
    }
    for (const step of [2, 3]) {
      const file = (o: string) =>
        readFileSync(path.join(runDir(o), "validation", `step_${step}.jsonl`), "utf8");
      expect(file(out)).toBe(file(straight()));
    }
  }, 240_000);

  it("a dying trainer rank stops the run naming the rank; the others stop, nothing is left", async () => {
    const out = path.join(dir, "rank-crash");
    const { cli, checkpoint, children } = await untilFirstCheckpoint(out, ["--gpus", "2"]);
    const ranks = children.split("\n").filter((l) => l.includes("searchr1-trainer serve"));
    expect(ranks, children).toHaveLength(2);
    const victim = ranks.find((l) => l.includes("--rank 1 "));
    const rendezvous = victim?.match(/--rendezvous (\S+)/)?.[1];
    expect(rendezvous && existsSync(rendezvous), victim).toBe(true);
    process.kill(Number(victim?.trim().split(/\s+/)[0]), "SIGKILL");
    const r = await cli.result;
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(/the trainer's rank 1 \(searchr1-trainer serve\) died \(SIGKILL\)/);
    expect(existsSync(checkpoint)).toBe(true);
    expect(existsSync(rendezvous as string)).toBe(false);
    expect(execFileSync("ps", ["-eo", "args"], { encoding: "utf8" })).not.toContain(
      rendezvous as string,
    );
  }, 240_000);

  it("a dying engine replica stops the run naming the replica and its last lines", async () => {
    const out = path.join(dir, "replica-crash");
    const { cli, checkpoint, children } = await untilFirstCheckpoint(out, ["--gpus", "2"]);
    // Started in replica order, so in pid order.
    const replicas = children
      .split("\n")
      .filter((l) => l.includes("serve-engine"))
      .map((l) => Number(l.trim().split(/\s+/)[0]))
      .sort((a, b) => a - b);
    expect(replicas, children).toHaveLength(2);
    process.kill(replicas[1] as number, "SIGKILL");
    const r = await cli.result;
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(
      /the engine replica 1 \(searchr1 serve-engine\) died \(SIGKILL\); its last lines:\n(.*\n)*.* {2}serving \S+ on cpu at /,
    );
    // Step 1 gave the KV cache back while the trainer worked, and took it again
    // (rollout.free_cache_engine).
    expect(r.stderr).toMatch(
      / {2}KV cache released: its memory is the device's .*\n.* {2}KV cache resumed/,
    );
    expect(existsSync(checkpoint)).toBe(true);
    expect(execFileSync("ps", ["-eo", "args"], { encoding: "utf8" })).not.toContain(out);
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
      const { cli, checkpoint, children } = await untilFirstCheckpoint(out);
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

  // W&B's variables as a user sets them, whatever this machine's environment holds.
  const WANDB_KEY = "k".repeat(40);
  const wandbEnv = (url: string) => ({
    WANDB_API_KEY: WANDB_KEY,
    WANDB_BASE_URL: url,
    WANDB_MODE: "",
    WANDB_ENTITY: "",
    WANDB_RUN_ID: "",
  });

  it("a resumed run continues its W&B run (the run folder keeps its id)", async () => {
    const server = await startWandbStandIn({ apiKey: WANDB_KEY, entity: "alice" });
    const out = path.join(dir, "wandb-resume");
    const run = (steps: number) =>
      startCli(
        args(out, [
          "trainer.logger=[jsonl,wandb]",
          `trainer.total_training_steps=${steps}`,
          "trainer.val_before_train=false",
        ]),
        { env: wandbEnv(server.url) },
      ).result;
    try {
      const first = await run(1);
      expect(first.code, first.stderr).toBe(0);
      const second = await run(2);
      expect(second.code, second.stderr).toBe(0);
      expect(second.stderr).toMatch(/resuming from .*global_step_1/);
      const ids = server.graphql
        .filter((c) => c.query.includes("upsertBucket"))
        .map((c) => c.variables.name);
      expect(ids).toHaveLength(2);
      expect(ids[1]).toBe(ids[0]);
      const kept = JSON.parse(readFileSync(path.join(runDir(out), "wandb-run.json"), "utf8"));
      expect(kept).toEqual({ id: ids[0] });
    } finally {
      await server.close();
    }
  }, 240_000);

  it("trainer.logger wandb and tensorboard: every step's metrics in a W&B run (a stand-in server) and in event files; the plots as images at checkpoints", async () => {
    const server = await startWandbStandIn({ apiKey: WANDB_KEY, entity: "alice" });
    const out = path.join(dir, "trackers");
    try {
      const r = await startCli(
        args(out, [
          "trainer.logger=[console,jsonl,plot,wandb,tensorboard]",
          "trainer.project_name=proj",
          "trainer.experiment_name=trackers",
          "trainer.save_freq=2",
        ]),
        { env: wandbEnv(server.url) },
      ).result;
      expect(r.code, r.stderr).toBe(0);
      const run = path.join(out, "proj", "trackers");
      const rows = readFileSync(path.join(run, "metrics.jsonl"), "utf8")
        .split("\n")
        .filter((l) => l)
        .map((l) => JSON.parse(l) as Record<string, number | null> & { step: number });
      expect(rows.map((x) => x.step)).toEqual([0, 1, 2, 3]);
      // The collapse signs are logged every step (the filtered-group share with dynamic
      // sampling: the DAPO test below).
      for (const row of rows.slice(1)) {
        for (const key of [
          "actor/entropy",
          "response_length/mean",
          "actor/pg_clipfrac",
          "actor/grad_norm",
          "rollout_corr/kl",
        ]) {
          expect(row[key], `step ${row.step} ${key}`).toEqual(expect.any(Number));
        }
      }
      const finite = (row: Record<string, number | null>) =>
        Object.entries(row).filter(
          ([k, v]) => k !== "step" && typeof v === "number" && Number.isFinite(v),
        ) as [string, number][];

      // W&B: the run under project_name with experiment_name, the resolved config, a history
      // line per step with every finite metric, the plots as images where a checkpoint was
      // written (steps 2 and 3), and the end marked with exit code 0.
      const upsert = server.graphql.find((c) => /upsertBucket/.test(c.query));
      const id = upsert?.variables.name as string;
      expect(upsert?.variables).toMatchObject({ project: "proj", displayName: "trackers" });
      expect(r.stderr).toContain(`W&B run ${server.url}/alice/proj/runs/${id}`);
      const config = JSON.parse(upsert?.variables.config as string);
      expect(config.rollout.value.n).toBe(2);
      expect(config.trainer.value.logger).toContain("wandb");
      expect(config.model.value.path).toBe(MODEL);
      const history = server.history();
      expect(history.map((h) => h._step)).toEqual([0, 1, 2, 3]);
      const charts = readdirSync(path.join(run, "plots"))
        .filter((f) => f.endsWith(".png"))
        .map((f) => `plots/${f.replace(/\.png$/, "")}`)
        .sort();
      expect(charts).toEqual(expect.arrayContaining(["plots/reward", "plots/optimisation"]));
      for (const [i, row] of rows.entries()) {
        const line = history[i] as Record<string, unknown>;
        for (const [k, v] of finite(row)) expect(line[k], `step ${row.step} ${k}`).toBe(v);
        const images = Object.keys(line).filter((k) => k.startsWith("plots/"));
        expect(images.sort(), `step ${row.step}`).toEqual(row.step >= 2 ? charts : []);
      }
      // The last step's images are the plots on disk.
      const last = history[3] as Record<string, { path: string; sha256: string }>;
      const png = readFileSync(path.join(run, "plots", "reward.png"));
      expect(last["plots/reward"]?.sha256).toBe(createHash("sha256").update(png).digest("hex"));
      expect(server.uploads.get(last["plots/reward"]?.path as string)?.bytes).toEqual(png);
      expect(server.fileStream.at(-1)?.body).toEqual({ complete: true, exitcode: 0 });

      // TensorBoard: one file; the version, a START at step 0, then one event per step with
      // every finite metric of metrics.jsonl as a float32.
      const tb = readdirSync(path.join(run, "tensorboard"));
      expect(tb).toHaveLength(1);
      expect(tb[0]).toMatch(/^events\.out\.tfevents\.\d+\./);
      const events = readEvents(path.join(run, "tensorboard", tb[0] as string));
      expect(events[0]?.fileVersion).toBe("brain.Event:2");
      expect(events[1]).toMatchObject({ step: 0, sessionStatus: 1 });
      expect(events.slice(2).map((e) => e.step)).toEqual([0, 1, 2, 3]);
      for (const [i, row] of rows.entries()) {
        expect(events[i + 2]?.values).toEqual(
          finite(row)
            .filter(([k]) => k !== "epoch")
            .map(([tag, v]) => ({ tag, value: Math.fround(v) })),
        );
      }
    } finally {
      await server.close();
    }
  }, 240_000);

  it("trainer.logger wandb: without WANDB_API_KEY, or with WANDB_MODE=offline, refused naming the variable", () => {
    const base = args(path.join(dir, "x"), ["trainer.logger=[console,wandb]"]);
    const none = runCli(base, { env: { WANDB_API_KEY: "", WANDB_MODE: "" } });
    expect(none.code).toBe(2);
    expect(none.stderr).toMatch(/trainer\.logger has wandb but WANDB_API_KEY is not set/);
    const offline = runCli(base, { env: { WANDB_API_KEY: WANDB_KEY, WANDB_MODE: "offline" } });
    expect(offline.code).toBe(2);
    expect(offline.stderr).toMatch(/WANDB_MODE=offline: searchr1 train logs to W&B online only/);
    expect(existsSync(path.join(dir, "x"))).toBe(false); // refused before writing anything
  });

  it("a NaN metric stops the run (trainer.stop_on_nan): exit 1 naming the step and the metric; the last checkpoint stays the last", async () => {
    // A learning rate of 1e30 leaves the policy's weights infinite after step 1's single
    // optimizer step (one mini-batch per step), so step 2's log-probs, entropy, losses and
    // gradient norm are NaN (null from the trainer).
    const server = await startWandbStandIn({ apiKey: WANDB_KEY });
    const out = path.join(dir, "nan");
    const nan = [
      "actor.lr=1e30",
      "actor.ppo_mini_batch_size=4",
      "trainer.val_before_train=false",
      "trainer.logger=[console,jsonl,wandb]",
    ];
    try {
      const r = await startCli(args(out, nan), { env: wandbEnv(server.url) }).result;
      expect(r.code, r.stderr).toBe(1);
      expect(r.stderr).toMatch(
        /^warning: step 2: not finite: .*actor\/entropy=null.*actor\/grad_norm=null/m,
      );
      expect(r.stderr).toMatch(
        /step 2: actor\/\S+ is null \(the trainer's NaN or ±Inf\), and \d+ more metric\(s\) are not finite \(.*actor\/grad_norm.*\); trainer\.stop_on_nan stopped the run without checkpointing step 2: the last checkpoint, \S+global_step_1, is intact/,
      );
      expect(r.stderr).not.toMatch(/^step 1\/3 .*warning/m);
      const run = runDir(out);
      expect(existsSync(path.join(run, "global_step_1", "controller.json"))).toBe(true);
      expect(existsSync(path.join(run, "global_step_2"))).toBe(false);
      expect(readFileSync(path.join(run, "latest_checkpointed_iteration.txt"), "utf8").trim()).toBe(
        "1",
      );
      const m = metrics(out);
      expect(m.map((x) => x.step)).toEqual([1, 2]);
      expect(m[0]?.["actor/entropy"]).toEqual(expect.any(Number));
      expect(m[1]?.["actor/entropy"]).toBeNull();
      expect(m[1]).not.toHaveProperty("val/em/mean"); // a diverged step is not validated
      expect(server.history().map((h) => h._step)).toEqual([1, 2]);
      expect(server.fileStream.at(-1)?.body).toEqual({ complete: true, exitcode: 1 });
    } finally {
      await server.close();
    }
    // trainer.stop_on_nan=false: the same warning, and the run goes on to its end.
    const goOn = runCli(
      args(path.join(dir, "nan-go-on"), [
        ...nan,
        "trainer.logger=[console,jsonl]",
        "trainer.stop_on_nan=false",
        "trainer.total_training_steps=2",
      ]),
    );
    expect(goOn.code, goOn.stderr).toBe(0);
    expect(goOn.stderr).toMatch(/^warning: step 2: not finite: /m);
    expect(existsSync(path.join(runDir(path.join(dir, "nan-go-on")), "global_step_2"))).toBe(true);
  }, 240_000);

  it("refuses what this build cannot do, naming the key", () => {
    // Devices no machine has: each rank's probe (searchr1-trainer info seeing its device alone)
    // finds no GPU, here or on a GPU machine.
    const gpus = runCli([...args(path.join(dir, "x")), "--gpus", "2", "trainer.device=cuda"], {
      env: { CUDA_VISIBLE_DEVICES: "97,98" },
    });
    expect(gpus.code).toBe(2);
    expect(gpus.stderr).toMatch(
      /trainer\.device=cuda with trainer\.gpus=2: device 97 \(CUDA_VISIBLE_DEVICES=97\) is not usable: \S/,
    );
    expect(existsSync(path.join(dir, "x"))).toBe(false);
    const nodes = runCli([...args(path.join(dir, "x")), "trainer.nnodes=2"]);
    expect(nodes.code).toBe(2);
    expect(nodes.stderr).toMatch(/trainer\.nnodes=2 needs trainer\.master_addr/);
    const vllm = runCli([
      ...args(path.join(dir, "x")),
      "rollout.engine=vllm",
      "rollout.engine_url=http://127.0.0.1:1",
    ]);
    expect(vllm.code).toBe(2);
    expect(vllm.stderr).toMatch(/rollout\.engine=vllm/);
    const offload = runCli([
      ...args(path.join(dir, "x")),
      "ref.param_offload=true",
      "actor.use_kl_loss=false",
      "algorithm.use_kl_in_reward=false",
    ]);
    expect(offload.code).toBe(2);
    expect(offload.stderr).toMatch(/ref\.param_offload=true: this run has no reference policy/);
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

describe("searchr1 train: DAPO and rollout correction, against a scripted engine", () => {
  // The random test model never answers, so every reward it earns is 0. A stand-in for an
  // SGLang server (test/helpers/scripted-engine.ts) answers instead: question "number k" with
  // k even is answered right for an even sampling seed and wrong for an odd one (the two
  // trajectories of a group have consecutive seeds, so the group varies); k odd is always
  // answered wrong (a group of equal rewards, which dynamic sampling drops). The wrong answer
  // is longer, into the overlong buffer. The engine's log-probs are a sine of the token's
  // position around -6.2, while the test model gives these tokens -9 on average (from about
  // -17 to -0.5), so the mismatch is large and rollout correction has work to do.
  const RIGHT = "<answer> an actor </answer>";
  const WRONG = "<answer> nobody that I have ever heard of, sorry, no idea at all </answer>";
  const MAX_RESPONSE = 48;
  const BUFFER = 32;
  const question = (context: string) =>
    Number([...context.matchAll(/paul walker number (\d+)/g)].at(-1)?.[1]);
  const respond = ({ context, seed }: ScriptedTurn) =>
    question(context) % 2 === 0 && seed % 2 === 0 ? RIGHT : WRONG;
  const logprob = (seed: number, j: number) => -6.2 + 1.2 * Math.sin(1.3 * j + seed);

  /** args() with the scripted engine, no validation and room for the long answer. */
  const scripted = (out: string, url: string, extra: string[]) =>
    startCli(
      args(out, [
        "rollout.engine=sglang",
        `rollout.engine_url=${url}`,
        "data.val_files=[]",
        "trainer.val_before_train=false",
        `data.max_response_length=${MAX_RESPONSE}`,
        "actor.ppo_mini_batch_size=4",
        ...extra,
      ]),
    ).result;

  it("dynamic sampling keeps the groups that vary and draws until the batch is full; rollout correction, clip-higher and overlong shaping run with it", async () => {
    const engine = await startScriptedEngine(MODEL, respond, logprob);
    const out = path.join(dir, "dapo");
    try {
      const r = await scripted(out, engine.url, [
        "trainer.total_training_steps=2",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=0",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=0.5_2",
        "actor.clip_ratio_low=0.2",
        "actor.clip_ratio_high=0.28",
        "reward.overlong_buffer.enable=true",
        `reward.overlong_buffer.len=${BUFFER}`,
      ]);
      expect(r.code, r.stderr).toBe(0);
    } finally {
      await engine.close();
    }
    const rows = metrics(out);
    expect(rows.map((x) => x.step)).toEqual([1, 2]);
    let offset = 0;
    for (const row of rows) {
      // Each generation batch is 4 prompts × 2, rounds one after the other.
      const rounds = row["train/num_gen_batches"] as number;
      const calls = engine.calls.slice(offset, offset + rounds * 8);
      offset += rounds * 8;
      expect(calls).toHaveLength(rounds * 8);
      const varying = (cs: typeof calls) =>
        cs.filter((c) => question(c.turn.context) % 2 === 0).length / 2;
      const last = calls.slice(-8);
      expect(varying(calls.slice(0, -8))).toBeLessThan(4); // not full before the last round
      expect(varying(calls)).toBeGreaterThanOrEqual(4);
      expect(varying(last)).toBeGreaterThan(0);
      const groups = rounds * 4;
      expect(row["train/filtered_group_ratio"]).toBeCloseTo((groups - varying(calls)) / groups, 12);
      // Reward over every trajectory the step generated: exact match plus the DAPO penalty
      // on the answer's length (its tokens, cut at max_response_length).
      const penalty = calls.map((c) =>
        overlongPenalty(Math.min(c.tokens, MAX_RESPONSE), MAX_RESPONSE, BUFFER, 1),
      );
      const em = calls.map((c) => (c.text === RIGHT ? 1 : 0));
      const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
      expect(Math.min(...penalty)).toBeLessThan(0); // the long answer pays
      expect(row["em/mean"]).toBeCloseTo(mean(em), 12);
      expect(row["reward/overlong_penalty/mean"]).toBeCloseTo(mean(penalty), 12);
      expect(row["reward/mean"]).toBeCloseTo(mean(em) + mean(penalty), 12);
      // Rollout correction saw the mismatch: weights around 1, some tokens rejected.
      expect(Math.abs(row["rollout_corr/kl"] as number)).toBeGreaterThan(1e-3);
      expect(row["rollout_corr/rollout_is_mean"]).toBeGreaterThan(0.2);
      expect(row["rollout_corr/rollout_is_min"]).toBeLessThan(row["rollout_corr/rollout_is_mean"]);
      expect(row["rollout_corr/rollout_is_mean"]).toBeLessThan(row["rollout_corr/rollout_is_max"]);
      const masked = row["rollout_corr/rollout_rs_masked_fraction"] as number;
      expect(masked).toBeGreaterThan(0);
      expect(masked).toBeLessThan(1);
      expect(row).toHaveProperty("actor/pg_loss");
    }
    // The data order makes both steps draw more than once (groups of odd questions dropped).
    for (const row of rows) expect(row["train/num_gen_batches"]).toBeGreaterThan(1);
    expect(engine.weightUpdates).toBe(2);
    // The checkpoint knows how far into the data the run is.
    const state = JSON.parse(
      readFileSync(path.join(runDir(out), "global_step_2", "controller.json"), "utf8"),
    );
    expect(state.genBatches).toBe(
      rows.reduce((n, row) => n + (row["train/num_gen_batches"] as number), 0),
    );
  }, 240_000);

  it("the importance weights reach the actor's loss; without them the mismatch is still logged", async () => {
    const engine = await startScriptedEngine(MODEL, respond, logprob);
    const step1 = async (name: string, extra: string[]) => {
      const out = path.join(dir, name);
      const r = await scripted(out, engine.url, ["trainer.total_training_steps=1", ...extra]);
      expect(r.code, r.stderr).toBe(0);
      return metrics(out)[0] as Record<string, number>;
    };
    try {
      const plain = await step1("is-off", []);
      const weighted = await step1("is-on", ["algorithm.rollout_correction.rollout_is=sequence"]);
      // The same rollouts and old log-probs: the same mismatch, a different policy loss.
      expect(weighted["reward/mean"]).toBe(plain["reward/mean"]);
      expect(weighted["rollout_corr/kl"]).toBe(plain["rollout_corr/kl"]);
      expect(plain).not.toHaveProperty("rollout_corr/rollout_is_mean");
      expect(weighted).toHaveProperty("rollout_corr/rollout_is_seq_mean");
      expect(Math.abs(weighted["actor/pg_loss"] - plain["actor/pg_loss"])).toBeGreaterThan(1e-4);
    } finally {
      await engine.close();
    }
  }, 240_000);

  it("dynamic sampling stops the run at max_num_gen_batches, naming the key", async () => {
    const engine = await startScriptedEngine(MODEL, () => WRONG, logprob);
    try {
      const r = await scripted(path.join(dir, "dapo-starved"), engine.url, [
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=2",
      ]);
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(
        /algorithm\.filter_groups\.max_num_gen_batches=2: step 1 drew 2 batches of 4 prompts and kept 0 of the 4 groups/,
      );
      expect(engine.calls).toHaveLength(16);
    } finally {
      await engine.close();
    }
  }, 120_000);

  it.each([
    [
      ["algorithm.rollout_correction.rollout_is=tokens"],
      2,
      /rollout_correction\.rollout_is" = "tokens".*token\|sequence/,
    ],
    [["algorithm.rollout_correction.rollout_is_threshold=0"], 2, /rollout_is_threshold" = 0/],
    [
      [
        "algorithm.rollout_correction.rollout_rs=token_k9",
        "algorithm.rollout_correction.rollout_rs_threshold=2",
      ],
      2,
      /rollout_rs: 'token_k9' is not one of token_k1/,
    ],
    [
      [
        "algorithm.rollout_correction.rollout_rs=token_k2",
        "algorithm.rollout_correction.rollout_rs_threshold=0.5_2",
      ],
      2,
      /rollout_rs_threshold: option token_k2 takes one upper bound/,
    ],
    [
      ["algorithm.rollout_correction.rollout_rs=token_k1"],
      2,
      /rollout_rs_threshold must be set when algorithm\.rollout_correction\.rollout_rs is/,
    ],
    [
      ["algorithm.rollout_correction.rollout_rs_threshold=2"],
      2,
      /rollout_rs_threshold=2 has no effect without algorithm\.rollout_correction\.rollout_rs/,
    ],
    [
      ["algorithm.rollout_correction.rollout_is=token", "rollout.compat=search-r1-retokenize"],
      2,
      /needs the engine's log-probs, which rollout\.compat=search-r1-retokenize drops/,
    ],
    [["algorithm.filter_groups.metric=f1"], 2, /filter_groups\.metric" = "f1"/],
    [
      ["algorithm.filter_groups.max_num_gen_batches=1.5"],
      2,
      /max_num_gen_batches" = 1\.5.*integer/,
    ],
    [
      [
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=seq_final_reward",
        "algorithm.use_kl_in_reward=true",
      ],
      2,
      /filter_groups\.metric=seq_final_reward with algorithm\.use_kl_in_reward/,
    ],
    [["actor.clip_ratio_low=1"], 2, /actor\.clip_ratio_low" = 1/],
    [["actor.clip_ratio_high=-0.1"], 2, /actor\.clip_ratio_high" = -0\.1/],
    [
      ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=9"],
      2,
      /reward\.overlong_buffer\.len=9 is longer than data\.max_response_length=8/,
    ],
    [["reward.overlong_buffer.len=0"], 2, /reward\.overlong_buffer\.len" = 0/],
    [["reward.overlong_buffer.penalty_factor=-1"], 2, /overlong_buffer\.penalty_factor" = -1/],
  ])("refuses %j naming the key", (extra, code, message) => {
    const r = runCli([...args(path.join(dir, "x")), ...extra]);
    expect(r.code, r.stderr).toBe(code);
    expect(r.stderr).toMatch(message);
  });
});
