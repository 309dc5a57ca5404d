// LoRA in the native trainer (native/src/model/lora.h), on the CPU backend, against the
// fixtures of make_lora_fixtures.py (PEFT's LoRA forward in plain PyTorch on the untied
// model, float64): with an adapter, `score`'s log-probs, `grad`'s loss and adapter gradients,
// and `export`'s merged weights (W + scaling·B A) within fp32 rounding; the reference (the
// policy with its adapters off) is the base model bit for bit; checkpoints are PEFT folders
// that load back; two Gloo ranks update the adapters as one rank does, within rounding.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { modelBytes, NO_OFFLOAD } from "../../src/planning/native-sizes.js";
import {
  CPU,
  caseFile,
  FIXTURES,
  get,
  maxAbs,
  maxAbsDiff,
  modelDir,
  readFloats,
  relDiff,
  rolloutBatch,
  sameBits,
  tempDir,
  trainer,
  trainerOk,
  writeBatchFile,
} from "./helpers.js";
import { Ranks } from "./trainer-ranks.js";

const POLICY = modelDir("untied");
const LORA = join(FIXTURES, "lora");
const CASES = join(LORA, "case.safetensors");
const TAGS = ["adapter", "rslora"] as const;

/** The memory plan's LoRA sizes of the fixture model (searchr1-trainer plan --lora-rank). */
const plannedLora = (
  lora: { rank: number; targets: "all-linear" | string[] } = { rank: 4, targets: "all-linear" },
  options: { ranks?: number; offload?: typeof NO_OFFLOAD; tokens?: number[] } = {},
) =>
  modelBytes({
    dir: POLICY,
    head: "lm",
    device: "cpu",
    ranks: options.ranks ?? 1,
    offload: options.offload ?? NO_OFFLOAD,
    tokens: options.tokens ?? [],
    lora,
  }).lora;

/** log_probs of `model` on the fixture batch from serve ranks. */
async function logProbs(ranks: Ranks, model: string): Promise<Float32Array> {
  const out = join(tempDir(), "lp.safetensors");
  await ranks.ok("log_probs", { batch: caseFile("untied"), out, model });
  return get(await readFloats(out), "log_probs");
}

async function run(
  op: "score" | "grad",
  lora?: string,
  flags: string[] = [],
): Promise<Map<string, Float32Array>> {
  const out = join(tempDir(), `${op}.safetensors`);
  trainerOk([
    ...[op, "--model", POLICY, "--batch", caseFile("untied"), "--out", out],
    ...(op === "grad" ? ["--loss", "weights"] : []),
    ...(lora ? ["--lora", lora] : []),
    ...flags,
    ...[...CPU, "--threads", "2"],
  ]);
  return readFloats(out);
}

// Measured on the CPU backend (two threads): log-probs within 1.9e-6 (4 ulp at their size),
// entropies 4.8e-7, the loss 1e-7 relative, every adapter gradient within 1.8e-6 of its
// tensor's largest value; the merged weights equal the reference's bits.
describe("LoRA matches PEFT's forward and backward (make_lora_fixtures.py)", () => {
  for (const tag of TAGS) {
    it(`${tag}: score's log-probs and entropies`, async () => {
      const [ref, got] = [await readFloats(CASES), await run("score", join(LORA, tag))];
      expect(maxAbsDiff(get(got, "logprobs"), get(ref, `${tag}.logprobs`))).toBeLessThan(5e-6);
      expect(maxAbsDiff(get(got, "entropy"), get(ref, `${tag}.entropy`))).toBeLessThan(5e-6);
      // The adapter changes the outputs (the fixture is not the base model's).
      const base = await run("score");
      expect(maxAbsDiff(get(base, "logprobs"), get(ref, `${tag}.logprobs`))).toBeGreaterThan(1e-2);
    });

    it(`${tag}: grad's loss and every adapter tensor's gradient`, async () => {
      const [ref, got] = [await readFloats(CASES), await run("grad", join(LORA, tag))];
      expect(relDiff(get(got, "loss"), get(ref, `${tag}.loss`))).toBeLessThan(1e-5);
      const names = [...ref.keys()].filter((n) => n.startsWith(`${tag}.grad.`));
      expect(names.length).toBeGreaterThan(0);
      const gradNames = [...got.keys()].filter((n) => n.startsWith("grad."));
      // The adapters' gradients alone, by PEFT's names: no base weight has one.
      expect(gradNames.sort()).toEqual(names.map((n) => n.slice(tag.length + 1)).sort());
      for (const name of names) {
        const want = get(ref, name);
        expect(maxAbs(want), name).toBeGreaterThan(0);
        expect(relDiff(get(got, name.slice(tag.length + 1)), want), name).toBeLessThan(1e-5);
      }
    });
  }

  it("gradient checkpointing (--recompute) and small head chunks give the same gradients", async () => {
    const lora = join(LORA, "adapter");
    const [plain, recomputed] = [
      await run("grad", lora),
      await run("grad", lora, ["--recompute", "--logits-chunk", "7"]),
    ];
    const names = [...plain.keys()].filter((n) => n.startsWith("grad."));
    expect(names.length).toBe(28);
    for (const name of names) {
      expect(relDiff(get(recomputed, name), get(plain, name)), name).toBeLessThan(1e-5);
    }
  });
});

describe("serve with a LoRA adapter", () => {
  it("reference = the base bit for bit; policy = PEFT's; export merges as PEFT", async () => {
    const ref = await readFloats(CASES);
    const ranks = new Ranks(1, 60, [...CPU]);
    try {
      await ranks.ok("load", { policy: POLICY });
      const base = await logProbs(ranks, "policy");
      const loaded = await ranks.ok("load", {
        policy: POLICY,
        lora: { path: join(LORA, "adapter") },
      });
      expect(loaded.lora).toMatchObject({ rank: 4, alpha: 8, scaling: 2, use_rslora: false });
      // The memory plan's LoRA learner (searchr1-trainer plan --lora-rank) is what it holds.
      const planned = plannedLora(undefined, { tokens: [40] });
      const l = planned?.learner[0];
      expect((loaded.memory as { actor: unknown }).actor).toEqual({
        weights: l?.weights,
        master_weights: l?.masters,
        optimizer_state: l?.optimizer,
        gradients: l?.gradients,
        gradients_between_updates: l?.gradientsBetween,
        host_weights: 0,
        host_master_weights: 0,
        host_optimizer_state: 0,
        host_gradients: 0,
      });
      expect(l?.optimizer).toBe(2 * 4 * (planned?.floats ?? 0));
      expect(sameBits(await logProbs(ranks, "reference"), base)).toBe(true);
      const policy = await logProbs(ranks, "policy");
      expect(maxAbsDiff(policy, get(ref, "adapter.logprobs"))).toBeLessThan(5e-6);
      expect(sameBits(await logProbs(ranks, "reference"), base)).toBe(true); // switched back on
      expect(sameBits(await logProbs(ranks, "policy"), policy)).toBe(true);

      const out = join(tempDir(), "merged");
      await ranks.ok("export", { out, dtype: "fp32" });
      const merged = await readFloats(join(out, "model.safetensors"));
      const original = await readFloats(join(POLICY, "model.safetensors"));
      let targeted = 0;
      for (const [name, values] of merged) {
        const want = ref.get(`adapter.merged.${name}`);
        if (want === undefined) {
          expect(sameBits(values, get(original, name)), name).toBe(true);
          continue;
        }
        targeted++;
        expect(relDiff(values, want), name).toBeLessThan(1e-6);
      }
      expect(targeted).toBe(14); // 7 modules x 2 layers
    } finally {
      await ranks.close();
    }
  });

  it("a fresh adapter (PEFT's init: B zero) leaves the policy the base; checkpoints are PEFT folders", async () => {
    const ranks = new Ranks(1, 60, [...CPU]);
    try {
      const loaded = await ranks.ok("load", {
        policy: POLICY,
        lora: { rank: 2, alpha: 4, target_modules: ["q_proj", "down_proj"], seed: 7 },
      });
      // Two of the seven modules at rank 2: the plan's learner is still what it holds.
      const planned = plannedLora({ rank: 2, targets: ["q_proj", "down_proj"] });
      // Hidden 64, intermediate 128: q_proj's A [2, 64] and B [64, 2], down_proj's A [2, 128]
      // and B [64, 2], each from a multiple of 128 floats: 640 a layer, 2 layers.
      expect(planned?.floats).toBe(1280);
      const actor = (loaded.memory as { actor: Record<string, number> }).actor;
      expect(actor).toMatchObject({
        weights: planned?.learner[0].weights,
        master_weights: planned?.learner[0].masters,
        optimizer_state: planned?.learner[0].optimizer,
        gradients: planned?.learner[0].gradients,
      });
      // scaling·B(A x) is exactly zero: the policy is its reference, bit for bit.
      expect(sameBits(await logProbs(ranks, "policy"), await logProbs(ranks, "reference"))).toBe(
        true,
      );

      const dir = join(tempDir(), "ckpt");
      await ranks.ok("save_checkpoint", { dir });
      const config = JSON.parse(readFileSync(join(dir, "adapter", "adapter_config.json"), "utf8"));
      expect(config).toMatchObject({
        peft_type: "LORA",
        task_type: "CAUSAL_LM",
        r: 2,
        lora_alpha: 4,
        use_rslora: false,
        target_modules: ["q_proj", "down_proj"],
        base_model_name_or_path: POLICY,
      });
      const tensors = await readFloats(join(dir, "adapter", "adapter_model.safetensors"));
      expect([...tensors.keys()].sort()).toEqual(
        [0, 1]
          .flatMap((l) =>
            ["self_attn.q_proj", "mlp.down_proj"].flatMap((m) =>
              ["A", "B"].map((x) => `base_model.model.model.layers.${l}.${m}.lora_${x}.weight`),
            ),
          )
          .sort(),
      );
      const a = get(tensors, "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
      expect(a.length).toBe(2 * 128);
      expect(maxAbs(a)).toBeGreaterThan(0);
      expect(maxAbs(a)).toBeLessThanOrEqual(1 / Math.sqrt(128)); // kaiming_uniform_(a=sqrt(5))
      expect(
        maxAbs(get(tensors, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight")),
      ).toBe(0);
    } finally {
      await ranks.close();
    }
  });

  it("refuses what does not go with LoRA, naming the field", async () => {
    const ranks = new Ranks(1, 60, [...CPU]);
    try {
      const fails = (fields: Record<string, unknown>) =>
        ranks.procs[0]?.fails("load", { policy: POLICY, ...fields });
      expect(await fails({ lora: { rank: 2 }, reference: POLICY })).toMatch(
        /'reference' does not go with 'lora'/,
      );
      expect(await fails({ lora: { path: join(LORA, "adapter"), rank: 8 } })).toMatch(
        /'lora.rank' is 8, but .*adapter_config.json has 4/,
      );
      expect(await fails({ lora: { rank: 2, target_modules: ["qkv"] } })).toMatch(
        /'qkv' is not one of/,
      );
      expect(await fails({ lora: { rank: 2, bogus: 1 } })).toMatch(/bogus/);
      for (const part of ["grad", "optimizer"]) {
        expect(await fails({ lora: { rank: 2 }, actor_offload: { [part]: true } })).toMatch(
          /'actor_offload' with 'lora': only 'param'/,
        );
      }
      await ranks.ok("load", { policy: POLICY, lora: { rank: 2 } }); // still serving
    } finally {
      await ranks.close();
    }
  });
});

// Two ranks sum their adapter gradients over Gloo: after three optimizer steps the replies
// and the saved adapters are one rank's within float rounding (measured: metrics within
// 4.3e-7 relative (grad_norm), adapter values within 6.7e-8, each moved about 3e-3 by the
// steps).
describe("LoRA updates: two Gloo ranks equal one rank", () => {
  const T = 16;
  const lengths = [16, 11, 14, 7, 16, 9];
  const { ids, attention, response, tensor } = rolloutBatch({
    T,
    lengths,
    prompts: [4, 3, 5, 3, 4, 3],
    seed: 23,
    holeLength: 2,
  });
  const advantages = Float32Array.from(
    { length: lengths.length * T },
    (_, i) => Math.sin(i * 0.7) * 0.8,
  );

  async function trainOn(size: number, offload = NO_OFFLOAD, stage = 0) {
    const ranks = new Ranks(size, 60, [...CPU]);
    try {
      const loaded = await ranks.ok("load", {
        policy: POLICY,
        lora: { path: join(LORA, "adapter") },
        actor_optim: { lr: 1e-3, weight_decay: 0.01 },
        seed: 5,
        actor_offload: offload,
        zero_stage: stage,
      });
      const inputs = await writeBatchFile([
        tensor("input_ids", ids),
        tensor("attention_mask", attention),
      ]);
      const lpOut = join(tempDir(), "lp.safetensors");
      await ranks.ok("log_probs", { batch: inputs, out: lpOut, model: "reference" });
      const refLp = get(await readFloats(lpOut), "log_probs");
      await ranks.ok("log_probs", { batch: inputs, out: lpOut });
      const old = get(await readFloats(lpOut), "log_probs");
      const batch = await writeBatchFile([
        tensor("input_ids", ids),
        tensor("attention_mask", attention),
        tensor("response_mask", response),
        tensor(
          "old_log_probs",
          old.map((x, i) => x + 0.3 * Math.cos(i)),
        ),
        tensor("ref_log_probs", refLp),
        tensor("advantages", advantages),
      ]);
      const reply = await ranks.ok("update_actor", {
        batch,
        ppo_mini_batch_size: 2,
        kl_loss_coef: 0.01,
        ppo_max_token_len_per_gpu: 20,
      });
      const dir = join(tempDir(), "ckpt");
      await ranks.ok("save_checkpoint", { dir });
      return {
        reply,
        memory: (loaded.memory as { actor: Record<string, number> }).actor,
        adapter: await readFloats(join(dir, "adapter", "adapter_model.safetensors")),
        moments: await readFloats(join(dir, "actor.optimizer.safetensors")),
        checkpoint: dir,
      };
    } finally {
      await ranks.close();
    }
  }

  it("the update's metrics and the trained adapter", async () => {
    const one = await trainOn(1);
    const two = await trainOn(2);
    expect(one.reply.optimizer_steps).toBe(3);
    for (const key of ["pg_loss", "ppo_kl", "kl_loss", "entropy", "grad_norm"]) {
      const [a, b] = [one.reply[key] as number, two.reply[key] as number];
      expect(Math.abs(a - b), key).toBeLessThanOrEqual(1e-5 * Math.max(1, Math.abs(a)));
    }
    const start = await readFloats(join(LORA, "adapter", "adapter_model.safetensors"));
    expect(one.adapter.size).toBe(28); // A and B of 7 modules x 2 layers
    for (const [name, values] of one.adapter) {
      expect(maxAbsDiff(values, get(two.adapter, name)), name).toBeLessThan(1e-6);
      expect(maxAbsDiff(values, get(start, name)), `${name} was trained`).toBeGreaterThan(1e-5);
    }
  });

  // ZeRO over the adapters (learner.h): stage 1 shards AdamW's moments, stage 2 the summed
  // gradient too; two ranks give stage 0's update (the same sums: within float rounding),
  // each rank holds the planned shard, and a checkpoint's moments gather to stage 0's.
  it.each([1, 2])(
    "ZeRO stage %i on two ranks: stage 0's update, a shard of the state each, whole checkpoints",
    async (stage) => {
      const whole = await trainOn(2);
      const sharded = await trainOn(2, NO_OFFLOAD, stage);
      for (const key of ["pg_loss", "ppo_kl", "kl_loss", "entropy", "grad_norm"]) {
        const [a, b] = [whole.reply[key] as number, sharded.reply[key] as number];
        expect(Math.abs(a - b), key).toBeLessThanOrEqual(1e-6 * Math.max(1, Math.abs(a)));
      }
      for (const [name, values] of whole.adapter) {
        expect(maxAbsDiff(values, get(sharded.adapter, name)), name).toBeLessThan(1e-6);
      }
      for (const [name, values] of whole.moments) {
        const other = get(sharded.moments, name);
        expect(other.length, name).toBe(values.length);
        expect(maxAbsDiff(values, other), name).toBeLessThanOrEqual(
          1e-6 * Math.max(1e-12, ...values.map(Math.abs)),
        );
      }
      const planned = plannedLora(undefined, { ranks: 2 })?.learner[stage];
      expect(sharded.memory).toMatchObject({
        weights: planned?.weights,
        master_weights: planned?.masters,
        optimizer_state: planned?.optimizer,
        gradients: planned?.gradients,
        gradients_between_updates: planned?.gradientsBetween,
      });
      // A checkpoint read back by sharded ranks (each its range of the moments) and saved again
      // is the same files.
      const ranks = new Ranks(2, 60, [...CPU]);
      try {
        await ranks.ok("load", {
          policy: POLICY,
          lora: { path: join(LORA, "adapter") },
          actor_optim: { lr: 1e-3, weight_decay: 0.01 },
          seed: 5,
          zero_stage: stage,
        });
        await ranks.ok("load_checkpoint", { dir: sharded.checkpoint });
        const again = join(tempDir(), "again");
        await ranks.ok("save_checkpoint", { dir: again });
        for (const file of ["actor.optimizer.safetensors", "adapter/adapter_model.safetensors"]) {
          const bytes = (d: string) => readFileSync(join(d, file));
          expect(bytes(again).equals(bytes(sharded.checkpoint)), file).toBe(true);
        }
      } finally {
        await ranks.close();
      }
      // Half the moments of stage 0's (each rank's shard of the padded buffer).
      expect(sharded.memory.optimizer_state).toBeLessThan(0.51 * whole.memory.optimizer_state);
      expect(sharded.memory.gradients_between_updates).toBe(
        stage === 2 ? 0 : sharded.memory.gradients,
      );
    },
  );

  // actor_offload.param: the frozen base's compute copy waits in host memory between
  // commands (copied out once) and comes back for each; the adapters' state stays.
  it("param offload: the frozen base in host memory between commands, the same update bit for bit", async () => {
    const kept = await trainOn(1);
    const offloaded = await trainOn(1, { ...NO_OFFLOAD, param: true });
    const planned = plannedLora(undefined, { offload: { ...NO_OFFLOAD, param: true } })?.learner[0];
    expect(kept.memory.host_weights).toBe(0);
    expect(offloaded.memory).toMatchObject({
      weights: 0,
      host_weights: kept.memory.weights,
      optimizer_state: kept.memory.optimizer_state,
    });
    expect(planned?.hostWeights).toBe(kept.memory.weights);
    expect(offloaded.reply).toEqual(kept.reply);
    for (const [name, values] of kept.adapter) {
      expect(sameBits(get(offloaded.adapter, name), values), name).toBe(true);
    }
  });
});

describe("sft --lora-rank: fresh adapters trained on the frozen model", () => {
  const B = 2;
  const T = 24;
  const batch = () =>
    writeBatchFile([
      {
        name: "input_ids",
        dtype: "I64",
        shape: [B, T],
        data: new BigInt64Array(B * T).map((_, i) => BigInt(3 + ((i * 11) % 500))),
      },
    ]);
  const LORA_FLAGS = [
    "--lora-rank",
    "4",
    "--lora-alpha",
    "8",
    "--lora-targets",
    "q_proj,v_proj,down_proj",
  ];
  const sft = (data: string, steps: number, flags: string[]) => {
    const dir = tempDir();
    const [out, metrics] = [join(dir, "out"), join(dir, "metrics.jsonl")];
    trainerOk([
      ...["sft", "--model", POLICY, "--data", data, "--out", out, "--steps", String(steps)],
      ...["--lr", "1e-2", "--metrics", metrics, ...flags, ...CPU, "--threads", "2"],
    ]);
    const lines = readFileSync(metrics, "utf8").trim().split("\n");
    return { out, steps: lines.map((l) => JSON.parse(l) as { loss: number; grad_norm: number }) };
  };

  it("step 1 is the base's loss; --out is the PEFT folder of the adapter it trained", async () => {
    const data = await batch();
    const full = sft(data, 1, []);
    const one = sft(data, 1, LORA_FLAGS);
    const two = sft(data, 2, LORA_FLAGS);
    // B starts at zero: the first forward is the base model's, bit for bit; the same seed
    // draws the same A, so the runs agree step for step.
    expect(one.steps[0]?.loss).toBe(full.steps[0]?.loss);
    expect([two.steps[0]?.loss, two.steps[0]?.grad_norm]).toEqual([
      one.steps[0]?.loss,
      one.steps[0]?.grad_norm,
    ]);
    expect(two.steps[1]?.loss).toBeLessThan(two.steps[0]?.loss ?? 0);
    expect(JSON.parse(readFileSync(join(one.out, "adapter_config.json"), "utf8"))).toMatchObject({
      peft_type: "LORA",
      r: 4,
      lora_alpha: 8,
      target_modules: ["q_proj", "v_proj", "down_proj"],
      base_model_name_or_path: POLICY,
    });
    // The folder written after step 1 is the adapter step 2 ran on: score with it gives
    // step 2's loss (the token mean of -log p over the predicted tokens).
    const scored = join(tempDir(), "score.safetensors");
    trainerOk([
      ...["score", "--model", POLICY, "--batch", data, "--out", scored, "--lora", one.out],
      ...[...CPU, "--threads", "2"],
    ]);
    const lp = get(await readFloats(scored), "logprobs");
    const loss = -lp.reduce((s, v) => s + v, 0) / (B * (T - 1));
    expect(Math.abs(loss - (two.steps[1]?.loss ?? 0))).toBeLessThan(1e-6 * loss);
  });

  it("refuses, naming the option, what does not go with it", async () => {
    const data = await batch();
    const bad = [
      [["--lora-rank", "4", "--save-dtype", "bf16"], /--save-dtype does not go with --lora-rank/],
      [["--lora-rank", "4", "--max-shard-size", "1GB"], /--max-shard-size does not go with/],
      [["--lora-rank", "4", "--lora-targets", "q_proj,x_proj"], /--lora-targets: .*'x_proj'/],
      [["--lora-rank", "0"], /--lora-rank/],
      [["--lora-seed", "3"], /--lora-seed needs --lora-rank/],
      [["--lora-alpha", "8"], /--lora-alpha needs --lora-rank/],
    ] as const;
    for (const [flags, message] of bad) {
      const out = join(tempDir(), "out");
      const r = trainer([
        ...["sft", "--model", POLICY, "--data", data, "--out", out, ...flags, ...CPU],
      ]);
      expect(r.code, flags.join(" ")).toBe(2);
      expect(r.stderr).toMatch(message);
      expect(existsSync(out)).toBe(false);
    }
  });
});
