// The memory plan of `searchr1 train --dry-run`: the native sizes it adds up
// (`searchr1-trainer plan`, src/planning/native-sizes.ts) against numbers worked out by hand
// here, for a small model and for Qwen2.5-3B and 7B, and against what the native trainer
// and engine really allocate for the test fixtures (the CPU backend counts every
// allocation: score --repeat and sft report their peaks, the engine its step's buffers);
// then src/planning/memory-plan.ts's sums, moment by moment.
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { resolveConfig } from "../../src/config/resolve.js";
import { trainSpec } from "../../src/config/schemas/train.js";
import { readPlanModel } from "../../src/planning/dry-run.js";
import {
  fitsAt,
  formatPlan,
  GiB,
  memoryPlan,
  type PlanInput,
  type PlanModel,
  planInput,
  trajectoryBound,
  zeroStageOf,
} from "../../src/planning/memory-plan.js";
import {
  type LearnerBytes,
  modelBytes,
  NO_OFFLOAD,
  type Offload,
  passOf,
  type SizesRequest,
} from "../../src/planning/native-sizes.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { writeSafetensors } from "../../src/tensors/safetensors.js";
import { runCli } from "../helpers/cli.js";
import { modelDir, tempDir } from "../native/helpers.js";
import { QWEN_CONFIGS, SMALL_CONFIG, writeModelConfig } from "./model-configs.js";

const model = (config: object): PlanModel => readPlanModel(writeModelConfig(tempDir(), config));
const SMALL = model(SMALL_CONFIG);
const QWEN_3B = model(QWEN_CONFIGS["Qwen/Qwen2.5-3B"]);
const QWEN_7B = model(QWEN_CONFIGS["Qwen/Qwen2.5-7B"]);
const sizes = (m: PlanModel, req: Partial<SizesRequest> = {}) =>
  modelBytes({
    dir: m.dir,
    head: "lm",
    device: "cuda",
    ranks: 1,
    offload: NO_OFFLOAD,
    tokens: [],
    ...req,
  });
const learner = (m: PlanModel, ranks: number, stage: 0 | 1 | 2, req: Partial<SizesRequest> = {}) =>
  sizes(m, { ranks, ...req }).learner[stage] as LearnerBytes;

describe("searchr1-trainer plan: the flat parameter buffer (native/src/model/params.h)", () => {
  // Groups start at multiples of 128 floats. Embedding [32, 8]: 0..256. Layer 0: ln1 at 256
  // (..264); q at 384 (..448), k, v follow (..512); the biases at 512 (..528); o at 640
  // (..704); ln2 at 768 (..776); gate at 896, up (..1152); down at 1152 (..1280). Layer 1
  // the same from 1280: ..2304. Final norm at 2304 (..2312); lm_head at 2432 (..2688).
  // Parameters: 256 + 2 × 608 (8 + 64 + 32 + 32 + 16 + 64 + 8 + 3 × 128) + 8 + 256.
  it("a small model: the floats with the alignment gaps and the parameters", () => {
    expect(sizes(SMALL)).toMatchObject({ floats: 2688, parameters: 1736, computeCopy: 2 * 2688 });
    // A critic: no lm_head; the value head [1, 8] at 2432 and its bias: 2441.
    expect(sizes(SMALL, { head: "value" })).toMatchObject({ floats: 2441, parameters: 1489 });
  });

  // Every Qwen2.5-3B/7B size is a multiple of 128: no gaps. The counts are Hugging Face's.
  it("Qwen2.5-3B and 7B: Hugging Face's parameter counts", () => {
    expect(sizes(QWEN_3B)).toMatchObject({ floats: 3_085_938_688, parameters: 3_085_938_688 });
    expect(sizes(QWEN_7B)).toMatchObject({ floats: 7_615_616_512, parameters: 7_615_616_512 });
    // The 7B critic: the lm_head (152064 × 3584) replaced by a value head of 3584 + 1.
    expect(sizes(QWEN_7B, { head: "value" }).parameters).toBe(
      7_615_616_512 - 152_064 * 3584 + 3584 + 1,
    );
  });

  it("refuses what it cannot plan, naming the option or the file", () => {
    const plan = (args: string[]) =>
      spawnSync(nativeExecutable("searchr1-trainer"), ["plan", ...args], { encoding: "utf8" });
    const bad = [
      [["--model", SMALL.dir, "--device", "tpu"], /--device: 'tpu' is not cpu or cuda/],
      [["--model", SMALL.dir, "--device", "cpu", "--offload", "disk"], /--offload: 'disk'/],
      [["--model", SMALL.dir, "--device", "cpu", "--tokens", "12,x"], /--tokens: 'x'/],
      [["--model", "/nonexistent", "--device", "cpu"], /\/nonexistent\/config\.json/],
      [
        ["--model", SMALL.dir, "--device", "cpu", "--lora-targets", "q_proj"],
        /--lora-targets needs --lora-rank/,
      ],
      [
        ["--model", SMALL.dir, "--device", "cpu", "--lora-rank", "4", "--lora-targets", "qproj"],
        /--lora-targets: .*'qproj' is not one of all-linear, q_proj/,
      ],
    ] as const;
    for (const [args, message] of bad) {
      const r = plan([...args]);
      expect(r.status).not.toBe(0);
      expect(r.stderr).toMatch(message);
      expect(r.stdout).toBe("");
    }
  });
});

describe("searchr1-trainer plan: a learner's bytes per rank (native/src/train/learner.h)", () => {
  // Without offload nothing is in host memory.
  const NO_HOST = { hostWeights: 0, hostMasters: 0, hostOptimizer: 0, hostGradients: 0 };
  // 8 ranks: the buffer padded to a multiple of 8 × 128 = 1024 floats. 3B: 3,085,938,688 /
  // 1024 = 3,013,612 exactly, so the shard is 385,742,336 floats. 7B: 7,437,125.5 → the
  // buffer padded to 7,437,126 × 1024 = 7,615,617,024, shards of 951,952,128.
  it("Qwen2.5-3B on 8 GPUs: ZeRO stage 0, 1, 2", () => {
    const P = 3_085_938_688;
    expect(learner(QWEN_3B, 8, 0)).toEqual({
      weights: 2 * P,
      masters: 4 * P, // 11.50 GiB
      optimizer: 8 * P, // 22.99 GiB
      gradients: 4 * P,
      gradientsBetween: 4 * P,
      ...NO_HOST,
    });
    const S = 385_742_336;
    expect(learner(QWEN_3B, 8, 1)).toEqual({
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
    expect(learner(QWEN_3B, 8, 2)).toMatchObject({
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
    expect(learner(QWEN_7B, 8, 2)).toEqual({
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
    const offload = { param: true, grad: true, optimizer: true };
    expect(learner(QWEN_7B, 8, 2, { offload })).toEqual({
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
    expect(learner(readPlanModel(modelDir("untied")), 2, 2, { device: "cpu" })).toEqual({
      weights: 4 * 140288,
      masters: 0,
      optimizer: 8 * 70144,
      gradients: 560_640,
      gradientsBetween: 0,
      ...NO_HOST,
    });
  });
});

describe("searchr1-trainer plan: the activations of one pass (native/src/model/qwen2.cpp)", () => {
  // The small model, N = 10 tokens, fp32 (x = 4), logits chunk 256 cut to the 10 rows, Q 8,
  // QKV 16: compute-type: two layer inputs used in turn 2·10·8 = 160; per layer set
  // 10·(3·8 + 16 + 8 + 3·16) = 960; final norm 80; head input 10·8 = 80; logits 10·32 = 320;
  // values 10. Backward keeps every layer's input (a third, 80) and adds 960 + 80. fp32: per
  // set 10·(2 + 2 heads) = 40, then 30; backward 20. int32: 50.
  it("a small model, forward and backward, with and without recompute", () => {
    const forward = (160 + 960 + 80 + 80 + 320 + 10) * 4 + (40 + 30) * 4 + 50 * 4;
    const recompute = forward + (80 + 960 + 80) * 4 + 20 * 4;
    expect(passOf(sizes(SMALL, { device: "cpu", tokens: [10] }), 10)).toEqual({
      tokens: 10,
      forward,
      // Without recompute every layer keeps its set: one more of 960 + 40.
      backward: recompute + (960 + 40) * 4,
      backwardRecompute: recompute,
      attentionForwardScratch: 0,
      attentionBackwardScratch: 0,
    });
    // On CUDA the attention's scratch: the spans 8 × 10, and the backward's fp32 dq and
    // delta 4 × 10 × (8 + 2).
    expect(passOf(sizes(SMALL, { tokens: [10] }), 10)).toMatchObject({
      attentionForwardScratch: 80,
      attentionBackwardScratch: 80 + 400,
    });
  });

  // The head's chunk: the device's default, never more rows than the pass has.
  it("logits chunks of 256 rows on the CPU and 2,048 on CUDA, cut to the pass's rows", () => {
    const forward = (device: "cpu" | "cuda", at: number) => {
      const s = sizes(SMALL, { device, tokens: [at, at + 1] });
      return passOf(s, at + 1).forward - passOf(s, at).forward;
    };
    // One more token adds its own rows; past the chunk it no longer adds head rows.
    expect(forward("cpu", 100) - forward("cpu", 300)).toBe((32 + 8) * 4);
    expect(forward("cuda", 300) - forward("cuda", 3000)).toBe((32 + 8) * 2);
  });

  /** A batch of B × T token ids, every one attended, in a new folder. */
  async function peakBatch(B: number, T: number): Promise<{ dir: string; batch: string }> {
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
    return { dir, batch };
  }
  /** The trainer's peaks in bytes: score's JSON lines on stdout, sft's in its --metrics file. */
  const peaks = (args: string[], metrics?: string): number[] => {
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
  /** sft's second step's peak (its first allocates what the second reuses). */
  const sftPeak = (dir: string, batch: string, name: string, flags: string[]) => {
    const metrics = join(dir, `${name}.jsonl`);
    const out = join(dir, name);
    const steps = peaks(
      ["sft", "--data", batch, "--out", out, "--steps", "2", "--metrics", metrics, ...flags],
      metrics,
    );
    return { peak: steps[1] ?? 0, out };
  };

  // What the trainer really holds: score's peak, less the fp32 weights; sft's second step's,
  // less the weights, gradients and AdamW moments (16 bytes a float). The peaks are printed
  // in MiB with 3 decimals: equal to within that rounding (524 bytes). Three shapes: one
  // row, a few, and more rows than the CPU's logits chunk (256).
  it.each([
    [3, 40],
    [1, 23],
    [4, 80],
  ])(
    "the fixture, %i × %i tokens: the trainer's measured peaks, forward and backward, with and without recompute",
    async (B, T) => {
      const { dir, batch } = await peakBatch(B, T);
      const plan = sizes(readPlanModel(modelDir("untied")), { device: "cpu", tokens: [B * T] });
      const pass = passOf(plan, B * T);
      const learnt = plan.learner[0];
      const out = join(dir, "out.safetensors");
      const [scored] = peaks(["score", "--batch", batch, "--out", out, "--repeat", "1"]);
      expect(Math.abs((scored ?? 0) - learnt.weights - pass.forward)).toBeLessThanOrEqual(524);
      for (const recompute of [false, true]) {
        const { peak } = sftPeak(dir, batch, `sft-${recompute}`, recompute ? ["--recompute"] : []);
        const held = learnt.weights + learnt.gradients + learnt.optimizer;
        const acts = recompute ? pass.backwardRecompute : pass.backward;
        expect(Math.abs(peak - held - acts)).toBeLessThanOrEqual(524);
      }
    },
  );

  // With LoRA adapters (sft --lora-rank, then score --lora with the adapter folder sft
  // wrote): the frozen base's fp32 compute copy, the adapters' fp32 weights, gradients and
  // AdamW moments (the plan's lora.learner: Learner::planned with lora_layout), and the
  // pass's activations plus the adapters' scratch at its rows (lora_scratch). Three ranks and
  // module sets at the three shapes.
  it.each([
    [3, 40, 4, "all-linear", 128],
    [1, 23, 2, "q_proj,down_proj", 64],
    [4, 80, 8, "k_proj,v_proj,o_proj,gate_proj,up_proj", 128],
  ])(
    "the fixture, %i × %i tokens, LoRA rank %i on %s: the measured peaks",
    async (B, T, rank, targets, widest) => {
      const { dir, batch } = await peakBatch(B, T);
      const plan = sizes(readPlanModel(modelDir("untied")), {
        device: "cpu",
        tokens: [B * T],
        lora: { rank, targets: targets === "all-linear" ? targets : targets.split(",") },
      });
      const pass = passOf(plan, B * T);
      const lora = plan.lora;
      if (!lora) throw new Error("plan --lora-rank gave no lora sizes");
      const l = lora.learner[0];
      const [scratch] = lora.scratch;
      // On the CPU the adapters' fp32 buffer is their compute copy: 4 bytes a float each of
      // weights, gradients and the two moments; the base adds no masters of its own.
      expect([l.masters, l.gradients, l.optimizer]).toEqual([
        4 * lora.floats,
        4 * lora.floats,
        8 * lora.floats,
      ]);
      expect(l.weights).toBe(plan.learner[0].weights);
      // A x and its gradient (rank values a row) and one module's output, the widest
      // targeted: the fixture's hidden size 64, its intermediate size 128 (gate_proj, up_proj).
      expect(scratch).toBe(4 * B * T * (2 * rank + widest));
      let adapter = "";
      for (const recompute of [false, true]) {
        const flags = ["--lora-rank", String(rank), "--lora-targets", targets];
        const { peak, out } = sftPeak(dir, batch, `lora-${recompute}`, [
          ...flags,
          ...(recompute ? ["--recompute"] : []),
        ]);
        const held = l.weights + l.masters + l.gradients + l.optimizer;
        const acts = recompute ? pass.backwardRecompute : pass.backward;
        expect(Math.abs(peak - held - acts - (scratch ?? 0))).toBeLessThanOrEqual(524);
        adapter = out;
      }
      const out = join(dir, "scored.safetensors");
      const [scored] = peaks([
        "score",
        "--batch",
        batch,
        "--out",
        out,
        "--repeat",
        "1",
        "--lora",
        adapter,
      ]);
      expect(
        Math.abs((scored ?? 0) - l.weights - l.masters - pass.forward - (scratch ?? 0)),
      ).toBeLessThanOrEqual(524);
    },
  );
});

describe("searchr1-trainer plan: the engine (cli/engine/main.cpp)", () => {
  // searchr1-engine sets its step's buffers aside before sizing its KV cache and says how
  // many bytes and blocks in its ready event; on the CPU (fp32) for a fixture model, with the
  // block tables counted.
  it("its step's buffers are what the engine reports, to the byte", () => {
    const dir = "test/engine/fixtures/qwen-hd16";
    const r = spawnSync(
      nativeExecutable("searchr1-engine"),
      ["--model", dir, "--device", "cpu", "--threads", "1"],
      { input: '{"op":"shutdown"}\n', encoding: "utf8" },
    );
    expect(r.status, r.stderr).toBe(0);
    const ready = JSON.parse(r.stdout.split("\n")[0] as string) as Record<string, number>;
    const plan = modelBytes({
      dir,
      head: "lm",
      device: "cpu",
      ranks: 1,
      offload: NO_OFFLOAD,
      tokens: [],
      engine: { deviceGiB: 1, utilization: 0.5 },
    });
    expect(plan.engine).toMatchObject({
      chunkTokens: ready.chunk_tokens,
      maxRunning: ready.max_running,
      contextLength: ready.context_length,
      blockSize: ready.block_size,
      step: ready.step_buffer_bytes,
    });
  });
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
  // 11 × 256 = 2816 floats and a shard is 1408; stage 2 holds no gradient between updates,
  // and during its updates the shard and two buckets (the embeddings' 256 and a layer's
  // 1024, wider than the final norm's 512 with the head and padding): 4 × 2688.
  // Activations (the counts above, x = 2; the head's chunk of 2,048 rows cut to the 10): the
  // update 2730 × 2 + 90 × 4 + 50 × 4 = 6020 (recompute), during the actor's update alone; the
  // log-prob pass 1610 × 2 + 70 × 4 + 50 × 4 = 3700, the actor's and the reference's, each
  // during its own command (the trainer runs one at a time and frees its activations after
  // it). The trainer's backend: 32 MiB + the attention's backward scratch 8 × 10 + 4 × 10 ×
  // (8 + 2) = 480. The engine: its weights; the buffers of its largest step (8192 + 256 = 8448
  // rows × (3·8 + 16 + 8 + 3·16) bf16, a 64-row head chunk of 8 + 32 bf16, 8448 × 4 bytes of
  // rstd and 5 × 8448 ints: 1,829,888 bytes; and block tables of 256 sequences × 2,048 columns
  // for a context of 32,768: 2 MiB); the workspace; and its KV cache: what is left of
  // 0.5 × 1 GiB, but no more than 256 sequences of full context use, 256 × 2,049 blocks of
  // 2 × 2 layers × 16 positions × 4 × 2 bytes = 268,566,528 (as kv_budget.cpp caps it).
  const input = (release: boolean): PlanInput => ({
    policy: SMALL,
    critic: null,
    reference: true,
    ranks: 2,
    stage: 2,
    device: "cuda",
    recompute: true,
    tokens: { update: 10, logProbs: 10, criticUpdate: 10, values: 10 },
    engine: { utilization: 0.5, release },
    deviceBytes: GiB,
    trajectoryTokens: 10,
  });
  const MiB32 = 32 * 2 ** 20;
  const STEP = 1829888 + 2 * 2 ** 20;
  const KV = 256 * 2049 * 512;
  const ENGINE = 5376 + KV + STEP + MiB32;

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
      ["actor", ...all(10752, 11264, 0)],
      ["actor", zero, zero, [0, 0, 10752]],
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
    // Held throughout at stage 0 and 1; at stage 2 the gradients in the actor's updates only.
    const held0 = 5376 + 10752 + 21504 + 10752 + 5376 + MiB32 + 480 + ENGINE;
    const held1 = 5632 + 5632 + 11264 + 11264 + 5376 + MiB32 + 480 + ENGINE;
    const rollout = [held0, held1, held1 - 11264];
    const update = [held0 + 6020, held1 + 6020, held1 - 11264 + 10752 + 6020];
    expect(plan.totals).toEqual({
      rollout,
      logProbs: rollout.map((t) => t + 3700),
      update,
      peak: update,
      host: [0, 0, 0],
    });
    expect(fitsAt(plan, 2)).toEqual({ fits: true, margin: GiB - (update[2] as number) });
    expect(plan.engineRefuses).toBe(false);
  });

  it("an engine that gives its KV cache (and its step's buffers) back while the trainer works", () => {
    const plan = memoryPlan(input(true));
    const kv = plan.rows.find((r) => r.part === "engine" && r.item.startsWith("KV cache"));
    expect(kv).toMatchObject({ rollout: [KV, KV, KV], update: [0, 0, 0] });
    expect(kv?.item).toContain(`${(KV / 512) * 16}`.replace(/\B(?=(\d{3})+$)/g, ","));
    const step = plan.rows.find((r) => r.part === "engine" && r.item.startsWith("buffers"));
    expect(step).toMatchObject({ rollout: [STEP, STEP, STEP], update: [0, 0, 0] });
    const kept = memoryPlan(input(false));
    expect(plan.totals.rollout).toEqual(kept.totals.rollout);
    expect(plan.totals.update).toEqual(kept.totals.update.map((t) => t - KV - STEP));
    // Stage 2: the rollouts hold the KV cache, the updates the gradients (10752 < KV).
    expect(plan.totals.peak[2]).toBe(plan.totals.rollout[2]);
  });

  it("ref.param_offload: the reference on the device during its log-probs only", () => {
    const kept = memoryPlan(input(false));
    const off = memoryPlan({ ...input(false), referenceOffload: true });
    const refs = (p: typeof kept) => p.rows.filter((r) => r.part === "reference");
    for (const [a, b] of refs(kept).map((r, i) => [r, refs(off)[i]] as const)) {
      expect(b).toMatchObject({ rollout: [0, 0, 0], update: [0, 0, 0], logProbs: a.logProbs });
    }
    // Its weights, during its own command: with its activations, one command of the
    // log-probs (the actor's holds only activations).
    expect(off.totals.rollout).toEqual(kept.totals.rollout.map((t) => t - 5376));
    expect(off.totals.update).toEqual(kept.totals.update.map((t) => t - 5376));
    expect(off.totals.logProbs).toEqual(kept.totals.logProbs);
  });

  // actor.*_offload (native/src/train/learner.h): with all three, the masters (4 × 2688 |
  // 1408 | 1408) and moments (8 × the same) go to host memory; the gradient too, to a host
  // copy of the shard (4 × 2688 | 1408 | 1408), so the device holds none between updates
  // and during its updates the whole buffer (stage 0 and 1: 4 × 2688 | 2816) or at stage 2
  // the buckets (4 × (256 + 1024)); the compute copy (2 × 2688 | 2816 | 2816) is on the
  // device during the actor's own commands only. Host lines count in no device total.
  it("actor offloads: their bytes leave the device totals for host memory lines", () => {
    const kept = memoryPlan(input(false));
    const all: Offload = { param: true, grad: true, optimizer: true };
    const off = memoryPlan({ ...input(false), actorOffload: all });
    const minus = (t: number[], d: number[]) => t.map((x, s) => x - (d[s] ?? 0));
    // The masters and moments leave every moment; the weights and the gradients kept between
    // updates leave the rollouts, and the log-probs but for the weights, which the actor's
    // log-probs bring back (with its activations, the largest command there).
    const masters = [10752 + 21504, 5632 + 11264, 5632 + 11264];
    expect(off.totals.rollout).toEqual(
      minus(kept.totals.rollout, [
        masters[0] + 5376 + 10752,
        masters[1] + 5632 + 11264,
        masters[2] + 5632,
      ]),
    );
    expect(off.totals.logProbs).toEqual(
      minus(kept.totals.logProbs, [masters[0] + 10752, masters[1] + 11264, masters[2]]),
    );
    // The updates: stage 2 keeps the buckets (4 × 1280 = 5120) but not the shard.
    expect(off.totals.update).toEqual(
      minus(kept.totals.update, [masters[0], masters[1], masters[2] + 10752 - 5120]),
    );
    // The weights, masters, moments and the gradient's host copy.
    expect(off.totals.host).toEqual([
      5376 + 10752 + 21504 + 10752,
      5632 + 5632 + 11264 + 5632,
      5632 + 5632 + 11264 + 5632,
    ]);
    const host = off.rows.filter((r) => r.host);
    expect(host.map((r) => r.item)).toEqual([
      "weights (bf16 compute copy) between its commands",
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

  // With param offload every model's compute copy is on the device during its own commands
  // alone: a moment holds the largest command's, not all of them.
  it("offloaded models: a moment counts the largest command, not every model at once", () => {
    const all: Offload = { param: true, grad: true, optimizer: true };
    const ppo: PlanInput = {
      ...input(false),
      critic: SMALL,
      referenceOffload: true,
      actorOffload: all,
      criticOffload: all,
    };
    const plan = memoryPlan(ppo);
    const critic = plan.sizes.critic?.learner[2] as LearnerBytes;
    const actor = plan.sizes.policy.learner[2] as LearnerBytes;
    const held = MiB32 + 480 + ENGINE;
    expect(plan.totals.rollout[2]).toBe(held);
    // Log-probs: the actor's, the reference's (5376 + 3700 each, the policy's sizes) or the
    // critic's values (its compute copy and its forward pass), the largest.
    const values = critic.weights + passOf(plan.sizes.critic ?? plan.sizes.policy, 10).forward;
    expect(plan.totals.logProbs[2]).toBe(
      held + Math.max(actor.weights + 3700, 5376 + 3700, values),
    );
    // Updates: the actor's (compute copy, buckets, activations) or the critic's.
    const criticUpdate =
      critic.weights +
      critic.gradients +
      passOf(plan.sizes.critic ?? plan.sizes.policy, 10).backwardRecompute;
    expect(plan.totals.update[2]).toBe(held + Math.max(actor.weights + 5120 + 6020, criticUpdate));
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
    expect(plan.sizes.policy.engine?.refused).toMatch(/--gpu-memory-utilization 0\.1/);
  });
});

describe("searchr1 train --dry-run", () => {
  // Qwen2.5-7B's config.json (native.md §2.2), 8 GPUs, GRPO, the v0.2 recipe's settings with
  // one trajectory per micro-batch: printed, nothing started, nothing written.
  it("prints the plan of one device and whether it fits; writes nothing", () => {
    const dir = tempDir();
    const model = writeModelConfig(join(dir, "Qwen2.5-7B"), QWEN_CONFIGS["Qwen/Qwen2.5-7B"]);
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
      /reference weights \(bf16 compute copy\), on the device during its log-probs only +14\.19/,
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

  // Issue 42: with LoRA the learner is the frozen base's bf16 copy and the adapters' fp32
  // state, and the reference is the policy with its adapters off: 7B GRPO on ONE GPU.
  // PPO with LoRA: the actor's adapters and a fully trained critic, whose state null shards
  // over several ranks (stage 2); without PPO's critic null stays 0 with LoRA.
  it("PPO with LoRA on 8 GPUs: the critic's full state, ZeRO stage 2 by default", () => {
    const dir = tempDir();
    const model = writeModelConfig(join(dir, "Qwen2.5-7B"), QWEN_CONFIGS["Qwen/Qwen2.5-7B"]);
    const dryRun = (extra: string[]) =>
      runCli([
        "train",
        "--model",
        model,
        "--gpus",
        "8",
        "--dry-run",
        "--device-memory",
        "80",
        `trainer.output_dir=${join(dir, "runs")}`,
        "model.lora_rank=32",
        "actor.grad_offload=false",
        "actor.optimizer_offload=false",
        "ref.param_offload=false",
        ...extra,
      ]);
    const ppo = dryRun(["algorithm.name=ppo"]);
    expect(ppo.code, ppo.stderr).toBe(0);
    expect(ppo.stdout).toContain("ZeRO stage 2 (trainer.zero_stage null: 2 on several ranks)");
    expect(ppo.stdout).toMatch(/^critic +AdamW moments \(fp32 m, v\)/m);
    expect(ppo.stdout).toMatch(/^actor +LoRA adapters: AdamW moments/m);
    const grpo = dryRun(["algorithm.name=grpo"]);
    expect(grpo.code, grpo.stderr).toBe(0);
    expect(grpo.stdout).toContain("ZeRO stage 0 (trainer.zero_stage null: 0 with LoRA)");
    // Adapters on the critic too: its frozen base and adapters, nothing left to shard.
    const both = dryRun(["algorithm.name=ppo", "critic.lora_rank=16"]);
    expect(both.code, both.stderr).toBe(0);
    expect(both.stdout).toContain("ZeRO stage 0 (trainer.zero_stage null: 0 with LoRA)");
    expect(both.stdout).toMatch(/^critic +LoRA rank 16 adapters and the value head: fp32 weights/m);
    expect(both.stdout).toMatch(/^critic +weights \(bf16 compute copy, frozen\)/m);
    expect(both.stdout).not.toMatch(/^critic +AdamW moments \(fp32 m, v\)/m);
    expect(both.stdout).toMatch(/the critic's LoRA rank 16 on all-linear: [\d,]+ floats/);
  });

  it("Qwen2.5-7B GRPO with LoRA rank 32 fits one 80 GB GPU beside its engine", () => {
    const dir = tempDir();
    const model = writeModelConfig(join(dir, "Qwen2.5-7B"), QWEN_CONFIGS["Qwen/Qwen2.5-7B"]);
    const r = runCli([
      "train",
      "--config",
      "templates/configs/search-r1-v0.2-grpo.yaml",
      "--model",
      model,
      "--gpus",
      "1",
      "--dry-run",
      "--device-memory",
      "80",
      `trainer.output_dir=${join(dir, "runs")}`,
      "model.lora_rank=32",
      "model.lora_alpha=64",
      "actor.ppo_micro_batch_size_per_gpu=1",
      "rollout.log_prob_micro_batch_size_per_gpu=1",
      "actor.param_offload=false",
      "actor.grad_offload=false",
      "actor.optimizer_offload=false",
      "ref.param_offload=false",
    ]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/ZeRO stage 0 \(trainer\.zero_stage null: 0 with LoRA\)/);
    // The base: 7,615,616,512 × 2 bytes = 14.19 GiB, frozen; no fp32 masters, moments or
    // gradients of it, and no reference copy.
    expect(r.stdout).toMatch(/actor +weights \(bf16 compute copy, frozen\) +14\.19 /);
    expect(r.stdout).not.toMatch(/actor +fp32 master weights/);
    expect(r.stdout).not.toMatch(/reference weights/);
    // Rank 32 on q/k/v/o/gate/up/down of 28 layers: 28 × 32 × (3584 + 3584 + 3584 + 512 +
    // 3584 + 512 + 3584 + 3584 + 3584 + 18944 + 3584 + 18944 + 18944 + 3584) = 80,740,352
    // floats, 1.06 % of the parameters: 0.30 GiB of fp32 weights (+ 0.15 their bf16 copy),
    // 0.60 of moments, 0.30 of gradients.
    expect(r.stdout).toMatch(
      /LoRA rank 32 on all-linear: 80,740,352 adapter floats \(1\.06 % of the parameters\)/,
    );
    expect(r.stdout).toMatch(
      /actor +LoRA rank 32 adapters: fp32 weights and their bf16 copy +0\.45 /,
    );
    expect(r.stdout).toMatch(/actor +LoRA adapters: AdamW moments \(fp32 m, v\) +0\.60 /);
    expect(r.stdout).toMatch(/^fits 80\.00 GiB at ZeRO stage 0/m);
  });
});
