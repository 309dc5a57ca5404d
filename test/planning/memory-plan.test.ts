// The memory plan of `searchr1 train --dry-run` (src/planning/memory-plan.ts) against numbers
// worked out by hand here, for a small model and for Qwen2.5-3B and 7B (their config.json
// values: /work/shared/reference/native.md §2.2, whose parameter counts §2.3 checks), and
// against what the native trainer really allocates for the test fixture (the CPU backend
// counts every allocation: score --repeat reports the peak).
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import type { ModelDims } from "../../src/ckpt/model-dims.js";
import { resolveConfig } from "../../src/config/resolve.js";
import { trainSpec } from "../../src/config/schemas/train.js";
import { readPlanModel } from "../../src/planning/dry-run.js";
import {
  activationBytes,
  engineStepBytes,
  fitsAt,
  formatPlan,
  GiB,
  learnerBytes,
  memoryPlan,
  type PlanModel,
  paramLayout,
  planInput,
  trajectoryBound,
  zeroStageOf,
} from "../../src/planning/memory-plan.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { writeSafetensors } from "../../src/tensors/safetensors.js";
import { runCli } from "../helpers/cli.js";
import { modelDir, tempDir } from "../native/helpers.js";

const qwen2 = (dims: Omit<ModelDims, "modelType">): PlanModel => ({
  dims: { modelType: "qwen2", ...dims },
  attentionBias: true,
});

// H 8, I 16, 2 layers, 2 heads of 4 (Q 8), 1 KV head (KV 4), V 32, untied, q/k/v biases.
const SMALL = qwen2({
  vocabSize: 32,
  hiddenSize: 8,
  intermediateSize: 16,
  layers: 2,
  heads: 2,
  kvHeads: 1,
  headDim: 4,
  tied: false,
});
const QWEN_3B = qwen2({
  vocabSize: 151936,
  hiddenSize: 2048,
  intermediateSize: 11008,
  layers: 36,
  heads: 16,
  kvHeads: 2,
  headDim: 128,
  tied: true,
});
// The brief for this file said vocab 151936 for both; Qwen2.5-7B's config.json says 152064
// (native.md §2.2), which the parameter count below confirms.
const QWEN_7B = qwen2({
  vocabSize: 152064,
  hiddenSize: 3584,
  intermediateSize: 18944,
  layers: 28,
  heads: 28,
  kvHeads: 4,
  headDim: 128,
  tied: false,
});

describe("the flat parameter buffer (native/src/model/params.h)", () => {
  // Groups start at multiples of 128 floats. Embedding [32, 8]: 0..256. Layer 0: ln1 at 256
  // (..264); q at 384 (..448), k, v follow (..512); the biases at 512 (..528); o at 640
  // (..704); ln2 at 768 (..776); gate at 896, up (..1152); down at 1152 (..1280). Layer 1
  // the same from 1280: ..2304. Final norm at 2304 (..2312); lm_head at 2432 (..2688).
  // Parameters: 256 + 2 × 608 (8 + 64 + 32 + 32 + 16 + 64 + 8 + 3 × 128) + 8 + 256.
  // ZeRO stage 2's regions: the embeddings up to layer 0 (256), each layer 1024 wide, the
  // final norm from 2304 on.
  it("a small model: the floats with the alignment gaps, the parameters and the regions", () => {
    const regions = { embedRegion: 256, widestLayer: 1024, norm: 2304 };
    expect(paramLayout(SMALL, "lm")).toEqual({ floats: 2688, parameters: 1736, ...regions });
    // A critic: no lm_head; the value head [1, 8] at 2432 and its bias: 2441.
    expect(paramLayout(SMALL, "value")).toEqual({ floats: 2441, parameters: 1489, ...regions });
  });

  // Every Qwen2.5-3B/7B size is a multiple of 128: no gaps. The counts are Hugging Face's.
  it("Qwen2.5-3B and 7B: Hugging Face's parameter counts", () => {
    expect(paramLayout(QWEN_3B, "lm")).toMatchObject({
      floats: 3_085_938_688,
      parameters: 3_085_938_688,
    });
    expect(paramLayout(QWEN_7B, "lm")).toMatchObject({
      floats: 7_615_616_512,
      parameters: 7_615_616_512,
    });
    // The 7B critic: the lm_head (152064 × 3584) replaced by a value head of 3584 + 1.
    expect(paramLayout(QWEN_7B, "value").parameters).toBe(
      7_615_616_512 - 152_064 * 3584 + 3584 + 1,
    );
  });

  it("the fixture the native tests train: the trainer's own count", () => {
    expect(paramLayout(readPlanModel(modelDir("untied")), "lm").floats).toBe(140160);
  });
});

describe("a learner's bytes per rank (native/src/train/learner.h)", () => {
  // Without offload nothing is in host memory.
  const NO_HOST = { hostWeights: 0, hostMasters: 0, hostOptimizer: 0, hostGradients: 0 };
  // 8 ranks: the buffer padded to a multiple of 8 × 128 = 1024 floats. 3B: 3,085,938,688 /
  // 1024 = 3,013,612 exactly, so the shard is 385,742,336 floats. 7B: 7,437,125.5 → the
  // buffer padded to 7,437,126 × 1024 = 7,615,617,024, shards of 951,952,128.
  it("Qwen2.5-3B on 8 GPUs: ZeRO stage 0, 1, 2", () => {
    const P = 3_085_938_688;
    const layout = paramLayout(QWEN_3B, "lm");
    expect(learnerBytes(layout, 8, 0, "cuda")).toEqual({
      weights: 2 * P,
      masters: 4 * P, // 11.50 GiB
      optimizer: 8 * P, // 22.99 GiB
      gradients: 4 * P,
      gradientsBetween: 4 * P,
      ...NO_HOST,
    });
    const S = 385_742_336;
    expect(learnerBytes(layout, 8, 1, "cuda")).toEqual({
      weights: 2 * P,
      masters: 4 * S, // 1.44 GiB
      optimizer: 8 * S, // 2.87 GiB
      gradients: 4 * P,
      gradientsBetween: 4 * P,
      ...NO_HOST,
    });
    // Stage 2: the shard, the embeddings' bucket (151936 × 2048 = 311,164,928, the tied head
    // adds to it) and one layer's (2048 + 2048² + 2 × 256 × 2048 + 2048 + 512 + 2048² + 2048 +
    // 3 × 11008 × 2048 = 77,076,992; the final norm's region is 2048): 2.88 GiB, not 11.50.
    expect(learnerBytes(layout, 8, 2, "cuda")).toMatchObject({
      optimizer: 8 * S,
      gradients: 4 * (S + 311_164_928 + 77_076_992),
      gradientsBetween: 0,
    });
  });

  it("Qwen2.5-7B on 8 GPUs: the padded buffer and its shards", () => {
    const C = 7_615_617_024;
    const S = 951_952_128;
    // The buckets: the embeddings (152064 × 3584 = 544,997,376) and the final norm with the
    // untied head up to the padded end (3584 + 544,997,376 + 512 of padding), wider than a
    // layer (233,057,792): 7.61 GiB with the shard, not 28.37.
    expect(learnerBytes(paramLayout(QWEN_7B, "lm"), 8, 2, "cuda")).toEqual({
      weights: 2 * C,
      masters: 4 * S,
      optimizer: 8 * S,
      gradients: 4 * (S + 544_997_376 + 545_001_472),
      gradientsBetween: 0,
      ...NO_HOST,
    });
    expect((8 * S) / GiB).toBeCloseTo(7.093, 3);
    // Search-R1's scripts offload all three: the device keeps the buckets during the backward
    // (4.06 GiB) and the bf16 compute copy during the trainer's commands; host memory the
    // rest, 14.18 GiB of masters, moments and gradient shard and 14.18 of weights a rank.
    const all = { param: true, grad: true, optimizer: true };
    expect(learnerBytes(paramLayout(QWEN_7B, "lm"), 8, 2, "cuda", all)).toEqual({
      weights: 2 * C,
      masters: 0,
      optimizer: 0,
      gradients: 4 * (544_997_376 + 545_001_472),
      gradientsBetween: 0,
      hostWeights: 2 * C,
      hostMasters: 4 * S,
      hostOptimizer: 8 * S,
      hostGradients: 4 * S,
    });
  });

  it("on the CPU the fp32 compute copy is the masters", () => {
    // The fixture on 2 CPU ranks, as test/native/ranks.test.ts measures it (its shard and
    // buckets: 560,640 bytes).
    expect(learnerBytes(paramLayout(readPlanModel(modelDir("untied")), "lm"), 2, 2, "cpu")).toEqual(
      {
        weights: 4 * 140288,
        masters: 0,
        optimizer: 8 * 70144,
        gradients: 560_640,
        gradientsBetween: 0,
        ...NO_HOST,
      },
    );
  });
});

describe("activations of one pass (native/src/model/qwen2.cpp reserve())", () => {
  // The small model, N = 10 tokens, fp32 (x = 4), logits chunk 256 cut to the 10 rows, Q 8,
  // QKV 16: compute-type: two layer inputs used in turn 2·10·8 = 160; per layer set
  // 10·(3·8 + 16 + 8 + 3·16) = 960; final norm 80; head input 10·8 = 80; logits 10·32 = 320;
  // values 10. Backward keeps every layer's input (a third, 80) and adds 960 + 80. fp32: per
  // set 10·(2 + 2 heads) = 40, then 30; backward 20. int32: 50.
  it("a small model, forward and backward, with and without recompute", () => {
    const forward = (160 + 960 + 80 + 80 + 320 + 10) * 4 + (40 + 30) * 4 + 50 * 4;
    const cpu = (tokens: number, backward: boolean, recompute: boolean) =>
      activationBytes(SMALL.dims, { tokens, backward, recompute }, "cpu");
    expect(cpu(10, false, false)).toBe(forward);
    // A forward pass is the same with and without recompute (one set, two inputs).
    expect(cpu(10, false, true)).toBe(forward);
    const recompute = forward + (80 + 960 + 80) * 4 + 20 * 4;
    expect(cpu(10, true, true)).toBe(recompute);
    // Without recompute every layer keeps its set: one more of 960 + 40.
    expect(cpu(10, true, false)).toBe(recompute + (960 + 40) * 4);
  });

  // The head's chunk: the device's default, never more rows than the pass has.
  it("logits chunks of 256 rows on the CPU and 2,048 on CUDA, cut to the pass's rows", () => {
    const bytes = (tokens: number, device: "cpu" | "cuda") =>
      activationBytes(SMALL.dims, { tokens, backward: false, recompute: false }, device);
    const V = SMALL.dims.vocabSize;
    const H = SMALL.dims.hiddenSize;
    // One more token adds its own rows; past the chunk it no longer adds head rows.
    const perToken = (device: "cpu" | "cuda", at: number) =>
      bytes(at + 1, device) - bytes(at, device);
    expect(perToken("cpu", 100) - perToken("cpu", 300)).toBe((V + H) * 4);
    expect(perToken("cuda", 300) - perToken("cuda", 3000)).toBe((V + H) * 2);
  });

  // What the trainer really holds: score's peak, less the fp32 weights; sft's second step's,
  // less the weights, gradients and AdamW moments (16 bytes a float). The peaks are printed
  // in MiB with 3 decimals: equal to within that rounding (524 bytes). Three shapes: one
  // row, a few, and more rows than the CPU's logits chunk (256).
  it.each([
    [3, 40],
    [1, 23],
    [4, 80],
  ])(
    "the fixture, %i × %i tokens: the trainer's own peaks, forward and backward, with and without recompute",
    async (B, T) => {
      const dir = tempDir();
      const ids = new BigInt64Array(B * T).map((_, i) => BigInt(3 + ((i * 7) % 500)));
      const batch = join(dir, "batch.safetensors");
      await writeSafetensors(batch, [
        { name: "input_ids", dtype: "I64", shape: [B, T], data: ids },
        {
          name: "attention_mask",
          dtype: "I64",
          shape: [B, T],
          data: new BigInt64Array(B * T).fill(1n),
        },
      ]);
      // The JSON lines with peak_memory_mb: score's on stdout, sft's in its --metrics file.
      const trainer = (args: string[], metrics?: string) => {
        const r = spawnSync(
          nativeExecutable("searchr1-trainer"),
          [...args, "--device", "cpu", "--threads", "1", "--model", modelDir("untied")],
          { encoding: "utf8" },
        );
        expect(r.status, r.stderr).toBe(0);
        return (metrics ? readFileSync(metrics, "utf8") : r.stdout)
          .trim()
          .split("\n")
          .map((l) => (JSON.parse(l) as { peak_memory_mb: number }).peak_memory_mb * 2 ** 20);
      };
      const fixture = readPlanModel(modelDir("untied"));
      const P = paramLayout(fixture, "lm").floats;
      const pass = (backward: boolean, recompute: boolean) =>
        activationBytes(fixture.dims, { tokens: B * T, backward, recompute }, "cpu");
      const out = join(dir, "out.safetensors");
      const [scored] = trainer(["score", "--batch", batch, "--out", out, "--repeat", "1"]);
      expect(Math.abs((scored ?? 0) - 4 * P - pass(false, false))).toBeLessThanOrEqual(524);
      for (const recompute of [false, true]) {
        const metrics = join(dir, `sft-${recompute}.jsonl`);
        const steps = trainer(
          [
            "sft",
            "--data",
            batch,
            "--out",
            join(dir, `sft-${recompute}`),
            "--steps",
            "2",
            "--metrics",
            metrics,
            ...(recompute ? ["--recompute"] : []),
          ],
          metrics,
        );
        const second = steps[1] ?? 0;
        expect(Math.abs(second - 16 * P - pass(true, recompute))).toBeLessThanOrEqual(524);
      }
    },
  );
});

const config = (overrides: string[]) =>
  resolveConfig(trainSpec, { overrides: ["model.path=/m", ...overrides] });

describe("the plan's input from a train config", () => {
  it("ranks, the resolved stage, the tokens of each pass, the parts on the device", () => {
    const c = config([
      "trainer.gpus=8",
      "data.train_batch_size=16",
      "rollout.n=5",
      "actor.ppo_mini_batch_size=8",
      "actor.ppo_micro_batch_size=40",
      "rollout.log_prob_micro_batch_size=16",
      "data.max_start_length=100",
      "data.max_response_length=20",
      "data.max_obs_length=30",
      "rollout.max_turns=2",
    ]);
    // 100 + 2 × (20 + 30) + 20.
    expect(trajectoryBound(c)).toBe(220);
    expect(zeroStageOf(c)).toBe(2);
    const input = planInput(c, SMALL, SMALL);
    expect(input).toMatchObject({
      ranks: 8,
      stage: 2,
      device: "cuda",
      recompute: true,
      reference: true,
      critic: null,
      engine: { utilization: 0.6, release: true },
      deviceBytes: 79 * GiB,
      // The sizes are global (verl's): a rank's share of a mini-batch is 8 × 5 / 8 = 5 rows,
      // its micro-batches 40 / 8 = 5 of them, its log-prob passes 16 / 8 = 2; no critic.
      tokens: { update: 5 * 220, logProbs: 2 * 220, criticUpdate: 0, values: 0 },
    });
    // By tokens (use_dynamic_bsz): the budget, but never less than one trajectory nor more
    // than the rank's rows.
    const dynamic = (budget: number) =>
      planInput(
        config([
          "trainer.gpus=8",
          "rollout.n=5",
          "actor.ppo_mini_batch_size=8",
          "data.max_start_length=100",
          "data.max_response_length=20",
          "data.max_obs_length=30",
          "rollout.max_turns=2",
          "actor.use_dynamic_bsz=true",
          `actor.ppo_max_token_len_per_gpu=${budget}`,
        ]),
        SMALL,
        SMALL,
      ).tokens;
    expect(dynamic(500)).toMatchObject({ update: 500, logProbs: 2 * 220 });
    expect(dynamic(100)).toMatchObject({ update: 220, logProbs: 220 });
    expect(dynamic(10_000)).toMatchObject({ update: 5 * 220 });
    expect(zeroStageOf(config([]))).toBe(0);
    expect(zeroStageOf(config(["trainer.gpus=8", "trainer.zero_stage=1"]))).toBe(1);
    const ppo = planInput(
      config(["algorithm.name=ppo", "actor.use_kl_loss=false", "trainer.device=cpu"]),
      SMALL,
      SMALL,
    );
    expect(ppo).toMatchObject({ critic: SMALL, reference: false, device: "cpu", engine: null });
    expect(
      planInput(config(["rollout.engine_url=http://h:1/"]), SMALL, SMALL).engineElsewhere,
    ).toMatch(/elsewhere \(http:\/\/h:1\//);
  });
});

describe("the whole plan", () => {
  // The small model on 2 CUDA ranks, a reference, the engine on the device at 0.5 of 1 GiB,
  // passes of 10 tokens. bf16 (x = 2). Actor at stage 0: weights 2 × 2688, masters 4 × 2688,
  // moments 8 × 2688, gradients 4 × 2688; at stages 1 and 2 the buffer is padded to
  // 11 × 256 = 2816 floats and a shard is 1408; stage 2 holds no gradient during the
  // rollouts, and during the updates the shard and two buckets (the embeddings' 256 and a
  // layer's 1024, wider than the final norm's 512 with the head and padding): 4 × 2688.
  // Activations (the counts above, x = 2; the head's chunk of 2,048 rows cut to the 10): the
  // update 2730 × 2 + 90 × 4 + 50 × 4 = 6020 (recompute), during the updates alone; the
  // log-prob pass 1610 × 2 + 70 × 4 + 50 × 4 = 3700, the actor's and the reference's, during
  // the log-probs alone, where the total counts one (the trainer runs one command at a time
  // and frees its activations after it). The
  // trainer's backend: 32 MiB + the attention's backward scratch 8 × 10 + 4 × 10 × (8 + 2)
  // = 480. The engine: u × device = 2^29 in all: its weights, the buffers of its largest
  // step (8192 + 256 = 8448 rows × (3·8 + 16 + 8 + 3·16) bf16, a 64-row head chunk of
  // 8 + 32 bf16, 8448 × 4 bytes of rstd and 5 × 8448 ints: 1,829,888 bytes), the workspace and
  // its KV cache, the rest: 2^29 − 5376 − 1829888 − 32 MiB.
  const input = (release: boolean) => ({
    policy: SMALL,
    critic: null,
    reference: true,
    ranks: 2,
    stage: 2 as const,
    device: "cuda" as const,
    recompute: true,
    tokens: { update: 10, logProbs: 10, criticUpdate: 10, values: 10 },
    engine: { utilization: 0.5, release },
    deviceBytes: GiB,
    trajectoryTokens: 10,
  });
  const MiB32 = 32 * 2 ** 20;
  const STEP = 1829888;
  const KV = 2 ** 29 - 5376 - STEP - MiB32;

  it("the small model on two GPUs: every row, during the rollouts, the log-probs and the updates", () => {
    const plan = memoryPlan(input(false));
    const counted = plan.rows
      .filter((r) => r.counted)
      .map((r) => [r.part, r.rollout, r.logProbs, r.update]);
    const all = (a: number, b = a, c = b) => [
      [a, b, c],
      [a, b, c],
      [a, b, c],
    ];
    const zero = [0, 0, 0];
    expect(counted).toEqual([
      ["actor", ...all(5376, 5632)],
      ["actor", ...all(10752, 5632)],
      ["actor", ...all(21504, 11264)],
      ["actor", [10752, 11264, 0], [10752, 11264, 0], [10752, 11264, 10752]],
      ["actor", zero, zero, [6020, 6020, 6020]],
      ["actor", zero, [3700, 3700, 3700], zero],
      ["reference", ...all(5376)],
      ["reference", zero, [3700, 3700, 3700], zero],
      ["trainer", ...all(MiB32 + 480)],
      ["engine", ...all(5376)],
      ["engine", ...all(KV)],
      ["engine", ...all(STEP)],
      ["engine", ...all(MiB32)],
    ]);
    // Held throughout at stage 0 and 1; at stage 2 without the gradients but in the updates.
    const held0 = 5376 + 10752 + 21504 + 10752 + 5376 + MiB32 + 480 + 2 ** 29;
    const held1 = 5632 + 5632 + 11264 + 11264 + 5376 + MiB32 + 480 + 2 ** 29;
    const rollout = [held0, held1, held1 - 11264];
    expect(plan.totals).toEqual({
      rollout,
      logProbs: rollout.map((t) => t + 3700),
      update: [held0 + 6020, held1 + 6020, held1 - 11264 + 10752 + 6020],
      peak: [held0 + 6020, held1 + 6020, held1 - 11264 + 10752 + 6020],
      host: [0, 0, 0],
    });
    expect(fitsAt(plan, 2)).toEqual({
      fits: true,
      margin: GiB - (held1 - 11264 + 10752 + 6020),
    });
    expect(plan.engineRefuses).toBe(false);
  });

  it("an engine that gives its KV cache (and its step's buffers) back while the trainer works", () => {
    const plan = memoryPlan(input(true));
    const kv = plan.rows.find((r) => r.part === "engine" && r.item.startsWith("KV cache"));
    expect(kv).toMatchObject({ rollout: [KV, KV, KV], update: [0, 0, 0] });
    const step = plan.rows.find((r) => r.part === "engine" && r.item.startsWith("buffers"));
    expect(step).toMatchObject({ rollout: [STEP, STEP, STEP], update: [0, 0, 0] });
    const kept = memoryPlan(input(false));
    expect(plan.totals.rollout).toEqual(kept.totals.rollout);
    expect(plan.totals.update).toEqual(kept.totals.update.map((t) => t - KV - STEP));
    // Stage 2: the rollouts hold the KV cache, the updates the gradients (11264 < KV).
    expect(plan.totals.peak[2]).toBe(plan.totals.rollout[2]);
  });

  it("ref.param_offload: the reference on the device during its log-probs only", () => {
    const kept = memoryPlan(input(false));
    const off = memoryPlan({ ...input(false), referenceOffload: true });
    const refs = (p: typeof kept) => p.rows.filter((r) => r.part === "reference");
    for (const [a, b] of refs(kept).map((r, i) => [r, refs(off)[i]] as const)) {
      expect(b).toMatchObject({ rollout: [0, 0, 0], update: [0, 0, 0], logProbs: a.logProbs });
    }
    // Its weights; its activations are in the log-probs alone either way.
    expect(off.totals.rollout).toEqual(kept.totals.rollout.map((t) => t - 5376));
    expect(off.totals.update).toEqual(kept.totals.update.map((t) => t - 5376));
    expect(off.totals.logProbs).toEqual(kept.totals.logProbs);
  });

  // actor.*_offload (native/src/train/learner.h): with all three, the masters (4 × 2688 |
  // 1408 | 1408) and moments (8 × the same) go to host memory; the gradient too, to a host
  // copy of the shard (4 × 2688 | 1408 | 1408), so the device holds none between updates
  // (stage 0 and 1: 4 × 2688 | 2816) and at stage 2 only the buckets during the backward
  // (4 × (256 + 1024)); the compute copy (2 × 2688 | 2816 | 2816) leaves the device during
  // the rollouts (its activations are in its own commands alone either way). Host lines
  // count in no device total: their own.
  it("actor offloads: their bytes leave the device totals for host memory lines", () => {
    const kept = memoryPlan(input(false));
    const off = memoryPlan({
      ...input(false),
      actorOffload: { param: true, grad: true, optimizer: true },
    });
    const minus = (t: number[], d: number[]) => t.map((x, s) => x - (d[s] ?? 0));
    // Per stage: the masters and moments; at stage 2 the gradient shard during the updates;
    // during the rollouts also the weights and gradients between updates.
    expect(off.totals.update).toEqual(
      minus(kept.totals.update, [10752 + 21504, 5632 + 11264, 5632 + 11264 + 5632]),
    );
    expect(off.totals.rollout).toEqual(
      minus(kept.totals.rollout, [
        10752 + 21504 + 5376 + 10752,
        5632 + 11264 + 5632 + 11264,
        5632 + 11264 + 5632,
      ]),
    );
    // The weights, masters, moments and the gradient's host copy.
    expect(off.totals.host).toEqual([
      5376 + 10752 + 21504 + 10752,
      5632 + 5632 + 11264 + 5632,
      5632 + 5632 + 11264 + 5632,
    ]);
    const host = off.rows.filter((r) => r.host);
    expect(host.map((r) => r.item)).toEqual([
      "weights (bf16 compute copy) between its log-probs and updates",
      "fp32 master weights",
      "AdamW moments (fp32 m, v)",
      "fp32 gradients the step reads",
    ]);
    expect(host.every((r) => r.part === "actor" && !r.counted)).toBe(true);
    const printed = formatPlan(off, "plan");
    expect(printed).toMatch(/^actor +fp32 master weights \(host memory\) +0\.00 +0\.00 +0\.00$/m);
    expect(printed).toMatch(/^total in host memory \(offloads, apart from the above\) +0\.00/m);
    expect(formatPlan(kept, "plan")).not.toMatch(/host memory/);
  });

  it("an engine whose share cannot hold its weights and one KV block refuses", () => {
    const plan = memoryPlan({
      policy: QWEN_7B,
      critic: null,
      reference: false,
      ranks: 8,
      stage: 2,
      device: "cuda",
      recompute: true,
      tokens: { update: 1000, logProbs: 1000, criticUpdate: 1000, values: 1000 },
      engine: { utilization: 0.1, release: true },
      deviceBytes: 79 * GiB,
      trajectoryTokens: 1000,
    });
    expect(plan.engineRefuses).toBe(true);
    expect(fitsAt(plan, 2).fits).toBe(false);
  });
});

describe("searchr1 train --dry-run", () => {
  // Qwen2.5-7B's config.json (native.md §2.2), 8 GPUs, GRPO, the v0.2 recipe's settings with
  // one trajectory per micro-batch: printed, nothing started, nothing written.
  it("prints the plan of one device and whether it fits; writes nothing", () => {
    const dir = tempDir();
    const model = join(dir, "Qwen2.5-7B");
    mkdirSync(model);
    writeFileSync(
      join(model, "config.json"),
      JSON.stringify({
        model_type: "qwen2",
        hidden_size: 3584,
        intermediate_size: 18944,
        num_attention_heads: 28,
        num_key_value_heads: 4,
        num_hidden_layers: 28,
        vocab_size: 152064,
        tie_word_embeddings: false,
      }),
    );
    const out = join(dir, "runs");
    const r = runCli([
      "train",
      "--config",
      "templates/configs/search-r1-v0.2-grpo.yaml",
      "--model",
      model,
      "--gpus",
      "8",
      "--dry-run",
      "--device-memory",
      "79",
      `trainer.output_dir=${out}`,
      "actor.ppo_micro_batch_size_per_gpu=1",
      "rollout.log_prob_micro_batch_size_per_gpu=1",
      // The learner's own state on the device (the recipe offloads it, as Search-R1's scripts).
      "actor.param_offload=false",
      "actor.grad_offload=false",
      "actor.optimizer_offload=false",
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/of 8 \(trainer\.gpus 8 × trainer\.nnodes 1\)/);
    expect(r.stdout).toMatch(/7,615,616,512 parameters \(qwen2, 28 layers, hidden 3584/);
    expect(r.stdout).toMatch(/ZeRO stage 2 \(trainer\.zero_stage null: 2 on several ranks\)/);
    // The actor's shards, stage 0 | 1 | 2: the masters 28.37 | 3.55 | 3.55 GiB.
    expect(r.stdout).toMatch(/actor +fp32 master weights +28\.37 +3\.55 +3\.55/);
    expect(r.stdout).toMatch(/actor +AdamW moments \(fp32 m, v\) +56\.74 +7\.09 +7\.09/);
    // The recipe offloads the reference (ref.param_offload, as Search-R1's scripts).
    expect(r.stdout).toMatch(
      /reference weights \(bf16 compute copy\), on the device for its log-probs only +14\.19/,
    );
    expect(r.stdout).toMatch(/^total during the log-probs +\d/m);
    expect(r.stdout).toMatch(/^total during the updates +\d/m);
    expect(r.stdout).toMatch(/^(fits|does NOT fit) 79\.00 GiB at ZeRO stage 2/m);
    // Search-R1's arithmetic: 512 prompts repeated 5 times (n_agent) = 2,560 trajectories in
    // mini-batches of 256 = 10 optimizer steps; one trajectory per micro-batch and pass on
    // each rank (the *_per_gpu sizes).
    expect(r.stdout).toMatch(
      /^a step: 512 prompts × 5 = 2560 trajectories; 10 optimizer steps of 256 \(actor\.ppo_mini_batch_size × rollout\.n\)$/m,
    );
    expect(r.stdout).toMatch(
      /^per rank of 8: micro-batches of 1 \(actor\), log-prob passes of 1 \(old\) and 1 \(reference\)$/m,
    );
    // Per step, one rank: the fp32 gradient (4 × 7,615,617,024 bytes = 30.46 GB) all-reduced,
    // 2 × 7/8 of it per optimizer step; or reduced once per micro-batch pass (256 / 8 = 32
    // trajectories a rank, one per micro-batch); and the bf16 weights all-gathered, 7/8 ×
    // 15.23 GB per optimizer step.
    expect(r.stdout).toMatch(
      /^gradient traffic of one rank per step \(collective volumes, 10 optimizer step\(s\)\): stage 0\/1 533\.1 GB \(an all-reduce per optimizer step\); stage 2 up to 9\.75 TB \(a reduce per micro-batch pass, up to 32 per optimizer step\); from stage 1 on the all-gather of the updated weights adds 133\.3 GB$/m,
    );
    expect(existsSync(out)).toBe(false);
  });
});

describe("the engine's step buffers", () => {
  // searchr1-engine sets them aside before sizing its KV cache and says how many bytes in its
  // ready event; on the CPU (fp32) for a fixture model, with the block tables counted.
  it("are what the engine reports, to the byte", () => {
    const dir = "test/engine/fixtures/qwen-hd16";
    const r = spawnSync(
      nativeExecutable("searchr1-engine"),
      ["--model", dir, "--device", "cpu", "--threads", "1"],
      { input: '{"op":"shutdown"}\n', encoding: "utf8" },
    );
    expect(r.status, r.stderr).toBe(0);
    const ready = JSON.parse(r.stdout.split("\n")[0] as string) as Record<string, number>;
    const chunkTokens = ready.chunk_tokens as number;
    const maxRunning = ready.max_running as number;
    // Each sequence's block table is a power of two wide, for the whole context.
    let columns = 1;
    while (columns < Math.ceil((ready.context_length as number) / 16)) columns *= 2;
    const dims = readPlanModel(dir).dims;
    expect(chunkTokens).toBe(512); // the CPU's default
    expect(
      engineStepBytes(dims, 4, { chunkTokens, maxRunning, tableEntries: maxRunning * columns }),
    ).toBe(ready.step_buffer_bytes);
  });
});
