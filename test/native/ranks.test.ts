// Data-parallel trainer ranks (native/src/train/SERVE.md, "Several ranks"): two
// `searchr1-trainer serve --rank R --world-size 2` processes, driven from here with the same
// commands, stand in for two GPUs (CPU ranks over Gloo) and are checked against one rank on
// the same batches:
//  - log_probs and values: each rank computes its rows and rank 0 writes every row;
//  - update_actor and update_critic: the replies (every rank's the same) and the exported
//    weights after three updates, within the tolerances below;
//  - save_checkpoint from two ranks resumes on one rank;
//  - ZeRO stage 1 and 2 (the optimizer state, and at stage 2 the gradients, sharded over the
//    ranks) give stage 0's run, hold half the optimizer state a rank, and their checkpoints
//    resume on one rank and on two (2 → 1, 1 → 2; and 3 → 2);
//  - a stuck rank makes the other's collective fail after the timeout, a killed rank at once,
//    each naming the collective; neither hangs.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { modelBytes, NO_OFFLOAD } from "../../src/planning/native-sizes.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { ServeProcess } from "../helpers/serve-process.js";
import {
  CPU,
  FIXTURES,
  get,
  gpuStatus,
  maxAbsDiff,
  modelDir,
  readFloats,
  rolloutBatch,
  sameBits,
  tempDir,
  writeBatchFile,
} from "./helpers.js";
import { Ranks } from "./trainer-ranks.js";

const { gpu } = gpuStatus("ranks.test.ts");
const POLICY = modelDir("untied");
const CRITIC = join(FIXTURES, "critic-untied");

// 8 sequences of different lengths (right padding), prompt then response, with a hole in the
// response mask of every other one; token ids and advantages from a fixed generator.
const B = 8;
const T = 24;
const LENGTHS = [24, 9, 17, 12, 21, 7, 15, 19];
const PROMPTS = [4, 3, 5, 3, 6, 2, 4, 3];

const advantages = new Float32Array(B * T);
const returns = new Float32Array(B * T);
const { ids, attention, response, tensor } = rolloutBatch({
  T,
  lengths: LENGTHS,
  prompts: PROMPTS,
  seed: 31,
  holeLength: 2,
  perToken: (b, i, rand) => {
    advantages[i] = (b % 3 === 0 ? -1 : 1) * (0.3 + rand());
    returns[i] = rand() - 0.5;
  },
});

const inputs = () =>
  writeBatchFile([tensor("input_ids", ids), tensor("attention_mask", attention)]);

/** update_actor's batch file: the rollout with these old and reference log-probs. */
const actorBatchFile = (old: Float32Array, ref: Float32Array) =>
  writeBatchFile([
    tensor("input_ids", ids),
    tensor("attention_mask", attention),
    tensor("response_mask", response),
    tensor("old_log_probs", old),
    tensor("ref_log_probs", ref),
    tensor("advantages", advantages),
  ]);

/** update_critic's batch file: the rollout with these old values. */
const criticBatchFile = (values: Float32Array) =>
  writeBatchFile([
    tensor("input_ids", ids),
    tensor("attention_mask", attention),
    tensor("response_mask", response),
    tensor("values", values),
    tensor("returns", returns),
  ]);

/** A per-token output of log_probs or values, as written by rank 0. */
async function output(r: Ranks, op: string, fields: Record<string, unknown>, name: string) {
  const out = join(tempDir(), `${op}.safetensors`);
  await r.ok(op, { ...fields, out });
  return get(await readFloats(out), name);
}

const LOAD = {
  policy: POLICY,
  reference: POLICY,
  critic: CRITIC,
  seed: 7,
  actor_optim: { lr: 1e-3, lr_schedule: "cosine", warmup_steps: 1, total_steps: 12 },
  critic_optim: { lr: 1e-3 },
};
// Two shuffled mini-batches of 4 sequences per update, each rank's rows cut by the budget.
const BATCHING = { ppo_mini_batch_size: 4, ppo_max_token_len_per_gpu: 40 };
const ACTOR = { ...BATCHING, kl_loss_coef: 0.01, entropy_coeff: 0.01 };

/**
 * What one run of `size` ranks at ZeRO stage `zero` gives: outputs, three updates of each
 * learner, weights, a checkpoint, then one more update of each (`continued`, what a resumed
 * run must reproduce).
 */
async function run(size: number, flags: string[] = CPU, zero = 0) {
  const r = new Ranks(size, 60, flags);
  // Stage 0 leaves the field out: its default.
  const loaded = await r.ok("load", zero > 0 ? { ...LOAD, zero_stage: zero } : LOAD);
  const batch = await inputs();
  const lp = await output(r, "log_probs", { batch }, "log_probs");
  const grouped = await output(r, "log_probs", { batch, micro_batch_size: 3 }, "log_probs");
  const values = await output(r, "values", { batch }, "values");
  const old = lp.map((x, i) => x + 0.4 * Math.sin(i)); // off the policy: some ratios clip
  const actorBatch = await actorBatchFile(old, lp);
  const criticBatch = await criticBatchFile(values);
  const actor: Record<string, unknown>[] = [];
  const critic: Record<string, unknown>[] = [];
  for (let k = 0; k < 3; k++) {
    actor.push(await r.ok("update_actor", { batch: actorBatch, ...ACTOR }));
    critic.push(await r.ok("update_critic", { batch: criticBatch, ...BATCHING }));
  }
  const exported = join(tempDir(), "export");
  await r.ok("export", { out: exported, dtype: "fp32" });
  const weights = await readFloats(join(exported, "model.safetensors"));
  const checkpoint = join(tempDir(), "ckpt");
  await r.ok("save_checkpoint", { dir: checkpoint });
  const after = await output(r, "log_probs", { batch }, "log_probs");
  const batches = { actor: actorBatch, critic: criticBatch };
  const continued = await continueRun(r, batches);
  expect(await r.close()).toEqual(Array(size).fill(0));
  const bytes = readFileSync(join(exported, "model.safetensors"));
  return {
    lp,
    grouped,
    values,
    actor,
    critic,
    weights,
    bytes,
    exported,
    checkpoint,
    after,
    loaded,
    batches,
    continued,
  };
}

/** One more update of each learner on the run's batches; the replies and the fp32 weights. */
async function continueRun(r: Ranks, batches: { actor: string; critic: string }) {
  const actor = await r.ok("update_actor", { batch: batches.actor, ...ACTOR });
  const critic = await r.ok("update_critic", { batch: batches.critic, ...BATCHING });
  const out = join(tempDir(), "continued");
  await r.ok("export", { out, dtype: "fp32" });
  return { actor, critic, weights: await readFloats(join(out, "model.safetensors")) };
}

describe("two CPU ranks give the run of one", () => {
  let one: Awaited<ReturnType<typeof run>>;
  let two: Awaited<ReturnType<typeof run>>;
  beforeAll(async () => {
    one = await run(1);
    two = await run(2);
  }, 300_000);

  // A rank packs its own rows (4 of the 8 here) into one row for the forward pass, where one
  // rank packs all 8 (or, with micro_batch_size 3, groups 3 + 1 of its rows where one rank
  // groups 3 + 3 + 2): each sequence still attends only to itself, but the matmuls run on
  // other shapes (the CPU backend multiplies up to 32 rows, and the last chunk of the logits,
  // with `dots` instead of sgemm), so the rounding may differ. Measured: log_probs of the
  // whole batch bit for bit the same; in groups of 3, at most 1.9e-6 (2 ulps of log-probs
  // near -10); values at most 6e-8. Allowed 1e-5, what serve.test.ts allows between two
  // groupings on one rank.
  it("log_probs and values: every row, within fp32 rounding of the packing", () => {
    expect(maxAbsDiff(two.lp, one.lp)).toBeLessThan(1e-5);
    expect(maxAbsDiff(two.grouped, one.grouped)).toBeLessThan(1e-5);
    expect(maxAbsDiff(two.values, one.values)).toBeLessThan(1e-5);
    two.lp.forEach((x, i) => {
      if (i % T === 0 || attention[i] === 0n) expect(x, `position ${i}`).toBe(0);
      else expect(x, `position ${i}`).toBeLessThan(0);
    });
  });

  // Each rank sums the gradient of its rows, and the ranks' sums are added: another order of
  // fp32 additions than one rank's, and other matmul shapes (as above). The metrics are sums
  // over the same tokens of per-token terms that differ by that rounding. Measured after 3
  // updates of each learner (6 optimizer steps; the actor's cosine schedule over 12): at most
  // 4.1e-7 of max(|value|, 1) (pg_clipfrac and vf_clipfrac equal); allowed 1e-5.
  // tokens, lr, optimizer_steps and global_step are equal; micro_batches counts both ranks'
  // (each rank cuts its own rows by the token budget, as verl's per-GPU budget does).
  it("update_actor and update_critic: the same metrics within rounding", () => {
    const close = (a: Record<string, unknown>, b: Record<string, unknown>, keys: string[]) => {
      for (const k of keys) {
        const [x, y] = [a[k] as number, b[k] as number];
        expect(Math.abs(x - y), `${k}: ${x} vs ${y}`).toBeLessThanOrEqual(
          1e-5 * Math.max(Math.abs(x), 1),
        );
      }
    };
    for (const [a, b] of one.actor.map((x, k) => [x, two.actor[k]] as const)) {
      if (!b) throw new Error("missing reply");
      close(a, b, ["pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "kl_loss", "grad_norm"]);
      for (const k of ["tokens", "lr", "optimizer_steps", "global_step"]) expect(b[k]).toBe(a[k]);
      expect(b.micro_batches as number).toBeGreaterThanOrEqual(2 * (b.optimizer_steps as number));
    }
    expect(one.actor.some((m) => (m.pg_clipfrac as number) > 0)).toBe(true);
    for (const [a, b] of one.critic.map((x, k) => [x, two.critic[k]] as const)) {
      if (!b) throw new Error("missing reply");
      close(a, b, ["vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm"]);
      for (const k of ["lr", "optimizer_steps", "global_step"]) expect(b[k]).toBe(a[k]);
      expect(b.micro_batches as number).toBeGreaterThanOrEqual(2 * (b.optimizer_steps as number));
    }
  });

  // The ranks hold the same weights (they apply the same summed gradient), and those differ
  // from one rank's by the rounding of the gradient sum carried through AdamW, which divides
  // each entry by its running magnitude: an entry whose gradient is near 0 can move by up to
  // lr a step where rounding changes its sign (this batch has none); elsewhere the difference
  // is a few ulps. Measured after 6 optimizer steps at lr up to 1e-3: at most 1.4e-6, 0.0007%
  // of the entries beyond 1e-6. Allowed: every entry within 1e-4 (a tenth of one step's lr),
  // at most 0.1% of them beyond 1e-6.
  it("the exported weights after three updates: within AdamW's amplification of rounding", () => {
    let worst = 0;
    let beyond = 0;
    let count = 0;
    for (const [name, w1] of one.weights) {
      const w2 = get(two.weights, name);
      worst = Math.max(worst, maxAbsDiff(w1, w2));
      for (let i = 0; i < w1.length; i++) {
        if (Math.abs((w1[i] ?? 0) - (w2[i] ?? 0)) > 1e-6) beyond++;
      }
      count += w1.length;
    }
    expect(worst).toBeLessThanOrEqual(1e-4);
    expect(beyond / count).toBeLessThan(1e-3);
    // The run moved the weights well beyond that.
    const before = readFileSync(join(POLICY, "model.safetensors"));
    expect(readFileSync(join(two.exported, "model.safetensors")).equals(before)).toBe(false);
  });

  it("a checkpoint saved by two ranks resumes on one, and on two, with the same weights", async () => {
    for (const size of [1, 2]) {
      const r = new Ranks(size);
      await r.ok("load", { ...LOAD, seed: 99 });
      expect(await r.ok("load_checkpoint", { dir: two.checkpoint })).toEqual({ global_step: 6 });
      const lp = await output(r, "log_probs", { batch: await inputs() }, "log_probs");
      expect(await r.close()).toEqual(Array(size).fill(0));
      // One rank computes every row as two ranks' rank 0 wrote them after the save: the same
      // weights, within the packing's rounding (above); two ranks, bit for bit.
      if (size === 2) expect(sameBits(lp, two.after)).toBe(true);
      else expect(maxAbsDiff(lp, two.after)).toBeLessThan(1e-5);
    }
  });
});

type Run = Awaited<ReturnType<typeof run>>;
type Weights = Map<string, Float32Array>;

/** The largest difference between two sets of weights, and the share of entries beyond 1e-6. */
function weightDiff(a: Weights, b: Weights): { worst: number; beyond: number } {
  let worst = 0;
  let beyond = 0;
  let count = 0;
  for (const [name, w1] of a) {
    const w2 = get(b, name);
    worst = Math.max(worst, maxAbsDiff(w1, w2));
    for (let i = 0; i < w1.length; i++) {
      if (Math.abs((w1[i] ?? 0) - (w2[i] ?? 0)) > 1e-6) beyond++;
    }
    count += w1.length;
  }
  return { worst, beyond: beyond / count };
}

/** The largest difference of the metrics `keys` relative to max(|value|, 1). */
function metricDiff(a: Record<string, unknown>, b: Record<string, unknown>, keys: string[]) {
  let worst = 0;
  for (const k of keys) {
    const [x, y] = [a[k] as number, b[k] as number];
    worst = Math.max(worst, Math.abs(x - y) / Math.max(Math.abs(x), 1));
  }
  return worst;
}
const ACTOR_METRICS = ["pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "kl_loss", "grad_norm"];
const CRITIC_METRICS = ["vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm"];

/** `size` ranks at stage `zero` resume `from`'s checkpoint and take its fourth updates. */
async function resume(from: Run, size: number, zero: number, flags: string[] = CPU) {
  const r = new Ranks(size, 60, flags);
  await r.ok("load", { ...LOAD, seed: 99, zero_stage: zero });
  expect(await r.ok("load_checkpoint", { dir: from.checkpoint })).toEqual({ global_step: 6 });
  const continued = await continueRun(r, from.batches);
  expect(await r.close()).toEqual(Array(size).fill(0));
  return continued;
}

// ZeRO (native/src/train/learner.h): from stage 1 on each rank keeps the AdamW moments (and,
// on CUDA, the fp32 masters) of one contiguous shard of the flat parameter buffer, padded so
// that both ranks' shards are equally long; stage 2 reduces each backward pass's gradient
// region by region onto the ranks whose shards hold it instead of all-reducing the whole
// gradient once. Compared here with stage 0 on the same two ranks, which computes the same
// gradient sums: two values added in either order give the same float, and each rank makes
// one pass per mini-batch here, so the reduced gradients are the same bits; the AdamW update is element-wise, the same arithmetic on a
// shard as on the whole buffer. What differs is the global gradient norm, summed in double
// as two shard sums instead of one: the grad_norm metrics differ in their last bits, and so
// could the clip factor (every step here clips: grad_norm is above grad_clip 1), one float
// ulp, once in a while. Measured after 8 optimizer steps of each learner: the weights the
// same bits at stages 1 and 2, the metrics within 1.7e-14 of max(|value|, 1). Allowed: the
// metrics 1e-12; the weights 1e-6 (a clip factor one ulp off moves a weight by ~1e-10; a
// shard updated at the wrong place or not at all moves it by up to lr = 1e-3).
describe("ZeRO stage 1 and 2 on two CPU ranks: the optimizer sharded, the run stage 0's", () => {
  let zero0: Run;
  let zero1: Run;
  let zero2: Run;
  beforeAll(async () => {
    zero0 = await run(2);
    zero1 = await run(2, CPU, 1);
    zero2 = await run(2, CPU, 2);
  }, 300_000);

  it("the same metrics and weights as stage 0", () => {
    for (const z of [zero1, zero2]) {
      z.actor.forEach((m, k) => {
        expect(metricDiff(m, zero0.actor[k] ?? {}, ACTOR_METRICS)).toBeLessThan(1e-12);
        for (const key of ["tokens", "lr", "optimizer_steps", "micro_batches", "global_step"])
          expect(m[key]).toBe(zero0.actor[k]?.[key]);
      });
      z.critic.forEach((m, k) => {
        expect(metricDiff(m, zero0.critic[k] ?? {}, CRITIC_METRICS)).toBeLessThan(1e-12);
      });
      expect(metricDiff(z.continued.actor, zero0.continued.actor, ACTOR_METRICS)).toBeLessThan(
        1e-12,
      );
      expect(weightDiff(z.weights, zero0.weights).worst).toBeLessThanOrEqual(1e-6);
      expect(weightDiff(z.continued.weights, zero0.continued.weights).worst).toBeLessThanOrEqual(
        1e-6,
      );
      // The log-probs every rank computes after the updates: the all-gathered weights.
      expect(maxAbsDiff(z.after, zero0.after)).toBeLessThan(1e-6);
    }
    // The runs moved the weights well beyond that.
    expect(weightDiff(zero2.continued.weights, zero2.weights).worst).toBeGreaterThan(1e-4);
  });

  // What the load reply says each rank holds (Learner::Memory): with P parameters (the
  // flat buffer's floats) padded to C, a multiple of 2 ranks × 128, each rank's moments are
  // 2 × 4 × C/2 bytes from stage 1 on instead of 2 × 4 × P: half, but for the padding. On the
  // CPU the compute copy is fp32 and is the masters (master_weights 0); the reference keeps
  // nothing else either. At stage 2 the gradients are the shard and the backward's two
  // buckets, as the memory plan (src/planning/memory-plan.ts) computes them from the layout.
  // Without offload (test/native/offload.test.ts) nothing is in host memory.
  const NO_HOST = {
    host_weights: 0,
    host_master_weights: 0,
    host_optimizer_state: 0,
    host_gradients: 0,
  };
  it("each rank holds half the optimizer state; at stage 2 a gradient shard and buckets, none between updates", () => {
    const P = zero0.loaded.parameters as number;
    const C = Math.ceil(P / 256) * 256;
    const memory = (r: Run, model: string) =>
      (r.loaded.memory as Record<string, Record<string, number>>)[model] ?? {};
    expect(memory(zero0, "actor")).toEqual({
      weights: 4 * P,
      master_weights: 0,
      optimizer_state: 8 * P,
      gradients: 4 * P,
      gradients_between_updates: 4 * P,
      ...NO_HOST,
    });
    for (const [stage, z] of [
      [1, zero1],
      [2, zero2],
    ] as const) {
      expect(z.loaded.zero_stage).toBe(stage);
      expect(memory(z, "actor")).toEqual({
        weights: 4 * C,
        master_weights: 0,
        optimizer_state: 8 * (C / 2),
        gradients:
          stage === 2
            ? // What the plan says the shard and buckets take (searchr1-trainer plan).
              modelBytes({
                dir: POLICY,
                head: "lm",
                device: "cpu",
                ranks: 2,
                offload: NO_OFFLOAD,
                tokens: [],
              }).learner[2].gradients
            : 4 * C,
        gradients_between_updates: stage === 2 ? 0 : 4 * C,
        ...NO_HOST,
      });
      const halved =
        (memory(z, "actor").optimizer_state ?? 0) / (memory(zero0, "actor").optimizer_state ?? 1);
      expect(halved).toBeLessThan(0.502);
      const critic = memory(z, "critic").optimizer_state ?? 0;
      expect(critic / (memory(zero0, "critic").optimizer_state ?? 1)).toBeLessThan(0.502);
      expect(memory(z, "reference")).toEqual({
        weights: 4 * P,
        master_weights: 0,
        host_weights: 0,
      });
    }
  });

  // The checkpoint is one rank's layout at every stage (the moments gathered to rank 0, which
  // writes them whole); each rank of the resumed run reads its own range of them. Resumed on
  // the same ranks and stage, the fourth updates are the never-stopped run's bit for bit;
  // on one rank (and from one rank onto two), within the one-rank-vs-two tolerance of the
  // weights test above (measured, for this one step from the same state: the same weights,
  // the metrics within 1.3e-7 of max(|value|, 1)). The step moves the weights by up to 9e-4.
  it("a checkpoint of two sharded ranks resumes on one (2 → 1) and on two", async () => {
    const same = await resume(zero2, 2, 2);
    expect(same.actor).toEqual(zero2.continued.actor);
    expect(weightDiff(same.weights, zero2.continued.weights).worst).toBe(0);
    const one = await resume(zero2, 1, 0);
    expect(metricDiff(one.actor, zero2.continued.actor, ACTOR_METRICS)).toBeLessThan(1e-5);
    const d = weightDiff(one.weights, zero2.continued.weights);
    expect(d.worst).toBeLessThanOrEqual(1e-4);
    expect(d.beyond).toBeLessThan(1e-3);
  }, 120_000);

  it("a checkpoint of one rank resumes on two sharded ranks (1 → 2)", async () => {
    const single = await run(1);
    const two = await resume(single, 2, 2);
    expect(metricDiff(two.actor, single.continued.actor, ACTOR_METRICS)).toBeLessThan(1e-5);
    expect(metricDiff(two.critic, single.continued.critic, CRITIC_METRICS)).toBeLessThan(1e-5);
    const d = weightDiff(two.weights, single.continued.weights);
    expect(d.worst).toBeLessThanOrEqual(1e-4);
    expect(d.beyond).toBeLessThan(1e-3);
  }, 120_000);

  // Three ranks: the shards are padded to a multiple of 3 × 128 floats, and Gloo's reduce,
  // on a number of ranks that is not a power of two, may add the three ranks' gradients in
  // another order than its all-reduce: stage 2 is then stage 0 within the rounding of that
  // order, as two ranks are one rank (above). Allowed: the weights after 8 steps within
  // 1e-4, the metrics within 1e-5; resumed on two ranks, the next update within 1e-4.
  it("three ranks: stage 2 within rounding of stage 0, and its checkpoint resumes on two", async () => {
    const zero = await run(3);
    const sharded = await run(3, CPU, 2);
    const d = weightDiff(sharded.continued.weights, zero.continued.weights);
    expect(d.worst).toBeLessThanOrEqual(1e-4);
    expect(d.beyond).toBeLessThan(1e-3);
    expect(metricDiff(sharded.continued.actor, zero.continued.actor, ACTOR_METRICS)).toBeLessThan(
      1e-5,
    );
    const two = await resume(sharded, 2, 2);
    expect(weightDiff(two.weights, sharded.continued.weights).worst).toBeLessThanOrEqual(1e-4);
  }, 300_000);

  // Stage 2 reduces each backward pass as it goes, so the ranks must make as many passes as
  // each other. One mini-batch of all 8 rows over 3 ranks, balanced by tokens: rank 0 takes
  // the rows of 24, 12 and 9 tokens, rank 1 21, 15 and 7, rank 2 19 and 17; a budget of 10
  // tokens puts each row in a micro-batch of its own (no two fit), so rank 2 makes 2 passes
  // where the others make 3, and adds an empty one. Against stage 0 on the same ranks, within
  // the rounding of the other summation order (each pass over the ranks, then the passes).
  it("three ranks at stage 2 with unequal micro-batch counts: the rank with fewer makes empty passes", async () => {
    const batching = { ppo_mini_batch_size: 8, ppo_max_token_len_per_gpu: 10 };
    const updates = async (zero: number) => {
      const r = new Ranks(3);
      await r.ok("load", zero > 0 ? { ...LOAD, zero_stage: zero } : LOAD);
      const batch = await inputs();
      const lp = await output(r, "log_probs", { batch }, "log_probs");
      const values = await output(r, "values", { batch }, "values");
      const actorBatch = await actorBatchFile(lp, lp);
      const criticBatch = await criticBatchFile(values);
      const actor = await r.ok("update_actor", { batch: actorBatch, ...ACTOR, ...batching });
      const critic = await r.ok("update_critic", { batch: criticBatch, ...batching });
      const out = join(tempDir(), "export");
      await r.ok("export", { out, dtype: "fp32" });
      const weights = await readFloats(join(out, "model.safetensors"));
      expect(await r.close()).toEqual([0, 0, 0]);
      return { actor, critic, weights };
    };
    const [zero, sharded] = [await updates(0), await updates(2)];
    // The passes that had rows: 8, one per row, on either stage.
    expect(sharded.actor.micro_batches).toBe(8);
    expect(zero.actor.micro_batches).toBe(8);
    expect(metricDiff(sharded.actor, zero.actor, ACTOR_METRICS)).toBeLessThan(1e-5);
    expect(metricDiff(sharded.critic, zero.critic, CRITIC_METRICS)).toBeLessThan(1e-5);
    const d = weightDiff(sharded.weights, zero.weights);
    expect(d.worst).toBeLessThanOrEqual(1e-4);
    expect(d.beyond).toBeLessThan(1e-3);
  }, 120_000);

  it("zero_stage outside 0..2 is refused", async () => {
    const p = new ServeProcess(
      nativeExecutable("searchr1-trainer"),
      ["serve", ...CPU, "--threads", "1"],
      process.env,
    );
    expect(await p.fails("load", { ...LOAD, zero_stage: 3 })).toMatch(
      /'zero_stage' must be 0, 1 or 2, got 3/,
    );
    expect(await p.close()).toBe(0);
  });
});

// Several nodes (train --nnodes): export's node_outs has the first rank of each node
// (--local-rank 0) write that node's copy from its own whole weights. Two ranks standing for
// two nodes of one rank each: both folders written, the same bytes as one rank's `out`.
describe("export to every node (node_outs)", () => {
  it("each node's first rank writes its node's folder; bad fields are refused", async () => {
    const rendezvous = tempDir();
    const ranks = [0, 1].map(
      (r) =>
        new ServeProcess(
          nativeExecutable("searchr1-trainer"),
          [
            "serve",
            ...CPU,
            "--threads",
            "1",
            "--rank",
            String(r),
            "--world-size",
            "2",
            "--rendezvous",
            rendezvous,
            "--node",
            String(r),
            "--local-rank",
            "0",
          ],
          { ...process.env, OMP_NUM_THREADS: "1" },
        ),
    );
    const all = (op: string, fields: Record<string, unknown>) =>
      Promise.all(ranks.map((p) => p.ok(op, fields)));
    await all("load", { ...LOAD, zero_stage: 2 });
    const dir = tempDir();
    const outs = [join(dir, "node0"), join(dir, "node1")];
    await all("export", { node_outs: outs, dtype: "fp32" });
    await all("export", { out: join(dir, "one"), dtype: "fp32" });
    const bytes = (d: string) => readFileSync(join(d, "model.safetensors"));
    expect(bytes(outs[0] as string).equals(bytes(join(dir, "one")))).toBe(true);
    expect(bytes(outs[1] as string).equals(bytes(join(dir, "one")))).toBe(true);
    const refusals = await Promise.all(
      ranks.map((p) => p.fails("export", { node_outs: [outs[0]], dtype: "fp32" })),
    );
    // Rank 1's own error; rank 0 wrote, and says that a writer failed (no rank waits).
    expect(refusals[1]).toMatch(/'node_outs' names 1 folders, but this rank runs on node 1/);
    expect(refusals[0]).toMatch(/export failed on each node's first rank/);
    const both = await Promise.all(
      ranks.map((p) => p.fails("export", { out: join(dir, "x"), node_outs: outs })),
    );
    expect(both[0]).toMatch(/export: give 'out' or 'node_outs', not both/);
    expect(await Promise.all(ranks.map((p) => p.close()))).toEqual([0, 0]);
  }, 60_000);
});

// A library communicator of one rank runs every collective, each a sum over one rank: the
// identity, so the run is the local one bit for bit. On the CPU that is Gloo; on a GPU, NCCL
// (the only check of the NCCL path that one GPU allows).
describe("one rank through the library runs every collective and changes nothing", () => {
  const same = (a: Awaited<ReturnType<typeof run>>, b: Awaited<ReturnType<typeof run>>) => {
    expect(sameBits(b.lp, a.lp)).toBe(true);
    expect(sameBits(b.grouped, a.grouped)).toBe(true);
    expect(sameBits(b.values, a.values)).toBe(true);
    expect(b.actor).toStrictEqual(a.actor);
    expect(b.critic).toStrictEqual(a.critic);
    expect(b.bytes.equals(a.bytes)).toBe(true);
  };

  it("Gloo (CPU)", async () => {
    same(await run(1), await run(1, [...CPU, "--collectives", "gloo"]));
  }, 120_000);

  it("Gloo (CPU) at ZeRO stage 2: the passes reduced region by region, and all-gather, over one rank", async () => {
    same(await run(1, CPU, 2), await run(1, [...CPU, "--collectives", "gloo"], 2));
  }, 120_000);

  it.skipIf(!gpu)(
    "NCCL (CUDA)",
    async () => {
      const cuda = ["--device", "cuda"];
      const local = await run(1, cuda);
      let nccl: Awaited<ReturnType<typeof run>>;
      try {
        nccl = await run(1, [...cuda, "--collectives", "nccl"]);
      } catch (err) {
        if (!/NCCL could not be loaded/.test(String(err))) throw err;
        console.warn(`ranks.test.ts: the NCCL check is SKIPPED: ${String(err)}`);
        return;
      }
      // CUDA's backward adds with atomics (the embedding's and RMSNorm's weight gradients,
      // attention's dq) in an order that changes from run to run, so two CUDA runs, through
      // NCCL or not, agree to that rounding, not bit for bit (an H200 measured grad_norm
      // 1.4e-10 apart): the forward passes before any update bit for bit, the metrics within
      // 1e-6, the weights as two ranks and one (AdamW amplifies rounding where a gradient is
      // near zero).
      const close = (a: typeof local, b: typeof local) => {
        expect(sameBits(b.lp, a.lp)).toBe(true);
        expect(sameBits(b.grouped, a.grouped)).toBe(true);
        expect(sameBits(b.values, a.values)).toBe(true);
        a.actor.forEach((m, k) => {
          expect(metricDiff(m, b.actor[k] ?? {}, ACTOR_METRICS)).toBeLessThan(1e-6);
        });
        a.critic.forEach((m, k) => {
          expect(metricDiff(m, b.critic[k] ?? {}, CRITIC_METRICS)).toBeLessThan(1e-6);
        });
        const d = weightDiff(b.weights, a.weights);
        expect(d.worst).toBeLessThanOrEqual(1e-4);
        expect(d.beyond).toBeLessThan(1e-3);
      };
      close(local, nccl);
      // ZeRO stage 2 on CUDA: the learner keeps the fp32 masters (its one shard), the model
      // only its bf16 compute copy, which each step refreshes from the updated shard; NCCL's
      // reduce (each region of each backward pass) and all-gather run over one rank. The same run as stage 0 (see the
      // ZeRO describe above for why: here the norm's sum runs over the padded buffer), and a
      // checkpoint of it (the masters downloaded whole, the bf16 copy reloaded through the
      // staging buffer) resumes; each within the atomics' rounding, as above.
      const zero = await run(1, [...cuda, "--collectives", "nccl"], 2);
      close(await run(1, cuda, 2), zero);
      close(local, zero);
      expect(weightDiff(zero.continued.weights, local.continued.weights).worst).toBeLessThanOrEqual(
        1e-4,
      );
      const memory = zero.loaded.memory as Record<string, Record<string, number>>;
      const P = zero.loaded.parameters as number;
      const C = Math.ceil(P / 128) * 128;
      expect(memory.actor).toMatchObject({ weights: 2 * C, master_weights: 4 * C });
      expect(memory.reference).toEqual({ weights: 2 * P, master_weights: 0, host_weights: 0 });
      const resumed = await resume(zero, 1, 2, cuda);
      expect(weightDiff(resumed.weights, zero.continued.weights).worst).toBeLessThanOrEqual(1e-4);
    },
    300_000,
  );

  it("a library that does not serve the device is refused", async () => {
    const p = new ServeProcess(
      nativeExecutable("searchr1-trainer"),
      ["serve", ...CPU, "--collectives", "nccl", "--rendezvous", tempDir()],
      process.env,
    );
    expect(await p.exit).toBe(2);
    expect(p.stderr).toMatch(/--collectives nccl does not serve the cpu backend/);
  });
});

describe("a rank that stops", () => {
  it("stuck: the other rank's collective fails after the timeout, naming it; no hang", async () => {
    const r = new Ranks(2, 2);
    await r.ok("load", { policy: POLICY });
    const out = join(tempDir(), "lp.safetensors");
    // Only rank 0 is asked: it waits for rank 1 in log_probs's all-reduce.
    const started = Date.now();
    const error = await r.procs[0]?.fails("log_probs", { batch: await inputs(), out });
    expect(Date.now() - started).toBeLessThan(30_000);
    expect(error).toMatch(/all_reduce of log_probs's outputs \(\d+ values\) failed on rank 0 of 2/);
    expect(error).toMatch(/Timed out waiting 2000ms.*collective timeout 2 s/);
    // The ranks are out of step: later collectives are refused, naming the first failure.
    expect(await r.procs[0]?.fails("export", { out: join(tempDir(), "e") })).toMatch(
      /refused on rank 0: an earlier collective failed \(all_reduce of log_probs's outputs/,
    );
    expect(await r.close()).toEqual([0, 0]);
  });

  it("killed: the other rank's collective fails at once, naming it", async () => {
    const r = new Ranks(2, 600);
    await r.ok("load", { policy: POLICY });
    r.procs[1]?.proc.kill("SIGKILL");
    await r.procs[1]?.exit;
    const started = Date.now();
    const error = await r.procs[0]?.fails("export", { out: join(tempDir(), "e") });
    expect(Date.now() - started).toBeLessThan(30_000); // far below the 600 s timeout
    expect(error).toMatch(
      /all_reduce of export's outcome on rank 0 \(1 values\) failed on rank 0 of 2/,
    );
    expect(error).toMatch(/Connection (closed|reset) by peer/);
    expect(await r.procs[0]?.close()).toBe(0);
  });
});

describe("rank options", () => {
  it.each([
    [["--world-size", "2"], /--world-size 2 --collectives auto needs --rendezvous DIR/],
    [
      ["--world-size", "2", "--rank", "2", "--rendezvous", "/tmp"],
      /--rank 2 --world-size 2: the rank must be in \[0, world size\)/,
    ],
    [["--collective-timeout", "0"], /--collective-timeout must be a positive number of seconds/],
  ])("%j is refused", async (flags, message) => {
    const p = new ServeProcess(
      nativeExecutable("searchr1-trainer"),
      ["serve", ...CPU, "--threads", "1", ...flags],
      process.env,
    );
    expect(await p.exit).toBe(2);
    expect(p.stderr).toMatch(message);
  });
});
