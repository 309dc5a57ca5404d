// Search-R1's own training scripts (fixtures/search-r1/, as a user brings them) run with one
// word changed: `python3 -m verl.trainer.main_ppo[_format]` becomes `searchr1 train`. bash runs
// them as written; `searchr1` on their PATH is the real CLI behind a wrapper that records its
// exit code (the scripts pipe into tee, whose status bash reports) and, for the real runs,
// appends the test's small sizes after the script's own arguments.
import { spawnSync } from "node:child_process";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loraScratchOf, modelBytes, NO_OFFLOAD } from "../../src/planning/native-sizes.js";
import { BIN, startCli, startServing } from "../helpers/cli.js";
import { createHubServer } from "../helpers/hub-server.js";
import { QWEN_CONFIGS, writeModelConfig } from "../planning/model-configs.js";
import { MODEL, type SmallRun, smallRun } from "./small-run.js";

const FIXTURES = fileURLToPath(new URL("./fixtures/search-r1/", import.meta.url));

let small: SmallRun;
let work: string;

beforeAll(() => {
  small = smallRun("searchr1-scripts-");
  work = path.join(small.dir, "work");
  // The dry run plans from Qwen2.5's config.json alone, under the relative paths the scripts name.
  for (const [name, config] of Object.entries(QWEN_CONFIGS)) {
    writeModelConfig(path.join(work, name), config);
  }
}, 60_000);

afterAll(() => small?.cleanup());

interface ScriptRun {
  /** The exit code of `searchr1` itself. */
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs a fixture script with its verl module replaced by `searchr1 <replacement>`; `extra`
 * arguments are appended to the script's by the wrapper.
 */
function runScript(
  script: string,
  replacement: string,
  extra: string[] = [],
  edit: (text: string) => string = (t) => t,
): ScriptRun {
  const bin = path.join(work, "bin");
  mkdirSync(bin, { recursive: true });
  const status = path.join(work, "status");
  const quoted = extra.map((a) => `'${a.replaceAll("'", "'\\''")}'`).join(" ");
  writeFileSync(
    path.join(bin, "searchr1"),
    `#!/bin/sh\n"${process.execPath}" "${BIN}" "$@" ${quoted}\necho $? > "${status}"\n`,
  );
  chmodSync(path.join(bin, "searchr1"), 0o755);
  const text = readFileSync(path.join(FIXTURES, script), "utf8");
  const changed = edit(text).replace(/python3 -m verl\.trainer\.main_ppo(_format)?\b/, replacement);
  expect(changed).not.toBe(text);
  const file = path.join(work, script);
  writeFileSync(file, changed);
  const r = spawnSync("bash", [file], {
    cwd: work,
    env: { ...process.env, PATH: `${bin}:${process.env.PATH}` },
    encoding: "utf8",
    timeout: 240_000,
  });
  return {
    code: Number(readFileSync(status, "utf8").trim()),
    stdout: r.stdout,
    stderr: r.stderr,
  };
}

/** What searchr1 said that is not a "no effect" warning (the scripts pipe 2>&1 into tee). */
const otherMessages = (r: ScriptRun) =>
  `${r.stdout}\n${r.stderr}`
    .split("\n")
    .filter((l) => l.startsWith("searchr1:") && !/^searchr1: warning: .* has no effect/.test(l));

describe("Search-R1's scripts with `searchr1 train --dry-run` in place of verl", () => {
  it.each([
    ["v0.2-train_grpo.sh", "Qwen/Qwen2.5-7B", 10, "512 prompts × 5 = 2560 trajectories"],
    ["v0.2-train_ppo.sh", "Qwen/Qwen2.5-7B", 2, "512 prompts × 1 = 512 trajectories"],
    ["v0.3-train_grpo_format.sh", "Qwen/Qwen2.5-3B", 10, "512 prompts × 5 = 2560 trajectories"],
  ])(
    "%s: exit 0, only no-effect warnings, its optimizer steps",
    (script, model, steps, step) => {
      const r = runScript(script, "searchr1 train --dry-run");
      expect(r.code, r.stdout.slice(-3000)).toBe(0);
      expect(otherMessages(r)).toEqual([]);
      // The offloads they set (fsdp_config's) move the actor's (and critic's) state to host
      // memory in the plan.
      expect(r.stdout).toMatch(/^actor +fp32 master weights \(host memory\) +\d/m);
      if (script.includes("ppo")) {
        expect(r.stdout).toMatch(/^critic +AdamW moments \(fp32 m, v\) \(host memory\) /m);
      }
      expect(r.stdout).toContain(`model ${model}:`);
      expect(r.stdout).toContain(`of 8 (trainer.gpus 8 × trainer.nnodes 1)`);
      expect(r.stdout).toContain(`a step: ${step}; ${steps} optimizer steps of 256`);
      // verl's global sizes divided by the 8 GPUs: micro 64 → 8, log-prob 128 → 16 (critic 8 → 1).
      expect(r.stdout).toMatch(
        /^per rank of 8: micro-batches of 8 \(actor\), log-prob passes of 16 \(old\) and 16 \(reference\)/m,
      );
      if (script.includes("ppo")) expect(r.stdout).toContain(", 1 (critic) and 1 (values)");
      // 8 × 80 GB holds each: the forward-only passes keep two layer inputs, and a phase holds
      // the activations of its own command alone (docs/memory.md).
      expect(r.stdout).toMatch(/^fits 79\.00 GiB at ZeRO stage 2 \(/m);
    },
    60_000,
  );

  // Issue 42: the v0.2 GRPO script on ONE 80 GB GPU with LoRA rank 32 on every linear layer.
  // As written its actor's grad and optimizer offloads and its reference's are refused beside
  // adapters (as the run refuses them); with them off, its param offload kept (the frozen
  // base in host memory between phases), and Search-R1's micro-batches per GPU (its 64 and
  // 128 over 8 GPUs: 8 and 16), the frozen 7B base, the adapters' state and the engine fit.
  it("v0.2-train_grpo.sh with LoRA rank 32 on one GPU: the offloads refused, then it fits", () => {
    const lora = ["actor_rollout_ref.model.lora_rank=32", "trainer.n_gpus_per_node=1"];
    const refused = runScript("v0.2-train_grpo.sh", "searchr1 train --dry-run", lora);
    expect(refused.code).toBe(2);
    expect(otherMessages(refused).join("\n")).toMatch(
      /actor\.grad_offload=true with LoRA \(model\.lora_rank=32\): the frozen base has no gradient or optimizer state/,
    );
    const r = runScript("v0.2-train_grpo.sh", "searchr1 train --dry-run", [
      ...lora,
      ...["grad_offload", "optimizer_offload"].map(
        (k) => `actor_rollout_ref.actor.fsdp_config.${k}=false`,
      ),
      "actor_rollout_ref.ref.fsdp_config.param_offload=false",
      "actor_rollout_ref.actor.ppo_micro_batch_size=8",
      "actor_rollout_ref.rollout.log_prob_micro_batch_size=16",
      "actor_rollout_ref.ref.log_prob_micro_batch_size=16",
    ]);
    expect(r.code, r.stdout.slice(-3000)).toBe(0);
    expect(otherMessages(r)).toEqual([]);
    expect(r.stdout).toContain("of 1 (trainer.gpus 1 × trainer.nnodes 1)");
    expect(r.stdout).toMatch(
      /^per rank of 1: micro-batches of 8 \(actor\), log-prob passes of 16/m,
    );
    expect(r.stdout).toContain("ZeRO stage 0 (trainer.zero_stage null: 0 with LoRA)");
    // The LoRA rows are the plan's (searchr1-trainer plan --lora-rank 32: Learner::planned,
    // lora_scratch) at 8 × 6548 and 16 × 6548 tokens.
    const plan = modelBytes({
      dir: path.join(work, "Qwen/Qwen2.5-7B"),
      head: "lm",
      device: "cuda",
      ranks: 1,
      offload: NO_OFFLOAD,
      tokens: [8 * 6548, 16 * 6548],
      lora: { rank: 32, targets: "all-linear" },
    });
    const l = plan.lora?.learner[0];
    if (!l) throw new Error("the plan sized no adapters");
    const gib = (b: number) => (b / 2 ** 30).toFixed(2).replace(".", "\\.");
    const row = (name: string, bytes: number) =>
      expect(r.stdout).toMatch(new RegExp(`^actor +${name} +${gib(bytes)} +${gib(bytes)} `, "m"));
    row(
      "weights \\(bf16 compute copy, frozen\\), on the device during its commands only",
      l.weights,
    );
    row(
      "weights \\(bf16 compute copy, frozen\\) between its commands \\(host memory\\)",
      l.weights,
    );
    row("LoRA rank 32 adapters: fp32 weights and their bf16 copy", l.masters);
    row("LoRA adapters: AdamW moments \\(fp32 m, v\\)", l.optimizer);
    row("LoRA adapters: fp32 gradients", l.gradientsBetween);
    row(".*scratch.*, update micro-batch \\(52,384 tokens\\)", loraScratchOf(plan, 8 * 6548));
    row(".*scratch.*, log-prob micro-batch \\(104,768 tokens\\)", loraScratchOf(plan, 16 * 6548));
    // No fp32 masters, moments or gradients of the base, no reference copy.
    expect(r.stdout).not.toMatch(/^actor +fp32 master weights/m);
    expect(r.stdout).not.toMatch(/^reference +weights/m);
    // The peak, whichever moment it falls in, is below 80 GB (74.51 GiB) and fits 79 GiB.
    const totals = [...r.stdout.matchAll(/^total during the [\w-]+ +([\d.]+) /gm)].map((m) =>
      Number(m[1]),
    );
    expect(totals).toHaveLength(3);
    expect(Math.max(...totals) * 2 ** 30).toBeLessThan(80e9);
    expect(r.stdout).toMatch(/^fits 79\.00 GiB at ZeRO stage 0 \(/m);
  }, 60_000);

  it("config train --from-script says what each line became", () => {
    const r = spawnSync(
      process.execPath,
      [BIN, "config", "train", "--from-script", path.join(FIXTURES, "v0.2-train_ppo.sh")],
      { cwd: work, encoding: "utf8" },
    );
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^# {3}actor_rollout_ref\.actor\.optim\.lr=1e-6 {2}-> {2}actor\.lr$/m);
    expect(r.stdout).toMatch(/^# {3}algorithm\.adv_estimator=gae {2}-> {2}algorithm\.name$/m);
    expect(r.stdout).toMatch(/^# {3}max_turns=4 {2}-> {2}rollout\.max_turns$/m);
    expect(r.stdout).toMatch(
      /^# {3}actor_rollout_ref\.model\.use_remove_padding=True {2}-> {2}no effect/m,
    );
    expect(r.stdout).toMatch(/^# {3}algorithm\.no_think_rl=false {2}-> {2}accepted at false/m);
    // What the PPO script computes under Search-R1's defaults: the KL in the reward (its
    // use_kl_loss is false by default), no repeat, verl's 0.95 nucleus sampling... set to 1.0.
    expect(r.stdout).toMatch(/^ {2}name: ppo$/m);
    expect(r.stdout).toMatch(/^ {2}use_kl_in_reward: true$/m);
    expect(r.stdout).toMatch(/^ {2}use_kl_loss: false$/m);
    expect(r.stdout).toMatch(/^ {2}n_agent: 1$/m);
    expect(r.stdout).toMatch(/^ {2}top_p: 1$/m);
    expect(r.stdout).toMatch(
      /^ {2}default_local_dir: verl_checkpoints\/nq_hotpotqa_train-search-r1-ppo-qwen2.5-7b-em$/m,
    );
  });
});

describe("--dry-run --model <hub repository id>", () => {
  it("plans from the repository's config.json alone, read from the hub", async () => {
    const hub = await createHubServer({
      repos: [
        {
          id: "Qwen/Qwen2.5-7B",
          type: "model",
          files: [
            {
              path: "config.json",
              content: Buffer.from(JSON.stringify(QWEN_CONFIGS["Qwen/Qwen2.5-7B"])),
            },
            { path: "model-00001-of-00004.safetensors", content: Buffer.alloc(64), lfs: true },
          ],
        },
      ],
    });
    try {
      const run = (model: string) =>
        startCli(["train", "--model", model, "--gpus", "8", "--dry-run"], {
          cwd: small.dir,
          env: { HF_ENDPOINT: hub.url },
        }).result;
      const r = await run("Qwen/Qwen2.5-7B");
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toMatch(/^model Qwen\/Qwen2\.5-7B: 7,615,616,512 parameters/m);
      // Only the config was asked for.
      const paths = hub.requests.map((q) => q.path);
      expect(paths.some((p) => p.includes("config.json"))).toBe(true);
      expect(paths.some((p) => p.includes("safetensors"))).toBe(false);
      const missing = await run("Qwen/No-Such-Model");
      expect(missing.code).toBe(1);
      expect(missing.stderr).toMatch(
        /model\.path Qwen\/No-Such-Model: no such folder here, and its config\.json could not be read from the hub/,
      );
    } finally {
      await hub.close();
    }
  }, 60_000);
});

describe("Search-R1's scripts with `searchr1 train` in place of verl start a real run", () => {
  // The test's tiny model, data and retriever and a step of 2 prompts appended after the
  // script's own arguments (a later key wins); everything else as the script says.
  const tiny = (extra: string[]) => [
    `model.path=${MODEL}`,
    // small.args without its command, model and output folder, and its group and mini-batch.
    ...small
      .args(path.join(work, "runs"))
      .slice(5)
      .filter((a) => !/^(rollout\.n|actor\.ppo_mini_batch_size)=/.test(a)),
    "trainer.gpus=1",
    "trainer.logger=[console]",
    "trainer.val_before_train=false",
    "trainer.total_training_steps=1",
    "data.train_batch_size=2",
    "data.max_start_length=300",
    ...extra,
  ];

  it("v0.2 GRPO: each prompt repeated n_agent = 5 times, its KL loss", () => {
    const r = runScript(
      "v0.2-train_grpo.sh",
      "searchr1 train",
      tiny([
        "actor.ppo_mini_batch_size=5",
        "actor.ppo_micro_batch_size=5",
        "rollout.log_prob_micro_batch_size=10",
      ]),
    );
    expect(r.code, r.stdout.slice(-3000)).toBe(0);
    expect(r.stdout + r.stderr).toMatch(/1 steps of 2 prompts × 5, 2 optimizer steps each/);
  }, 240_000);

  it("v0.2 PPO: a critic, the KL in the reward", () => {
    const r = runScript(
      "v0.2-train_ppo.sh",
      "searchr1 train",
      tiny([
        "actor.ppo_mini_batch_size=1",
        "actor.ppo_micro_batch_size=1",
        "critic.ppo_micro_batch_size=1",
        `critic.model.path=${MODEL}`,
        "rollout.log_prob_micro_batch_size=2",
      ]),
    );
    expect(r.code, r.stdout.slice(-3000)).toBe(0);
    expect(r.stdout + r.stderr).toMatch(/1 steps of 2 prompts × 1, 2 optimizer steps each/);
  }, 240_000);
});

describe("Search-R1's evaluate.sh, its BASE_MODEL set to a checkpoint", () => {
  // The script evaluates with main_ppo's +trainer.val_only=true; here `searchr1 eval`, or
  // `searchr1 train` whose trainer.val_only validates once and stops.
  const setModel = (text: string) =>
    text.replace(/^export BASE_MODEL=""$/m, `export BASE_MODEL='${MODEL}'`);
  const value = (args: string[], key: string) =>
    (args.find((a) => a.startsWith(`${key}=`)) as string).slice(key.length + 1);

  it("runs as `searchr1 eval` and as `searchr1 train`, warning only of keys that do nothing here", async () => {
    const args = small.args(path.join(work, "runs"));
    const served = await startServing(
      [
        "serve-retriever",
        "--index",
        value(args, "retriever.index"),
        "--corpus",
        value(args, "retriever.corpus"),
        "--port",
        "0",
      ],
      /serving \S+ retrieval over .* at (http:\/\/\S+\/retrieve)/,
      { timeoutMs: 30_000 },
    );
    try {
      const small = [
        `data.val_files=${value(args, "data.val_files")}`,
        `retriever.url=${served.url}`,
        "data.max_start_length=300",
        "data.max_prompt_length=400",
        "data.max_response_length=8",
        "data.max_obs_length=24",
        "max_turns=1",
        "rollout.engine_device=cpu",
        "rollout.engine_threads=1",
      ];
      const out = path.join(work, "eval");
      const evaluated = runScript(
        "evaluate.sh",
        "searchr1 eval",
        [...small, `output_dir=${out}`],
        setModel,
      );
      expect(evaluated.code, evaluated.stdout.slice(-3000)).toBe(0);
      expect(otherMessages(evaluated)).toEqual([]);
      expect(evaluated.stderr).toMatch(
        /trainer\.val_only=true .* has no effect in searchr1: a training key/,
      );
      expect(existsSync(path.join(out, "report.json"))).toBe(true);

      const validated = runScript(
        "evaluate.sh",
        "searchr1 train",
        [
          ...small,
          // The script's data.train_files (not here) is not read: nothing is trained.
          "trainer.gpus=1",
          "trainer.device=cpu",
          "trainer.threads=1",
          `trainer.default_local_dir=${path.join(work, "val-only")}`,
        ],
        setModel,
      );
      expect(validated.code, validated.stderr.slice(-3000)).toBe(0);
      expect(otherMessages(validated)).toEqual([]);
      expect(validated.stdout).toMatch(/^done: .*val-only \(validation\/\)$/m);
      expect(existsSync(path.join(work, "val-only", "global_step_1"))).toBe(false);
    } finally {
      await served.stop();
    }
  }, 240_000);
});

describe("every shipped recipe at its published scale", () => {
  // templates/configs/ with the models they name (their config.json alone), as published: 8
  // GPUs of 80 GB. The quickstart's tiny CPU recipe names no model.
  const TEMPLATES = fileURLToPath(new URL("../../templates/configs/", import.meta.url));
  it("fits 8 × 80 GB (train --dry-run)", () => {
    for (const [name, config] of [
      ["models/Qwen2.5-7B", QWEN_CONFIGS["Qwen/Qwen2.5-7B"]],
      ["models/Qwen2.5-3B", QWEN_CONFIGS["Qwen/Qwen2.5-3B"]],
      ["models/Qwen2.5-3B-Instruct", QWEN_CONFIGS["Qwen/Qwen2.5-3B"]],
    ] as const) {
      writeModelConfig(path.join(work, name), config);
    }
    const recipes = readdirSync(TEMPLATES).filter(
      (f) => f.endsWith(".yaml") && f !== "quickstart.yaml",
    );
    expect(recipes.length).toBeGreaterThanOrEqual(7);
    for (const recipe of recipes) {
      const r = spawnSync(
        process.execPath,
        [BIN, "train", "--config", path.join(TEMPLATES, recipe), "--dry-run"],
        { cwd: work, encoding: "utf8" },
      );
      expect(r.status, `${recipe}: ${r.stderr}`).toBe(0);
      expect(r.stdout, recipe).toMatch(/of 8 \(trainer\.gpus 8 × trainer\.nnodes 1\)/);
      expect(r.stdout, recipe).toMatch(/^fits 79\.00 GiB at ZeRO stage 2/m);
    }
  }, 60_000);
});
