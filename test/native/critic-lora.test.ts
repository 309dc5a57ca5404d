// A critic trained through LoRA adapters (`critic_lora` of `serve`'s load; native/src/
// train/SERVE.md), as verl's critic.model.lora_rank > 0 builds it with PEFT's TOKEN_CLS task:
// adapters on the frozen transformer and the value head trained in full beside them
// (modules_to_save score), against test/native/make_critic_lora_fixtures.py (float64 PyTorch):
//  - `values` with the fixture's adapter equal the reference;
//  - one `update_critic` step (token-mean, tokens clipping on both sides): vf_loss and the
//    gradient of every adapter tensor and of the value head, recovered from the step
//    (critic-helpers.ts) and read from save_checkpoint's dir/critic_adapter, a PEFT TOKEN_CLS
//    folder;
//  - a fresh adapter (B zero, the head copied from the critic) gives the critic's values bit
//    for bit; a resumed run's update equals the straight run's bit for bit;
//  - what does not go with it is refused, naming the field.
// Tolerances as critic.test.ts's (the same arithmetic): values 1e-5 absolute; vf_loss 1e-5
// relative plus 1e-7; gradient entries 1e-4 relative plus 1e-5 of the tensor's largest |entry|.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { modelBytes, NO_OFFLOAD } from "../../src/planning/native-sizes.js";
import { readSafetensorsHeader } from "../../src/tensors/safetensors.js";
import { excess, OPTIM, serve, serveReplies, stepGradient } from "./critic-helpers.js";
import {
  CPU,
  FIXTURES,
  get,
  maxAbs,
  maxAbsDiff,
  modelDir,
  readFloats,
  sameBits,
  tempDir,
} from "./helpers.js";
import { Ranks } from "./trainer-ranks.js";

const POLICY = modelDir("untied");
const CRITIC = join(FIXTURES, "critic-untied");
const HERE = join(FIXTURES, "critic-lora");
const ADAPTER = join(HERE, "adapter");
const BATCH = join(HERE, "batch.safetensors");
const CASE = join(HERE, "case.safetensors");
const WEIGHTS = "adapter_model.safetensors";

const ref = await readFloats(CASE);
const meta = (await readSafetensorsHeader(CASE)).metadata;
const updateFields = {
  batch: BATCH,
  cliprange_value: Number(meta.cliprange_value),
  loss_agg_mode: meta.mode,
  ppo_mini_batch_size: 0,
  ppo_epochs: 1,
  shuffle: false,
};
const update = { op: "update_critic", ...updateFields };
const loadFields = (critic_lora: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
  policy: POLICY,
  critic: CRITIC,
  critic_optim: OPTIM,
  critic_lora,
  ...extra,
});
const load = (critic_lora: Record<string, unknown>, extra: Record<string, unknown> = {}) => ({
  op: "load",
  ...loadFields(critic_lora, extra),
});

async function valuesOf(commands: Record<string, unknown>[]): Promise<Float32Array> {
  const out = join(tempDir(), "values.safetensors");
  serve([...commands, { op: "values", batch: BATCH, out }]);
  return get(await readFloats(out), "values");
}

describe("a critic's LoRA adapters against PEFT's TOKEN_CLS model in PyTorch", () => {
  it("values with the adapter and its value head", async () => {
    const got = await valuesOf([load({ path: ADAPTER })]);
    const want = get(ref, "values");
    expect(excess(got, want, 0, 1e-5)).toBeLessThanOrEqual(1);
    expect(maxAbs(want)).toBeGreaterThan(0.3);
    // Not the critic's own values: the adapter and the moved head change them.
    const plain = await valuesOf([{ op: "load", policy: POLICY, critic: CRITIC }]);
    expect(excess(plain, want, 0, 1e-3)).toBeGreaterThan(1);
  });

  it("one update_critic step: vf_loss and every adapter and head gradient", async () => {
    const dir = join(tempDir(), "ckpt");
    const [loaded, step] = serve([
      load({ path: ADAPTER }),
      update,
      { op: "save_checkpoint", dir },
    ]) as [Record<string, unknown>, Record<string, unknown>];
    // The memory plan's critic with adapters (searchr1-trainer plan --head value) is what it holds.
    const planned = modelBytes({
      dir: CRITIC,
      head: "value",
      device: "cpu",
      ranks: 1,
      offload: NO_OFFLOAD,
      tokens: [],
      lora: { rank: 4, targets: "all-linear" },
    }).lora?.learner[0];
    expect((loaded.memory as { critic: unknown }).critic).toEqual({
      weights: planned?.weights,
      master_weights: planned?.masters,
      optimizer_state: planned?.optimizer,
      gradients: planned?.gradients,
      gradients_between_updates: planned?.gradientsBetween,
      host_weights: 0,
      host_master_weights: 0,
      host_optimizer_state: 0,
      host_gradients: 0,
    });
    expect(loaded.critic_lora).toMatchObject({
      rank: 4,
      alpha: 8,
      value_head: true,
      // q, o: 64 -> 64; k, v: 64 -> 32; gate, up, down: 64 <-> 128; two layers; the head H + 1
      trainable_parameters: 2 * (2 * 4 * (64 + 64) + 2 * 4 * (64 + 32) + 3 * 4 * (64 + 128)) + 65,
    });
    expect(Math.abs((step.vf_loss as number) - (get(ref, "vf_loss")[0] as number))).toBeLessThan(
      1e-5 * (get(ref, "vf_loss")[0] as number) + 1e-7,
    );
    const saved = join(dir, "critic_adapter");
    const config = JSON.parse(readFileSync(join(saved, "adapter_config.json"), "utf8"));
    expect(config).toMatchObject({
      peft_type: "LORA",
      task_type: "TOKEN_CLS",
      modules_to_save: ["classifier", "score"],
      base_model_name_or_path: CRITIC,
      r: 4,
    });
    const [before, after] = [
      await readFloats(join(ADAPTER, WEIGHTS)),
      await readFloats(join(saved, WEIGHTS)),
    ];
    expect([...after.keys()].sort()).toEqual([...before.keys()].sort());
    const names = [...before.keys()];
    expect(names).toContain("base_model.model.score.weight");
    expect(names).toContain("base_model.model.score.bias");
    for (const name of names) {
      const g = stepGradient(get(before, name), get(after, name));
      const want = get(ref, `grad.${name}`);
      const floor = 1e-5 * Math.max(maxAbs(want), 1e-12);
      expect(excess(g, want, 1e-4, floor), name).toBeLessThanOrEqual(1);
    }
  });
});

describe("critic_lora in the trainer", () => {
  it("a fresh adapter (B zero, the head copied) gives the critic's values bit for bit", async () => {
    const plain = await valuesOf([{ op: "load", policy: POLICY, critic: CRITIC }]);
    const fresh = await valuesOf([load({ rank: 8, target_modules: ["q_proj", "v_proj"] })]);
    expect(sameBits(fresh, plain)).toBe(true);
  });

  it("a resumed run's update equals the straight run's, bit for bit", async () => {
    const [straight, resumed, mid] = [tempDir(), tempDir(), tempDir()].map((d) => join(d, "c"));
    const start = load({ rank: 4, alpha: 16, seed: 3 }, { critic_optim: { lr: 1e-3 } });
    serve([start, update, update, { op: "save_checkpoint", dir: straight }]);
    serve([start, update, { op: "save_checkpoint", dir: mid as string }]);
    serve([
      start,
      { op: "load_checkpoint", dir: mid },
      update,
      { op: "save_checkpoint", dir: resumed },
    ]);
    for (const file of [WEIGHTS, "adapter_config.json"]) {
      expect(readFileSync(join(resumed as string, "critic_adapter", file))).toEqual(
        readFileSync(join(straight as string, "critic_adapter", file)),
      );
    }
    expect(readFileSync(join(resumed as string, "critic.optimizer.safetensors"))).toEqual(
      readFileSync(join(straight as string, "critic.optimizer.safetensors")),
    );
  });

  // Two Gloo ranks at ZeRO stage 2 (each a shard of the summed gradient and of AdamW's
  // moments over the adapters and the head) give one rank's update, within float rounding.
  it("two ranks at ZeRO stage 2: one rank's update", async () => {
    const trainOn = async (size: number, stage: number) => {
      const ranks = new Ranks(size, 60, [...CPU]);
      try {
        const fields = loadFields({ path: ADAPTER }, { critic_optim: { lr: 1e-3 } });
        await ranks.ok("load", { ...fields, zero_stage: stage });
        const reply = await ranks.ok("update_critic", { ...updateFields, ppo_mini_batch_size: 3 });
        const dir = join(tempDir(), "ckpt");
        await ranks.ok("save_checkpoint", { dir });
        return { reply, adapter: await readFloats(join(dir, "critic_adapter", WEIGHTS)) };
      } finally {
        await ranks.close();
      }
    };
    const [one, two] = [await trainOn(1, 0), await trainOn(2, 2)];
    for (const key of ["vf_loss", "vpred_mean", "grad_norm"]) {
      const [a, b] = [one.reply[key] as number, two.reply[key] as number];
      expect(Math.abs(a - b), key).toBeLessThanOrEqual(1e-5 * Math.max(1, Math.abs(a)));
    }
    const start = await readFloats(join(ADAPTER, WEIGHTS));
    for (const [name, values] of one.adapter) {
      expect(maxAbsDiff(values, get(two.adapter, name)), name).toBeLessThan(1e-6);
      expect(maxAbsDiff(values, get(start, name)), `${name} was trained`).toBeGreaterThan(1e-6);
    }
  });

  it("refuses what does not go with it, naming the field", () => {
    const refused = (command: Record<string, unknown>, message: RegExp) => {
      const [reply] = serveReplies([command]);
      expect(reply?.ok).toBe(false);
      expect(reply?.error).toMatch(message);
    };
    refused(
      { op: "load", policy: POLICY, critic_lora: { rank: 4 } },
      /'critic_lora' needs a 'critic'/,
    );
    refused(
      load({ path: join(FIXTURES, "lora", "adapter") }),
      /'critic_lora.path': .* is a policy's adapter/,
    );
    refused(
      { op: "load", policy: POLICY, lora: { path: ADAPTER } },
      /'lora.path': .* is a critic's adapter/,
    );
    refused(
      load({ rank: 4 }, { critic_offload: { optimizer: true } }),
      /'critic_offload' with 'critic_lora'/,
    );
    refused(load({}), /'critic_lora' needs 'rank'/);
  });
});
