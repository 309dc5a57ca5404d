// verl's and Search-R1's key names (src/config/verl-keys.ts), their defaults, the batch
// arithmetic of their workers (src/trainer/batch-sizes.ts) and the reading of their shell
// scripts (src/config/script-args.ts).
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { resolveConfig } from "../../src/config/resolve.js";
import { evalSpec } from "../../src/config/schemas/eval.js";
import { trainSpec } from "../../src/config/schemas/train.js";
import { readScriptCommand } from "../../src/config/script-args.js";
import { batchSizes, passSize, updateTokens } from "../../src/trainer/batch-sizes.js";
import { usageErrorOf } from "../helpers/usage-error.js";

const dir = mkdtempSync(join(tmpdir(), "searchr1-verl-keys-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const MODEL = "actor_rollout_ref.model.path=/m";

function train(overrides: string[], configFile?: string) {
  const warnings: string[] = [];
  const config = resolveConfig(trainSpec, {
    overrides,
    configFile,
    env: {},
    warn: (l) => warnings.push(l),
  });
  return { config, warnings };
}

describe("verl's and Search-R1's key names", () => {
  it("map onto this project's keys, from overrides and from verl's nested YAML alike", () => {
    const overrides = [
      MODEL,
      "actor_rollout_ref.actor.optim.lr=5e-7",
      "actor_rollout_ref.actor.optim.warmup_style=cosine",
      "actor_rollout_ref.rollout.n_agent=5",
      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
      "critic.optim.lr=2e-5",
      "critic.model.path=/c",
      "algorithm.adv_estimator=gae",
      "algorithm.kl_ctrl.kl_coef=0.002",
      "trainer.n_gpus_per_node=4",
      "max_turns=3",
      "reward_model.structure_format_score=0.2",
    ];
    const yaml = [
      "actor_rollout_ref:",
      "  model: { path: /m }",
      "  actor:",
      "    optim: { lr: 5.0e-7, warmup_style: cosine }",
      "  rollout: { n_agent: 5 }",
      "  ref: { log_prob_micro_batch_size_per_gpu: 4 }",
      "critic:",
      "  optim: { lr: 2.0e-5 }",
      "  model: { path: /c }",
      "algorithm: { adv_estimator: gae, kl_ctrl: { kl_coef: 0.002 } }",
      "trainer: { n_gpus_per_node: 4 }",
      "max_turns: 3",
      "reward_model: { structure_format_score: 0.2 }",
    ].join("\n");
    const file = join(dir, "verl.yaml");
    writeFileSync(file, yaml);
    for (const { config } of [train(overrides), train([], file)]) {
      expect(config.model.path).toBe("/m");
      expect(config.actor).toMatchObject({ lr: 5e-7, lr_scheduler: "cosine" });
      expect(config.rollout).toMatchObject({ n_agent: 5, max_turns: 3 });
      expect(config.ref.log_prob_micro_batch_size_per_gpu).toBe(4);
      expect(config.critic).toMatchObject({ lr: 2e-5, model_path: "/c" });
      expect(config.algorithm).toMatchObject({ name: "ppo", kl_coef: 0.002 });
      expect(config.trainer.gpus).toBe(4);
      // Only Search-R1's main_ppo_format reads the format scores: setting one asks for it.
      expect(config.reward).toMatchObject({ format_reward: true, structure_format_score: 0.2 });
    }
  });

  it("take +key= additions and a key given twice (the last wins); warn once per no-effect key", () => {
    const { config, warnings } = train([
      MODEL,
      "+trainer.val_only=true",
      "trainer.default_hdfs_dir=null",
      "actor_rollout_ref.model.use_remove_padding=True",
      "trainer.default_hdfs_dir=null",
      "trainer.save_freq=10",
      "trainer.save_freq=20",
    ]);
    expect(config.trainer).toMatchObject({ val_only: true, save_freq: 20 });
    expect(warnings).toHaveLength(2);
    warnings.sort().reverse();
    expect(warnings[0]).toMatch(
      /^searchr1: warning: trainer\.default_hdfs_dir=null \(override trainer\.default_hdfs_dir=null\) has no effect in searchr1: /,
    );
    expect(warnings[1]).toMatch(/use_remove_padding=true .* has no effect .* packs sequences/);
  });

  it("warn about the scripts' environment that changes nothing here", () => {
    const warnings: string[] = [];
    resolveConfig(trainSpec, {
      overrides: [MODEL],
      env: { VLLM_ATTENTION_BACKEND: "XFORMERS" },
      warn: (l) => warnings.push(l),
    });
    expect(warnings).toEqual([
      expect.stringMatching(/^searchr1: warning: VLLM_ATTENTION_BACKEND=XFORMERS has no effect/),
    ]);
  });

  it("refuse a value that cannot be honoured, naming the key and where it was set", () => {
    expect(usageErrorOf(() => train([MODEL, "algorithm.no_think_rl=true"]))).toMatch(
      /^"algorithm\.no_think_rl" = true \(override algorithm\.no_think_rl=true\): cannot be honoured here \(Search-R1 raises on it too\); accepted: false$/,
    );
    expect(
      usageErrorOf(() =>
        train([MODEL, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"]),
      ),
    ).toMatch(/ulysses_sequence_parallel_size" = 2 .*accepted: 1$/);
    // Accepted silently at the value searchr1 honours anyway.
    expect(train([MODEL, "data.train_data_num=null", "trainer.critic_warmup=0"]).warnings).toEqual(
      [],
    );
  });

  it("keep this project's own keys first, and an unknown key an error", () => {
    expect(train(["model.path=/m", "rollout.n=3"]).config.rollout.n).toBe(3);
    expect(usageErrorOf(() => train([MODEL, "actor_rollout_ref.actor.optim.lrr=1"]))).toMatch(
      /unknown key "actor_rollout_ref"/,
    );
  });
});

describe("Search-R1's defaults under a config in verl's names", () => {
  it("are what its PPO script computes with: KL in the reward, no repeat, top_p 0.95", () => {
    const { config } = train([MODEL, "algorithm.adv_estimator=gae"]);
    expect(config.actor.use_kl_loss).toBe(false);
    expect(config.algorithm.use_kl_in_reward).toBe(true);
    expect(config.rollout).toMatchObject({ n: 1, n_agent: 1, top_p: 0.95, max_turns: 10 });
    expect(config.actor).toMatchObject({ lr_warmup_steps_ratio: 0, gradient_checkpointing: false });
    expect(config.trainer).toMatchObject({ gpus: 8, total_epochs: 30, total_training_steps: null });
    // The KL in the loss instead: none in the reward, unless the config says so.
    const grpo = train([MODEL, "actor_rollout_ref.actor.use_kl_loss=true"]).config;
    expect(grpo.algorithm.use_kl_in_reward).toBe(false);
    const both = train([
      MODEL,
      "actor_rollout_ref.actor.use_kl_loss=true",
      "algorithm.use_kl_in_reward=true",
    ]).config;
    expect(both.algorithm.use_kl_in_reward).toBe(true);
  });

  it("are not used by a config in this project's names", () => {
    const { config } = train(["model.path=/m"]);
    expect(config.rollout).toMatchObject({ n: 5, top_p: 1 });
    expect(config.actor.use_kl_loss).toBe(true);
  });

  it("lie under a YAML file of this project's keys that a verl override joins", () => {
    const file = join(dir, "ours.yaml");
    writeFileSync(file, "model: { path: /m }\nrollout: { n: 4, top_p: 1.0 }\n");
    const { config } = train(["actor_rollout_ref.actor.optim.lr=3e-6"], file);
    expect(config.rollout).toMatchObject({ n: 4, top_p: 1 });
    expect(config.actor.lr).toBe(3e-6);
  });
});

describe("eval reads a training script's keys", () => {
  it("takes the model and lengths, and warns that the training keys do nothing", () => {
    const warnings: string[] = [];
    const config = resolveConfig(evalSpec, {
      overrides: [
        "actor_rollout_ref.model.path=/m",
        "data.train_files=/t.parquet",
        "data.val_files=/v.parquet",
        "data.max_obs_length=400",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "+trainer.val_only=true",
        "max_turns=4",
      ],
      env: {},
      warn: (l) => warnings.push(l),
    });
    expect(config.model.path).toBe("/m");
    expect(config.data).toMatchObject({ val_files: ["/v.parquet"], max_obs_length: 400 });
    expect(config.rollout.max_turns).toBe(4);
    expect(warnings.join("\n")).toMatch(/data\.train_files=.* a training key/);
    expect(warnings.join("\n")).toMatch(/actor_rollout_ref\.actor\.optim\.lr=.* a training key/);
    expect(warnings.join("\n")).toMatch(/trainer\.val_only=true .* a training key/);
  });
});

describe("verl's batch arithmetic", () => {
  const config = (overrides: string[]) => train(["model.path=/m", ...overrides]).config;

  it("Search-R1 v0.2 GRPO on 8 GPUs: 2,560 trajectories in 10 optimizer steps of 256", () => {
    const b = batchSizes(
      config([
        "data.train_batch_size=512",
        "rollout.n=1",
        "rollout.n_agent=5",
        "actor.ppo_mini_batch_size=256",
        "actor.ppo_micro_batch_size=64",
        "rollout.log_prob_micro_batch_size=128",
      ]),
      8,
    );
    expect(b).toMatchObject({ group: 5, trajectories: 2560, optimizerSteps: 10, critic: null });
    expect(b.actor).toEqual({ miniBatch: 256, epochs: 1, microPerRank: 8, tokensPerRank: null });
    expect(b.policyLogProbs).toEqual({ microPerRank: 16, tokensPerRank: null });
    expect(b.refLogProbs).toEqual({ microPerRank: 16, tokensPerRank: null });
  });

  it("verl's rollout.n: the mini-batch counts prompts × n", () => {
    const b = batchSizes(
      config(["data.train_batch_size=512", "rollout.n=5", "actor.ppo_mini_batch_size=256"]),
      8,
    );
    expect(b).toMatchObject({ group: 5, trajectories: 2560, optimizerSteps: 2 });
    expect(b.actor.miniBatch).toBe(1280);
  });

  it("PPO: the critic's global micro-batch divided too, its mini-batch the actor's", () => {
    const b = batchSizes(
      config(["algorithm.name=ppo", "rollout.n=1", "critic.ppo_micro_batch_size=8"]),
      8,
    );
    expect(b.critic).toEqual({ miniBatch: 256, epochs: 1, microPerRank: 1, tokensPerRank: null });
    expect(b.values).toEqual({ microPerRank: 1, tokensPerRank: null });
  });

  it("takes *_per_gpu sizes as given, and token budgets with use_dynamic_bsz", () => {
    const b = batchSizes(
      config([
        "rollout.n=1",
        "actor.ppo_micro_batch_size_per_gpu=4",
        "rollout.log_prob_use_dynamic_bsz=true",
        "rollout.log_prob_max_token_len_per_gpu=1000",
        "ref.log_prob_micro_batch_size_per_gpu=3",
        "ref.log_prob_use_dynamic_bsz=false",
      ]),
      8,
    );
    expect(b.actor.microPerRank).toBe(4);
    expect(updateTokens(b.actor, 300)).toBe(1200);
    expect(passSize(b.policyLogProbs, 300)).toBe(3);
    expect(passSize(b.policyLogProbs, 3000)).toBe(1);
    expect(passSize(b.refLogProbs, 300)).toBe(3);
    const dynamic = batchSizes(
      config(["rollout.n=1", "actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=9000"]),
      8,
    );
    expect(dynamic.actor).toMatchObject({ microPerRank: null, tokensPerRank: 9000 });
    expect(updateTokens(dynamic.actor, 300)).toBe(9000);
    // The log-probs follow the actor's by default (verl's interpolation).
    expect(dynamic.policyLogProbs).toEqual({ microPerRank: null, tokensPerRank: 9000 });
  });

  it("refuses what does not divide, as verl asserts", () => {
    expect(usageErrorOf(() => batchSizes(config(["rollout.n=1"]), 3))).toMatch(
      /^actor\.ppo_mini_batch_size × rollout\.n \(256\) is a global size, divided by the 3 data-parallel ranks .* 256 is not a multiple of 3/,
    );
    expect(
      usageErrorOf(() => batchSizes(config(["rollout.n=1", "actor.ppo_micro_batch_size=10"]), 4)),
    ).toMatch(/^actor\.ppo_micro_batch_size is a global size, divided by the 4/);
  });
});

describe("a shell script's training line", () => {
  it("is read as bash would: variables, quotes, continuations, up to the pipe", () => {
    const file = join(dir, "train.sh");
    writeFileSync(
      file,
      [
        "data_name=nq",
        // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell variable, as bash reads it
        "export DATA_DIR=data/${data_name} # a comment",
        "export BASE_MODEL='Qwen/Qwen2.5-3B'",
        'NAME="run one"',
        "# python3 -m verl.trainer.main_ppo commented=out",
        "PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo \\",
        "    data.train_files=$DATA_DIR/train.parquet \\",
        "    actor_rollout_ref.model.path=$BASE_MODEL \\",
        '    trainer.experiment_name="$NAME" \\',
        "    'retriever.url=http://h:8000/$x' \\",
        "    --dry-run \\",
        "    2>&1 | tee $NAME.log",
      ].join("\n"),
    );
    expect(readScriptCommand(file, { x: "unused" })).toEqual({
      program: "python3 -m verl.trainer.main_ppo",
      overrides: [
        "data.train_files=data/nq/train.parquet",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-3B",
        "trainer.experiment_name=run one",
        "retriever.url=http://h:8000/$x",
      ],
      others: ["--dry-run"],
      env: { DATA_DIR: "data/nq", BASE_MODEL: "Qwen/Qwen2.5-3B", PYTHONUNBUFFERED: "1" },
    });
  });

  it("is refused when there is none, naming the file", () => {
    const file = join(dir, "none.sh");
    writeFileSync(file, "echo hello\n");
    expect(usageErrorOf(() => readScriptCommand(file, {}))).toMatch(
      /none\.sh: no training command found/,
    );
  });
});
