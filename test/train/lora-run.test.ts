// `searchr1 train` with LoRA (model.lora_rank), end to end on the CPU with its real children:
// the native trainer trains adapters on the frozen tiny model, the reference is that model with
// its adapters off, the engine gets the adapter alone each step (a PEFT folder it serves
// unmerged, no merged weights), and each checkpoint holds a PEFT adapter folder that a resumed
// run goes on from.
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readSafetensors } from "../../src/tensors/safetensors.js";
import { runCli } from "../helpers/cli.js";
import { deterministic, MODEL, metrics, runDir, type SmallRun, smallRun } from "./small-run.js";

let run: SmallRun;

beforeAll(() => {
  run = smallRun("searchr1-lora-");
}, 60_000);

afterAll(() => run?.cleanup());

/** GRPO with rank-4 adapters on q/v/down, one optimizer step per training step. */
const LORA = [
  "model.lora_rank=4",
  "model.lora_alpha=8",
  "model.target_modules=[q_proj,v_proj,down_proj,up_proj]",
  "model.exclude_modules=[up_proj]",
  "actor.ppo_mini_batch_size=4",
  "actor.entropy_coeff=0.01",
  "trainer.test_freq=100",
  "trainer.val_before_train=false",
];

const hashes = (dir: string) =>
  Object.fromEntries(
    readdirSync(dir)
      .filter((f) => f.endsWith(".safetensors"))
      .map((f) => [
        f,
        createHash("sha256")
          .update(readFileSync(path.join(dir, f)))
          .digest("hex"),
      ]),
  );

const adapterOf = (out: string, step: number) =>
  path.join(runDir(out), `global_step_${step}`, "adapter");

/**
 * Two steps, then a resumed run to three, into run.dir/`name` with `args`: its metrics rows
 * are the 3-step `straight` run's (validation aside: the first of the two validated its last
 * step, step 2, the straight run did not), and each of `files` of its step-3 checkpoint is
 * the straight run's, byte for byte.
 */
function expectResumedEqualsStraight(
  straight: string,
  name: string,
  args: string[],
  files: string[],
): void {
  const resumed = path.join(run.dir, name);
  const first = runCli(run.args(resumed, [...args, "trainer.total_training_steps=2"]));
  expect(first.code, first.stderr).toBe(0);
  const second = runCli(run.args(resumed, [...args, "trainer.total_training_steps=3"]));
  expect(second.code, second.stderr).toBe(0);
  expect(second.stderr).toMatch(/resuming from .*global_step_2 \(step 2\)/);
  const trained = (row: Record<string, number>) =>
    Object.fromEntries(Object.entries(deterministic(row)).filter(([k]) => !k.startsWith("val/")));
  expect(metrics(resumed).map(trained)).toEqual(metrics(straight).map(trained));
  for (const file of files) {
    const bytes = (out: string) => readFileSync(path.join(runDir(out), "global_step_3", file));
    expect(bytes(resumed).equals(bytes(straight)), file).toBe(true);
  }
}

describe("searchr1 train with LoRA", () => {
  it("trains adapters on the frozen model, KL against the adapters-off policy, PEFT folders in the checkpoints; a resumed run equals the straight one", async () => {
    const base = hashes(MODEL);
    const straight = path.join(run.dir, "straight");
    const r = runCli(run.args(straight, [...LORA, "trainer.total_training_steps=3"]), {});
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/LoRA: rank 4, scaling 2 on q_proj, v_proj, down_proj: \d+ trainable/);
    // The base model's files are untouched, and no checkpoint holds a copy of it.
    expect(hashes(MODEL)).toEqual(base);
    const ckpt = path.join(runDir(straight), "global_step_3");
    expect(readdirSync(ckpt).sort()).toEqual(
      ["actor.optimizer.safetensors", "actor.rng.txt", "adapter", "controller.json"].sort(),
    );

    // PEFT's adapter folder.
    const config = JSON.parse(
      readFileSync(path.join(adapterOf(straight, 3), "adapter_config.json"), "utf8"),
    );
    expect(config).toMatchObject({
      peft_type: "LORA",
      task_type: "CAUSAL_LM",
      r: 4,
      lora_alpha: 8,
      use_rslora: false,
      base_model_name_or_path: MODEL,
    });
    expect([...config.target_modules].sort()).toEqual(["down_proj", "q_proj", "v_proj"]);
    const modelConfig = JSON.parse(readFileSync(path.join(MODEL, "config.json"), "utf8"));
    const tensors = await readSafetensors(
      path.join(adapterOf(straight, 3), "adapter_model.safetensors"),
    );
    const names = [...tensors.keys()].sort();
    const expected: string[] = [];
    for (let l = 0; l < modelConfig.num_hidden_layers; l++) {
      for (const m of ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"]) {
        for (const ab of ["lora_A", "lora_B"])
          expected.push(`base_model.model.model.layers.${l}.${m}.${ab}.weight`);
      }
    }
    expect(names).toEqual(expected.sort());
    const q0 = "base_model.model.model.layers.0.self_attn.q_proj";
    expect(tensors.get(`${q0}.lora_A.weight`)?.shape).toEqual([4, modelConfig.hidden_size]);
    expect(tensors.get(`${q0}.lora_B.weight`)?.shape).toEqual([modelConfig.hidden_size, 4]);
    // The adapters trained: B left its zeros.
    const b = tensors.get(`${q0}.lora_B.weight`)?.data as Float32Array;
    expect(b.some((x) => x !== 0)).toBe(true);

    // The reference is the policy with its adapters off: a fresh adapter (B = 0) is the base,
    const m = metrics(straight);
    expect(m.map((x) => x.step)).toEqual([1, 2, 3]);
    // so step 1's KL is 0 but for the rounding of two passes over the same weights (1.6e-12
    // measured); once the adapters moved it is not (2.6e-4 and 1.9e-3 measured).
    expect(Math.abs(m[0]?.["actor/kl_loss"] as number)).toBeLessThan(1e-9);
    expect(m[1]?.["actor/kl_loss"]).toBeGreaterThan(1e-5);
    expect(m[2]?.["actor/kl_loss"]).toBeGreaterThan(1e-5);
    // The engine samples, with the adapter unmerged, from the policy the trainer scores.
    for (const row of m) expect(Math.abs(row["rollout_corr/kl"] as number)).toBeLessThan(1e-4);
    // Each push is the adapter alone: its two files (the F32 A and B of 3 modules x layers,
    // and adapter_config.json), not a model of many times its size.
    const modelBytes = statSync(path.join(MODEL, "model.safetensors")).size;
    const adapterBytes = ["adapter_model.safetensors", "adapter_config.json"]
      .map((f) => statSync(path.join(adapterOf(straight, 3), f)).size)
      .reduce((a, b) => a + b, 0);
    for (const row of m) expect(row["update_weights/bytes"]).toBe(adapterBytes);
    expect(adapterBytes * 10).toBeLessThan(modelBytes);

    // Two steps, then a resumed run to three: the same rows and the same adapter bit for bit,
    // with the frozen base waiting in host memory between phases (actor.param_offload).
    expectResumedEqualsStraight(
      straight,
      "resumed",
      [...LORA, "actor.param_offload=true"],
      ["adapter/adapter_model.safetensors"],
    );

    // model.lora_adapter_path starts a new run from that adapter: its KL is no longer 0.
    const from = path.join(run.dir, "from-adapter");
    const started = runCli(
      run.args(from, [
        `model.lora_adapter_path=${adapterOf(straight, 3)}`,
        "actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
      ]),
    );
    expect(started.code, started.stderr).toBe(0);
    expect(started.stderr).toMatch(/LoRA: rank 4, scaling 2 on q_proj, v_proj, down_proj/);
    expect(metrics(from)[0]?.["actor/kl_loss"]).toBeGreaterThan(0);
    expect(existsSync(path.join(adapterOf(from, 1), "adapter_config.json"))).toBe(true);
  }, 600_000);

  // PPO with LoRA on the actor and a fully fine-tuned critic: what verl runs with
  // actor_rollout_ref.model.lora_rank > 0 and critic.model.lora_rank 0. The checkpoints hold
  // the actor's adapter and the whole critic; a resumed run equals the straight one.
  it("PPO: the actor's adapters and a fully trained critic, checkpointed and resumed", async () => {
    // KL in the reward gives the critic something to learn: the random model earns no reward,
    // and once the adapters have moved the policy the token rewards are -kl_coef·KL.
    const ppo = [
      ...LORA,
      "algorithm.name=ppo",
      "algorithm.use_kl_in_reward=true",
      "algorithm.kl_coef=0.5",
      "critic.lr=1e-3",
    ];
    const straight = path.join(run.dir, "ppo-straight");
    const r = runCli(run.args(straight, [...ppo, "trainer.total_training_steps=3"]));
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/LoRA: rank 4, scaling 2 on q_proj, v_proj, down_proj/);
    const m = metrics(straight);
    expect(m.map((x) => x.step)).toEqual([1, 2, 3]);
    for (const row of m) {
      expect(typeof row["critic/vf_loss"], "critic/vf_loss").toBe("number");
      expect(Math.abs(row["rollout_corr/kl"] as number)).toBeLessThan(1e-4);
    }
    // The critic trained: its values moved from the value head's zeros.
    expect(m.some((row) => (row["critic/vpred_mean"] as number) !== 0)).toBe(true);
    const ckpt = path.join(runDir(straight), "global_step_3");
    expect(readdirSync(ckpt).sort()).toEqual(
      [
        "actor.optimizer.safetensors",
        "actor.rng.txt",
        "adapter",
        "controller.json",
        "critic",
        "critic.optimizer.safetensors",
        "critic.rng.txt",
      ].sort(),
    );
    expectResumedEqualsStraight(straight, "ppo-resumed", ppo, [
      "adapter/adapter_model.safetensors",
      "critic/model.safetensors",
    ]);
  }, 600_000);

  // The critic with adapters too (critic.lora_rank, verl's critic.model.lora_rank > 0: PEFT's TOKEN_CLS task,
  // the value head trained in full beside them): its checkpoints hold a PEFT folder
  // critic_adapter in place of the whole critic, and a resumed run equals the straight one.
  it("PPO: adapters on the critic too, its value head trained beside them", async () => {
    const ppo = [
      ...LORA,
      "algorithm.name=ppo",
      "algorithm.use_kl_in_reward=true",
      "algorithm.kl_coef=0.5",
      "critic.lr=1e-2",
      "critic.lora_rank=4",
      "critic.target_modules=[q_proj,v_proj]",
    ];
    const straight = path.join(run.dir, "critic-lora-straight");
    const r = runCli(run.args(straight, [...ppo, "trainer.total_training_steps=3"]));
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(
      /the critic's LoRA: rank 4, scaling 4 on q_proj, v_proj and the value head: \d+ trainable/,
    );
    const m = metrics(straight);
    expect(m.map((x) => x.step)).toEqual([1, 2, 3]);
    // The value head trained: the values moved from its zeros.
    expect(m.some((row) => (row["critic/vpred_mean"] as number) !== 0)).toBe(true);
    const ckpt = path.join(runDir(straight), "global_step_3");
    expect(readdirSync(ckpt)).toContain("critic_adapter");
    expect(readdirSync(ckpt)).not.toContain("critic");
    const config = JSON.parse(
      readFileSync(path.join(ckpt, "critic_adapter", "adapter_config.json"), "utf8"),
    );
    expect(config).toMatchObject({
      task_type: "TOKEN_CLS",
      modules_to_save: ["classifier", "score"],
      r: 4,
      target_modules: ["q_proj", "v_proj"],
    });
    const tensors = await readSafetensors(
      path.join(ckpt, "critic_adapter", "adapter_model.safetensors"),
    );
    expect(tensors.has("base_model.model.score.weight")).toBe(true);
    expectResumedEqualsStraight(straight, "critic-lora-resumed", ppo, [
      "adapter/adapter_model.safetensors",
      "critic_adapter/adapter_model.safetensors",
      "critic.optimizer.safetensors",
    ]);
  }, 600_000);

  // Data-parallel LoRA: two CPU trainer ranks sum their adapter gradients over Gloo (ZeRO
  // stage 2: each rank's shard of the summed gradient and of AdamW's moments), and two engine
  // replicas each load the step's adapter; the run is the straight one's above (the trainer's
  // figures within float rounding of the summed gradients, the rest equal).
  it("--gpus 2, ZeRO stage 2: two trainer ranks and two engine replicas, each serving the adapter, give the run of one", async () => {
    const straight = path.join(run.dir, "straight");
    const two = path.join(run.dir, "two-ranks");
    const r = runCli(
      run.args(two, [
        ...LORA,
        "trainer.total_training_steps=3",
        "trainer.zero_stage=2",
        "--gpus",
        "2",
      ]),
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/^engine replica 1 serving at /m);
    const [a, b] = [metrics(straight), metrics(two)];
    expect(b.map((x) => x.step)).toEqual([1, 2, 3]);
    const trainerKey = (k: string) => k.startsWith("actor/");
    for (const [i, row] of a.entries()) {
      const [x, y] = [deterministic(row), deterministic(b[i] ?? {})];
      expect(Object.keys(y).sort()).toEqual(Object.keys(x).sort());
      for (const key of Object.keys(x)) {
        const [u, v] = [x[key] as number, y[key] as number];
        if (!trainerKey(key)) expect(v, `step ${row.step} ${key}`).toBe(u);
        else
          expect(Math.abs(u - v), `step ${row.step} ${key}`).toBeLessThanOrEqual(
            1e-4 * Math.max(Math.abs(u), 1),
          );
      }
    }
    const adapter = async (out: string) =>
      readSafetensors(path.join(adapterOf(out, 3), "adapter_model.safetensors"));
    const [one, both] = [await adapter(straight), await adapter(two)];
    for (const [name, t] of one) {
      const other = both.get(name)?.data as Float32Array;
      const values = t.data as Float32Array;
      const worst = values.reduce((m, x, j) => Math.max(m, Math.abs(x - (other[j] as number))), 0);
      expect(worst, name).toBeLessThan(1e-5);
    }
  }, 600_000);

  it.each([
    [["actor.grad_offload=true"], /actor\.grad_offload=true with LoRA/],
    [["actor.optimizer_offload=true"], /actor\.optimizer_offload=true with LoRA/],
    [
      ["ref.param_offload=true"],
      /ref\.param_offload=true with LoRA \(model\.lora_rank=4\): the reference is the policy/,
    ],
    [
      ["model.exclude_modules=.*q_proj"],
      /model\.exclude_modules: '\.\*q_proj' is not one of .*PEFT's regex/,
    ],
    [["model.exclude_modules=[layers.0.q_proj]"], /'layers\.0\.q_proj' is not one of q_proj/],
    [
      ["model.target_modules=[q_proj]", "model.exclude_modules=[q_proj]"],
      /leaves no module of model\.target_modules/,
    ],
    [["model.target_modules=[lm_head]"], /model\.target_modules/],
    // verl's names reach the same keys.
    [
      [
        "actor_rollout_ref.model.exclude_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
      ],
      /model\.exclude_modules=\[q_proj,.*down_proj\] leaves no module/,
    ],
    [["critic.lora_rank=8"], /critic\.lora_rank=8 has no effect with algorithm\.name=grpo/],
    [
      ["critic.lora_alpha=32"],
      /critic\.lora_alpha=32 has no effect without adapters on the critic/,
    ],
    [
      ["algorithm.name=ppo", "critic.lora_rank=4", "critic.optimizer_offload=true"],
      /critic\.optimizer_offload=true with critic\.lora_rank=4/,
    ],
    [
      ["model.lora_rank=0", "model.lora_alpha=32"],
      /model\.lora_alpha=32 has no effect without LoRA/,
    ],
  ])("refuses %j naming the key", (extra, message) => {
    const out = path.join(run.dir, "refused");
    const r = runCli(run.args(out, ["model.lora_rank=4", ...extra]));
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toMatch(message);
    expect(existsSync(out)).toBe(false); // refused before anything is written
  });
});
