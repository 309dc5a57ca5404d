// searchr1-trainer serve (native/src/train/SERVE.md) driven as `train` drives it: a
// real process, JSON lines on stdin and stdout, batches and outputs in safetensors files,
// the untied fixture model as the policy. It checks that
//  - a checkpoint resumes bit-exactly: updates after load_checkpoint reply with the same
//    metrics, bit for bit, as the run that never stopped, and export the same fp32 bytes
//    (cosine schedule with warmup, shuffled mini-batches, micro-batches, KL and entropy on);
//  - cutting a mini-batch into micro-batches by the token budget changes an update only by
//    fp32 rounding (token-mean and seq-mean-token-mean, padded and with remove_padding);
//  - an update is `grad --loss ppo`'s gradient followed by one AdamW step;
//  - log_probs is `score`, bit for bit, for the policy and the reference, at any temperature;
//  - a bad command gets {ok: false, error, id} and the process goes on; save_checkpoint never
//    replaces a checkpoint without overwrite; shutdown and the end of stdin exit 0.
//
// Tolerances come from measured differences (CPU backend); each describe says which.
import { readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { Rng } from "../../src/runtime/rng.js";
import { type Reply, ServeProcess } from "../helpers/serve-process.js";
import {
  CPU,
  FIXTURES,
  get,
  maxAbs,
  maxAbsDiff,
  modelDir,
  readFloats,
  rolloutBatch,
  sameBits,
  tempDir,
  trainerOk,
  writeBatchFile,
} from "./helpers.js";

const POLICY = modelDir("untied");
const REFERENCE = modelDir("tied"); // another model with the same vocabulary

/** One `searchr1-trainer serve` process and the replies to the commands sent to it. */
class Serve extends ServeProcess {
  constructor(threads = 2) {
    super(nativeExecutable("searchr1-trainer"), ["serve", ...CPU, "--threads", String(threads)], {
      ...process.env,
      OMP_NUM_THREADS: String(threads),
    });
  }
}

// The rollout batch: 8 sequences of different lengths (right padding), each a prompt then a
// response whose mask has a hole (an <information> block) in every other sequence; sequence
// 3 has no loss token at all. Token ids from a fixed generator.
const B = 8;
const T = 20;
const LENGTHS = [20, 12, 16, 7, 20, 10, 14, 9];
const PROMPTS = [4, 3, 5, 3, 4, 3, 4, 3];
/** Real tokens per micro-batch that cut the batch into 5 micro-batches (see micro_batches). */
const BUDGET = 30;

const SIGN = [1, -1, 1, 1, -1, 1, -1, -1];
const advantages = new Float32Array(B * T);
const { ids, attention, response, tensor } = rolloutBatch({
  T,
  lengths: LENGTHS,
  prompts: PROMPTS,
  seed: 17,
  holeLength: 3,
  noLoss: [3],
  perToken: (b, i, rand) => {
    advantages[i] = (SIGN[b] ?? 1) * (0.3 + rand()) + 0.2 * (rand() - 0.5);
  },
});
const LOSS_TOKENS = response.reduce((n, r, i) => n + (r === 1n && i % T > 0 ? 1 : 0), 0);

/** input_ids and attention_mask: what log_probs and score read. */
const inputs = (): Promise<string> =>
  writeBatchFile([tensor("input_ids", ids), tensor("attention_mask", attention)]);

/** The batch update_actor reads; `advantagesToo` false leaves advantages out. */
function updateBatch(old: Float32Array, ref: Float32Array, advantagesToo = true) {
  return writeBatchFile([
    tensor("input_ids", ids),
    tensor("attention_mask", attention),
    tensor("response_mask", response),
    tensor("old_log_probs", old),
    tensor("ref_log_probs", ref),
    ...(advantagesToo ? [tensor("advantages", advantages)] : []),
  ]);
}

/** log_probs of `model` on the batch file, as [log_probs, entropy]. */
async function logProbs(s: Serve, batch: string, model: string, temperature?: number) {
  const out = join(tempDir(), "lp.safetensors");
  await s.ok("log_probs", { batch, out, model, ...(temperature ? { temperature } : {}) });
  const t = await readFloats(out);
  return [get(t, "log_probs"), get(t, "entropy")] as const;
}

/** old_log_probs moved off the policy's so that the ratio is clipped at some tokens. */
function perturbed(lp: Float32Array): Float32Array {
  const r = new Rng(5);
  return lp.map((x) => x + 0.6 * (r.uniform() - 0.5));
}

/** The policy's weights as exported in fp32: the folder and its tensors. */
async function exportFp32(
  s: Serve,
): Promise<{ bytes: Buffer; tensors: Map<string, Float32Array> }> {
  const out = join(tempDir(), "export");
  await s.ok("export", { out, dtype: "fp32" });
  expect(readdirSync(out).sort()).toEqual(["config.json", "model.safetensors"]);
  const file = join(out, "model.safetensors");
  return { bytes: readFileSync(file), tensors: await readFloats(file) };
}

/** The unit in the last place of a float32 value (at most twice too large near a power of 2). */
function ulp(x: number): number {
  const a = Math.abs(x);
  return a < 2 ** -126 ? 2 ** -149 : 2 ** (Math.floor(Math.log2(a)) - 23);
}

/** grad --loss ppo of the untied model on `batch`: its outputs (loss terms, grad.<name>). */
async function gradOf(batch: string, flags: Record<string, string>) {
  const out = join(tempDir(), "grad.safetensors");
  trainerOk([
    ...["grad", "--loss", "ppo", "--model", POLICY, "--batch", batch, "--out", out],
    ...Object.entries(flags).flat(),
    ...[...CPU, "--threads", "2"],
  ]);
  return readFloats(out);
}

describe("serve: checkpoints resume bit-exactly", () => {
  const load = {
    policy: POLICY,
    reference: POLICY,
    seed: 1234,
    actor_optim: {
      lr: 2e-4,
      lr_schedule: "cosine",
      warmup_steps: 2,
      total_steps: 10,
      min_lr_ratio: 0.1,
    },
  };
  // Two shuffled mini-batches of 4 sequences per update, each cut into micro-batches.
  const update = {
    ppo_mini_batch_size: 4,
    ppo_max_token_len_per_gpu: BUDGET,
    kl_loss_coef: 0.01,
    entropy_coeff: 0.001,
  };

  /** Run A: 2 updates, save_checkpoint, 2 updates; run B: load_checkpoint, 2 updates. */
  async function resume(threads: number) {
    const a = new Serve(threads);
    await a.ok("load", load);
    const [lp] = await logProbs(a, await inputs(), "policy");
    const [ref] = await logProbs(a, await inputs(), "reference");
    const batch = await updateBatch(lp, ref);
    const ckpt = join(tempDir(), "ckpt");
    const first = [await a.ok("update_actor", { batch, ...update })];
    first.push(await a.ok("update_actor", { batch, ...update }));
    expect(await a.ok("save_checkpoint", { dir: ckpt })).toEqual({ global_step: 4 });
    const after = [await a.ok("update_actor", { batch, ...update })];
    after.push(await a.ok("update_actor", { batch, ...update }));
    const weightsA = await exportFp32(a);
    expect(await a.close()).toBe(0);

    // Another seed at load: the shuffling generator must come from the checkpoint.
    const b = new Serve(threads);
    await b.ok("load", { ...load, seed: 99 });
    expect(await b.ok("load_checkpoint", { dir: ckpt })).toEqual({ global_step: 4 });
    const resumed = [await b.ok("update_actor", { batch, ...update })];
    resumed.push(await b.ok("update_actor", { batch, ...update }));
    const weightsB = await exportFp32(b);
    expect(await b.close()).toBe(0);
    return { ckpt, first, after, resumed, weightsA, weightsB };
  }

  it("one thread: replies and fp32 weights after load_checkpoint are those of the run that never stopped", async () => {
    const { ckpt, first, after, resumed, weightsA, weightsB } = await resume(1);

    // The run is what the test means it to be: 2 optimizer steps of 2 or more micro-batches
    // per update, a learning rate that follows the schedule, clipping, and updates that differ.
    for (const [k, r] of [...first, ...after].entries()) {
      expect(r).toMatchObject({
        optimizer_steps: 2,
        global_step: 2 * (k + 1),
        tokens: LOSS_TOKENS,
      });
      expect(r.micro_batches).toBeGreaterThanOrEqual(4); // any 4 sequences hold > BUDGET
    }
    const lrs = [...first, ...after].map((r) => r.lr);
    expect(new Set(lrs).size).toBe(4);
    expect(after[0]?.pg_loss).not.toBe(first[1]?.pg_loss);
    const clipfrac = [...first, ...after].map((r) => r.pg_clipfrac as number);
    expect(clipfrac.some((c) => c > 0 && c < 1)).toBe(true);
    expect(readdirSync(ckpt).sort()).toEqual([
      "actor.optimizer.safetensors",
      "actor.rng.txt",
      "policy",
    ]);
    expect(readdirSync(join(ckpt, ".."))).toEqual(["ckpt"]); // no .partial- folder left

    // toStrictEqual compares numbers with Object.is, and the replies print the shortest text
    // that reads back as the same double: the same doubles, bit for bit.
    expect(resumed).toStrictEqual(after);
    expect(weightsB.bytes.equals(weightsA.bytes)).toBe(true);
  });

  // With several OpenMP threads the CPU backend adds its per-thread partial sums (bias and
  // norm-weight gradients, the gradient norm) in thread order, not in the order threads
  // finish: without that, two runs of the same update differ in the last bits.
  it("four threads: the same, bit for bit (partial sums added in thread order)", async () => {
    const { after, resumed, weightsA, weightsB } = await resume(4);
    expect(resumed).toStrictEqual(after);
    expect(weightsB.bytes.equals(weightsA.bytes)).toBe(true);
  });
});

describe("serve: micro-batches do not change an update", () => {
  // The cut changes the order in which fp32 gradients are summed, and the forward's rounding
  // too: a micro-batch (or the last chunk of its vocabulary logits) of at most 32 rows is
  // multiplied by `dots` instead of sgemm (cpu_backend.cpp, kDotsMaxRows), and with
  // remove_padding each micro-batch is packed (its sequences end to end in one row, padding
  // dropped). Measured (CPU, 2 threads):
  //  - metrics: at most 1.3e-7 of max(|value|, 1) (padded: pg_loss 1.2e-7, grad_norm 2.6e-8;
  //    remove_padding: pg_loss 6.1e-8, kl_loss 8.2e-8, grad_norm 1.3e-7). Allowed 1e-6 of it.
  //  - weights: AdamW's first step is lr * g/(|g| + eps), which turns a rounding difference
  //    dg into lr * dg/(|g| + eps), large where |g| is small (worst 0.8% of lr, in about 1%
  //    of the entries). So each weight may differ by one fp32 ulp (both results are
  //    rounded) plus lr * TAU * G/(|g| + eps), G the tensor's largest |gradient| and g the
  //    entry's (from grad --loss ppo), i.e. dg <= TAU * G: measured TAU 1.4e-7 at most (a
  //    few fp32 roundings, 6e-8 each, of the largest term), allowed 1e-6.
  const LR = 1e-3;
  const EPS = 1e-8;
  const TAU = 1e-6;
  const METRICS = 1e-6;

  it.each([
    ["token-mean", false],
    ["seq-mean-token-mean", false],
    ["token-mean", true],
    ["seq-mean-token-mean", true],
  ])("%s, remove_padding %s", async (mode, removePadding) => {
    const s = new Serve();
    const load = {
      policy: POLICY,
      reference: REFERENCE,
      seed: 3,
      actor_optim: { lr: LR, eps: EPS },
    };
    await s.ok("load", load);
    const [lp] = await logProbs(s, await inputs(), "policy");
    const [ref] = await logProbs(s, await inputs(), "reference");
    const batch = await updateBatch(perturbed(lp), ref);
    const terms = { kl_loss_coef: 0.01, entropy_coeff: 0.01, loss_agg_mode: mode };
    const update = {
      ...{ batch, shuffle: false, ppo_mini_batch_size: 0, remove_padding: removePadding },
      ...terms,
    };
    const whole = await s.ok("update_actor", { ...update, ppo_max_token_len_per_gpu: 0 });
    const wholeW = (await exportFp32(s)).tensors;
    await s.ok("load", load); // the fixture's weights again and a fresh optimizer
    const cut = await s.ok("update_actor", { ...update, ppo_max_token_len_per_gpu: BUDGET });
    const cutW = (await exportFp32(s)).tensors;
    expect(await s.close()).toBe(0);

    expect(whole).toMatchObject({ micro_batches: 1, optimizer_steps: 1, tokens: LOSS_TOKENS });
    expect(cut).toMatchObject({ micro_batches: 5, optimizer_steps: 1, tokens: LOSS_TOKENS });
    expect(whole.pg_clipfrac).toBeGreaterThan(0);
    expect(cut.lr).toBe(whole.lr);
    for (const k of ["pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "kl_loss", "grad_norm"]) {
      const [x, y] = [whole[k] as number, cut[k] as number];
      const allowed = METRICS * Math.max(Math.abs(x), 1);
      expect(Math.abs(x - y), `${k}: ${x} vs ${y}`).toBeLessThanOrEqual(allowed);
    }

    const flags = Object.fromEntries([
      ["--kl-loss-coef", "0.01"],
      ["--entropy-coeff", "0.01"],
      ["--loss-agg-mode", mode],
    ]);
    const grad = await gradOf(batch, flags);
    const before = await readFloats(join(POLICY, "model.safetensors"));
    let tau = 0;
    let moved = 0;
    for (const [name, x] of wholeW) {
      const [y, g, w0] = [get(cutW, name), get(grad, `grad.${name}`), get(before, name)];
      const G = maxAbs(g);
      for (let i = 0; i < x.length; i++) {
        const [xi, yi, gi] = [x[i] ?? Number.NaN, y[i] ?? Number.NaN, g[i] ?? Number.NaN];
        const beyondUlp = Math.abs(xi - yi) - ulp(Math.max(Math.abs(xi), Math.abs(yi)));
        tau = Math.max(tau, (beyondUlp * (Math.abs(gi) + EPS)) / (LR * G));
        if (Math.abs(xi - (w0[i] ?? 0)) > 0.5 * LR) moved++;
      }
    }
    expect(tau).toBeLessThanOrEqual(TAU);
    expect(moved).toBeGreaterThan(50_000); // of 140160: the update itself is far larger
  });
});

describe("serve: update_actor is grad --loss ppo and one AdamW step", () => {
  // AdamW's first step with weight_decay 0 and no clipping moves w by -lr * g/(|g| + eps)
  // (bias correction cancels (1 - beta) in m and v). Measured against that formula in
  // float64 (CPU, 2 threads), padded: the difference is at most half an ulp of the new fp32
  // weight (it is stored in fp32; 6e-5 of lr for the norm weights near 1) plus 2.8e-7 of the
  // step (the kernel's fp32 arithmetic: m, v, sqrt, the division and lr/(1 - beta1));
  // allowed half an ulp plus 1e-6 of the step. With remove_padding the rows are packed
  // into one and summed in another order, so the gradient differs from grad's by rounding, dg,
  // which the step turns into lr * dg/(|g| + eps): allowed besides lr * TAU * G/(|g| + eps),
  // G the tensor's largest |gradient|, dg <= TAU * G, measured TAU 5.7e-10, allowed 1e-7.
  // Padded, the loss terms are grad's to the last fp32 bit (the head backpropagates the same
  // rows in both, Qwen2Model::head). With remove_padding the forward multiplies the packed
  // rows, and a BLAS may round a row differently among other rows: OpenBLAS's Haswell sgemm
  // kernels (OPENBLAS_CORETYPE=Haswell, as CI sets, on an AVX-512 EPYC) give 40 of the 100
  // log-probs other bits than the padded batch's (2.4e-6 at most), its SkylakeX ones none.
  // Measured with the Haswell kernels: loss terms within 8.5e-8 of max(|x|, 1) (kl_loss;
  // grad's fp32 storage included), grad_norm 6.6e-8 relative, TAU 1.6e-8. Allowed 1e-6 of
  // max(|x|, 1) for the loss terms (METRICS, as for micro-batches), 1e-6 for grad_norm.
  // Entries with a zero gradient stay exactly as loaded.
  const LR = 1e-3;
  const EPS = 1e-8;
  const STEP_REL = 1e-6;
  const TAU = 1e-7;
  const METRICS = 1e-6;

  it.each([false, true])(
    "remove_padding %s: moves every weight by -lr * g/(|g| + eps), g from grad --loss ppo",
    async (removePadding) => {
      const s = new Serve();
      await s.ok("load", {
        ...{ policy: POLICY, reference: REFERENCE },
        actor_optim: { lr: LR, eps: EPS, weight_decay: 0, grad_clip: 0 },
      });
      const [lp] = await logProbs(s, await inputs(), "policy");
      const [ref] = await logProbs(s, await inputs(), "reference");
      const batch = await updateBatch(perturbed(lp), ref);
      const terms = {
        kl_loss_coef: 0.01,
        entropy_coeff: 0.01,
        loss_agg_mode: "seq-mean-token-mean",
      };
      const r = await s.ok("update_actor", {
        batch,
        ppo_mini_batch_size: 0,
        shuffle: false,
        remove_padding: removePadding,
        ...terms,
      });
      const after = (await exportFp32(s)).tensors;
      expect(await s.close()).toBe(0);

      const grad = await gradOf(batch, {
        "--kl-loss-coef": "0.01",
        "--entropy-coeff": "0.01",
        "--loss-agg-mode": "seq-mean-token-mean",
      });
      const before = await readFloats(join(POLICY, "model.safetensors"));

      // The loss terms are grad's (which stores them in fp32).
      for (const k of ["pg_loss", "pg_clipfrac", "kl_loss", "entropy"]) {
        const [x, want] = [r[k] as number, get(grad, k)[0] ?? Number.NaN];
        if (!removePadding) expect(Math.fround(x), k).toBe(want);
        const allowed = METRICS * Math.max(Math.abs(want), 1);
        expect(Math.abs(x - want), `${k}: ${x} vs ${want}`).toBeLessThanOrEqual(allowed);
      }
      expect(r.pg_clipfrac).toBeGreaterThan(0);
      expect(r.lr).toBe(Math.fround(LR));

      let squares = 0;
      let excess = 0;
      let zeros = 0;
      const movedWithoutGradient: string[] = [];
      for (const [name, w0] of before) {
        const [g, w1] = [get(grad, `grad.${name}`), get(after, name)];
        const G = maxAbs(g);
        for (let i = 0; i < w0.length; i++) {
          const [gi, a, b] = [g[i] ?? Number.NaN, w0[i] ?? Number.NaN, w1[i] ?? Number.NaN];
          squares += gi * gi;
          const want = (-LR * gi) / (Math.abs(gi) + EPS);
          const err = Math.abs(b - a - want);
          const reorder = removePadding ? (LR * TAU * G) / (Math.abs(gi) + EPS) : 0;
          const allowed = ulp(b) / 2 + STEP_REL * Math.abs(want) + reorder;
          excess = Math.max(excess, err / allowed);
          if (gi === 0) zeros++;
          if (gi === 0 && b !== a) movedWithoutGradient.push(`${name}[${i}]`);
        }
      }
      expect(excess).toBeLessThanOrEqual(1);
      expect(zeros).toBeGreaterThan(0); // rows of tokens that are not in the batch
      expect(movedWithoutGradient).toEqual([]);
      // grad_norm is the gradient's: 7.5e-16 relative padded, 5.0e-10 with remove_padding
      // (6.6e-8 with OpenBLAS's Haswell kernels, see above).
      const norm = Math.sqrt(squares);
      const normRel = removePadding ? 1e-6 : 1e-12;
      expect(Math.abs((r.grad_norm as number) - norm)).toBeLessThan(normRel * norm);
    },
  );
});

describe("serve: reference_offload (verl's ref param_offload)", () => {
  it("keeps the reference in host memory, brings it for its log_probs: the same bits", async () => {
    type Memory = { memory: { reference: Record<string, number> } };
    const kept = new Serve();
    const before = (await kept.ok("load", { policy: POLICY, reference: REFERENCE })) as Memory;
    const batch = await inputs();
    const [want] = await logProbs(kept, batch, "reference");
    expect(await kept.close()).toBe(0);

    const s = new Serve();
    const loaded = (await s.ok("load", {
      ...{ policy: POLICY, reference: REFERENCE, reference_offload: true },
    })) as Memory;
    // On the CPU the compute copy is the fp32 weights: all of it goes to the host.
    expect(before.memory.reference.host_weights).toBe(0);
    expect(loaded.memory.reference).toEqual({
      weights: 0,
      master_weights: 0,
      host_weights: before.memory.reference.weights,
    });
    for (let k = 0; k < 2; k++) {
      const [lp] = await logProbs(s, batch, "reference");
      expect(sameBits(lp, want), `pass ${k + 1}`).toBe(true);
    }
    // The policy is untouched by it.
    await logProbs(s, batch, "policy");
    expect(await s.fails("load", { policy: POLICY, reference_offload: true })).toBe(
      "'reference_offload' needs a 'reference' to offload",
    );
    expect(await s.close()).toBe(0);
  });
});

describe("serve: log_probs is score", () => {
  it("equals score bit for bit, for the policy and the reference, at temperature 1 and 0.7", async () => {
    const s = new Serve();
    await s.ok("load", { policy: POLICY, reference: REFERENCE });
    const batch = await inputs();
    const got = new Map<string, readonly [Float32Array, Float32Array]>();
    for (const model of ["policy", "reference"]) {
      for (const temperature of [undefined, 0.7]) {
        got.set(`${model} ${temperature ?? 1}`, await logProbs(s, batch, model, temperature));
      }
    }
    expect(await s.close()).toBe(0);

    for (const [key, [lp, ent]] of got) {
      const [model, temperature] = key.split(" ") as [string, string];
      const out = join(tempDir(), "score.safetensors");
      const dir = model === "policy" ? POLICY : REFERENCE;
      trainerOk([
        ...["score", "--model", dir, "--batch", batch, "--out", out],
        ...["--temperature", temperature, ...CPU, "--threads", "2"],
      ]);
      const want = await readFloats(out);
      expect(sameBits(lp, get(want, "logprobs")), `${key} log_probs`).toBe(true);
      expect(sameBits(ent, get(want, "entropy")), `${key} entropy`).toBe(true);
      // Nothing is predicted at position 0 or at padding.
      lp.forEach((x, i) => {
        if (i % T === 0 || attention[i] === 0n) expect(x).toBe(0);
        else expect(x).toBeLessThan(0);
      });
    }
    const [p1, p07, r1] = ["policy 1", "policy 0.7", "reference 1"].map((k) => got.get(k)?.[0]);
    if (!(p1 && p07 && r1)) throw new Error("a log_probs reply is missing");
    expect(maxAbsDiff(p1, p07)).toBeGreaterThan(0.1);
    expect(maxAbsDiff(p1, r1)).toBeGreaterThan(0.1);
  });
});

describe("serve: micro_batch_size (rollout.log_prob_micro_batch_size)", () => {
  it("groups the forward passes of log_probs and values without changing their results", async () => {
    const s = new Serve();
    await s.ok("load", { policy: POLICY, critic: join(FIXTURES, "critic-untied") });
    const batch = await inputs();
    const run = async (op: "log_probs" | "values", micro?: number) => {
      const out = join(tempDir(), `${op}-${micro ?? "all"}.safetensors`);
      await s.ok(op, { batch, out, ...(micro === undefined ? {} : { micro_batch_size: micro }) });
      return get(await readFloats(out), op);
    };
    const whole = { log_probs: await run("log_probs"), values: await run("values") };
    expect(maxAbsDiff(whole.values, new Float32Array(whole.values.length))).toBeGreaterThan(0.01);
    for (const micro of [1, 3, B, 100]) {
      for (const op of ["log_probs", "values"] as const) {
        const got = await run(op, micro);
        // Each sequence computes as in any packing; only the matmul shapes change rounding.
        expect(maxAbsDiff(got, whole[op]), `${op} in groups of ${micro}`).toBeLessThan(1e-5);
        got.forEach((x, i) => {
          if (i % T === 0 || attention[i] === 0n) expect(x, `${op} at padding ${i}`).toBe(0);
        });
      }
    }
    expect(
      await s.fails("log_probs", { batch, out: join(tempDir(), "x"), micro_batch_size: -1 }),
    ).toContain("'micro_batch_size' must be >= 0");
    expect(await s.close()).toBe(0);
  });
});

describe("serve: protocol errors", () => {
  it("answers each bad command with ok false, its id and what is wrong, and goes on", async () => {
    const s = new Serve();
    const batch = await inputs();
    const out = join(tempDir(), "lp.safetensors");
    const missing = join(tempDir(), "nowhere");

    // Before a load, and a load that fails.
    expect(await s.fails("update_actor", { batch })).toContain("send 'load' first");
    expect(await s.fails("log_probs", { batch, out })).toContain("send 'load' first");
    expect(await s.fails("load", { policy: missing })).toContain(`${missing}/config.json`);
    await s.ok("load", { policy: POLICY, actor_optim: { lr: 1e-3 } });

    const [lp] = await logProbs(s, batch, "policy");
    const good = await updateBatch(lp, lp);
    const noAdvantages = await updateBatch(lp, lp, false);
    const cases: [string, Record<string, unknown>, string][] = [
      ["frob", {}, "unknown op 'frob'"],
      ["update_actor", {}, "'batch' is missing"],
      ["update_actor", { batch: noAdvantages }, `${noAdvantages}: tensor 'advantages' is missing`],
      ["update_actor", { batch: good, loss_agg_mode: "seq-mean" }, "'seq-mean' is not one of"],
      ["update_actor", { batch: good, ppo_mini_batch_size: 3 }, "ppo_mini_batch_size 3"],
      ["update_actor", { batch: good, clip_ratio: "wide" }, "clip_ratio"],
      ["update_actor", { batch: missing }, missing],
      ["log_probs", { batch, out, model: "reference" }, "no reference model was loaded"],
      ["log_probs", { batch, out, model: "critic" }, "'model'"],
      ["log_probs", { batch }, "'out'"],
      ["load_checkpoint", { dir: missing }, missing],
      ["export", { out: join(tempDir(), "e"), dtype: "int8" }, "'dtype'"],
      ["values", { batch, out }, "no critic was loaded"],
      // Unknown fields are refused, by name: a misspelt key never falls back to its default.
      ["update_actor", { batch: good, kl_coef: 0.1 }, "unknown field 'kl_coef'"],
    ];
    for (const [op, fields, message] of cases) {
      expect(await s.fails(op, fields), `${op} ${JSON.stringify(fields)}`).toContain(message);
      await s.ok("log_probs", { batch, out }); // and the next command is served
    }
    // The message names the mode's key, though as grad's flag (--loss-agg-mode) today.
    expect(await s.fails("update_actor", { batch: good, loss_agg_mode: "x" })).toMatch(
      /loss.agg.mode/,
    );

    // Not JSON, not an object, no op: the id is echoed when there is one to read.
    const raw = async (text: string) => JSON.parse(await s.line(text)) as Reply;
    const truncated = await raw('{"op": "log_probs", "id": 9');
    expect(truncated).toMatchObject({ ok: false, id: null });
    expect(truncated.error).toMatch(/JSON/);
    expect(await raw("[1, 2]")).toMatchObject({ ok: false, id: null });
    const noOp = await raw('{"id": "seven"}');
    expect(noOp).toMatchObject({ ok: false, id: "seven" });
    expect(noOp.error).toContain("'op'");

    // None of the failed updates took a step; the process still serves.
    expect((await s.ok("update_actor", { batch: good })).global_step).toBe(1);

    // A failed load changes nothing: the models and learners loaded before stay.
    const loads: [Record<string, unknown>, string][] = [
      [{ policy: POLICY, lr: 1e-3 }, "unknown field 'lr'"],
      [{ policy: POLICY, actor_optim: { learning_rate: 1 } }, "unknown field 'learning_rate'"],
      [{ policy: POLICY, actor_optim: { lr_schedule: "step" } }, "'step'"],
      [{ policy: POLICY, reference: missing }, `${missing}/config.json`],
    ];
    for (const [fields, message] of loads) {
      expect(await s.fails("load", fields), JSON.stringify(fields)).toContain(message);
    }
    expect((await s.ok("update_actor", { batch: good })).global_step).toBe(2);
    await s.ok("load", { policy: POLICY, actor_optim: { lr: 1e-3 } });
    expect((await s.ok("update_actor", { batch: good })).global_step).toBe(1);
    expect(await s.send("shutdown")).toMatchObject({ ok: true });
    expect(await s.exit).toBe(0);
    expect(s.stderr).toBe("");
  });

  it("keeps an existing checkpoint unless told to overwrite it", async () => {
    const s = new Serve();
    await s.ok("load", { policy: POLICY, actor_optim: { lr: 1e-3 } });
    const [lp] = await logProbs(s, await inputs(), "policy");
    const batch = await updateBatch(lp, lp);
    const dir = join(tempDir(), "ckpt");
    const files = ["actor.optimizer.safetensors", "actor.rng.txt", "policy/model.safetensors"];
    const snapshot = () => files.map((f) => readFileSync(join(dir, f)));

    await s.ok("update_actor", { batch });
    expect(await s.ok("save_checkpoint", { dir })).toEqual({ global_step: 1 });
    const saved = snapshot();
    await s.ok("update_actor", { batch });
    expect(await s.fails("save_checkpoint", { dir })).toContain(`${dir}: already exists`);
    for (const [i, bytes] of snapshot().entries()) {
      expect(bytes.equals(saved[i] as Buffer), files[i]).toBe(true);
    }
    expect(readdirSync(join(dir, ".."))).toEqual(["ckpt"]);

    expect(await s.ok("save_checkpoint", { dir, overwrite: true })).toEqual({ global_step: 2 });
    for (const [i, bytes] of snapshot().entries()) {
      expect(bytes.equals(saved[i] as Buffer), files[i]).toBe(false);
    }
    expect(readdirSync(join(dir, ".."))).toEqual(["ckpt"]);
    expect(await s.close()).toBe(0);
  });

  it("a checkpoint that cannot be loaded whole changes nothing", async () => {
    const s = new Serve();
    await s.ok("load", { policy: POLICY, actor_optim: { lr: 1e-3 } });
    const [lp] = await logProbs(s, await inputs(), "policy");
    const batch = await updateBatch(lp, lp);
    const dir = join(tempDir(), "ckpt");
    await s.ok("update_actor", { batch });
    await s.ok("save_checkpoint", { dir });
    await s.ok("update_actor", { batch });
    const before = await exportFp32(s);
    rmSync(join(dir, "actor.optimizer.safetensors"));
    expect(await s.fails("load_checkpoint", { dir })).toContain("actor.optimizer.safetensors");
    expect((await exportFp32(s)).bytes.equals(before.bytes)).toBe(true);
    expect((await s.ok("update_actor", { batch })).global_step).toBe(3);
    expect(await s.close()).toBe(0);
  });

  it("exits 0 at the end of stdin, loaded or not", async () => {
    const idle = new Serve();
    expect(await idle.close()).toBe(0);
    const busy = new Serve();
    await busy.ok("load", { policy: POLICY });
    await busy.fails("frob");
    expect(await busy.close()).toBe(0);
    expect(busy.stderr).toBe("");
  });
});
