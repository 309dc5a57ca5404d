// searchr1-trainer serve's update_actor with `rollout_is_weights` (rollout correction's
// truncated importance weights, native/src/train/ppo_loss.cpp): each token's policy loss,
// and its gradient, is multiplied by its weight, as verl's compute_policy_loss_vanilla does
// (pg_losses * rollout_is_weights, before the aggregation); the KL and entropy terms and
// pg_clipfrac are left alone.
//
// The reference is the objective without weights: PPO's clipped loss, dual clip included, is
// positively homogeneous in the advantage (max(-wA·r, -wA·clip(r)) = w·max(-A·r, -A·clip(r))
// and min(-wA·c, ·) likewise for w > 0), so weights w with advantages A must give the update
// that advantages w·A give without weights. Compared on an update whose AdamW step is linear
// in the gradient (eps = 1e3 far above every |g|, so the step is lr·g/(|g| + eps)): the
// weights moved by each run differ by the gradients' difference, which is float rounding
// (A·w rounded to fp32 on one side, multiplied in double on the other), and each is rounded
// to fp32 (measured: an ulp of the weight, plus 2.4e-7 of the largest move beyond it);
// allowed an ulp plus 1e-5 of the largest move. The weights themselves change the update by
// far more (checked), all-ones weights change nothing at all, and a weight that is negative or
// not finite on a loss token is refused naming the tensor (ignored elsewhere).
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { Rng } from "../../src/runtime/rng.js";
import type { NamedTensor } from "../../src/tensors/safetensors.js";
import { ServeProcess } from "../helpers/serve-process.js";
import {
  CPU,
  get,
  modelDir,
  readFloats,
  rolloutBatch,
  tempDir,
  writeBatchFile,
} from "./helpers.js";

const POLICY = modelDir("untied");
const REFERENCE = modelDir("tied");

class Serve extends ServeProcess {
  constructor() {
    super(nativeExecutable("searchr1-trainer"), ["serve", ...CPU, "--threads", "2"], {
      ...process.env,
      OMP_NUM_THREADS: "2",
    });
  }
}

// 6 sequences × 16: a prompt, then a response with a hole (retrieved tokens) in some rows.
const B = 6;
const T = 16;
const LENGTHS = [16, 11, 14, 9, 16, 12];
const PROMPTS = [4, 3, 5, 3, 4, 3];

const advantages = new Float32Array(B * T);
const weights = new Float32Array(B * T);
const { ids, attention, response, tensor } = rolloutBatch({
  T,
  lengths: LENGTHS,
  prompts: PROMPTS,
  seed: 29,
  holeLength: 2,
  perToken: (b, i, rand) => {
    advantages[i] = (b % 3 === 1 ? -1 : 1) * (0.3 + rand());
    weights[i] = Math.fround(0.05 + 1.95 * rand()); // truncated weights lie in (0, cap]
  },
});

/** The unit in the last place of a float32 value (at most twice too large near a power of 2). */
function ulp(x: number): number {
  const a = Math.abs(x);
  return a < 2 ** -126 ? 2 ** -149 : 2 ** (Math.floor(Math.log2(a)) - 23);
}

async function logProbs(s: Serve, model: string): Promise<Float32Array> {
  const batch = await writeBatchFile([
    tensor("input_ids", ids),
    tensor("attention_mask", attention),
  ]);
  const out = join(tempDir(), "lp.safetensors");
  await s.ok("log_probs", { batch, out, model });
  return get(await readFloats(out), "log_probs");
}

describe("serve: update_actor with rollout_is_weights", () => {
  const LR = 1;
  const EPS = 1e3;
  const load = {
    policy: POLICY,
    reference: REFERENCE,
    actor_optim: { lr: LR, eps: EPS, weight_decay: 0, grad_clip: 0 },
  };
  const update = {
    ppo_mini_batch_size: 0,
    shuffle: false,
    kl_loss_coef: 0.01,
    entropy_coeff: 0.01,
    clip_ratio_low: 0.2,
    clip_ratio_high: 0.28,
    loss_agg_mode: "token-mean",
  };

  it("weights w with advantages A update as advantages w·A do; all-ones weights as none", async () => {
    const s = new Serve();
    await s.ok("load", load);
    const lp = await logProbs(s, "policy");
    const ref = await logProbs(s, "reference");
    // old log-probs off the policy's so that some ratios are clipped and some dual-clipped
    const r = new Rng(5);
    const old = lp.map((x) => x + 1.6 * (r.uniform() - 0.5));
    const base = [
      tensor("input_ids", ids),
      tensor("attention_mask", attention),
      tensor("response_mask", response),
      tensor("old_log_probs", old),
      tensor("ref_log_probs", ref),
    ];
    const run = async (extra: NamedTensor[]) => {
      await s.ok("load", load); // the fixture's weights and a fresh optimizer each time
      const reply = await s.ok("update_actor", {
        ...update,
        batch: await writeBatchFile([...base, ...extra]),
      });
      const out = join(tempDir(), "export");
      await s.ok("export", { out, dtype: "fp32" });
      return { reply, tensors: await readFloats(join(out, "model.safetensors")) };
    };
    const weighted = await run([
      tensor("advantages", advantages),
      tensor("rollout_is_weights", weights),
    ]);
    const scaled = await run([
      tensor(
        "advantages",
        advantages.map((a, i) => a * (weights[i] as number)),
      ),
    ]);
    const plain = await run([tensor("advantages", advantages)]);
    const ones = await run([
      tensor("advantages", advantages),
      tensor("rollout_is_weights", new Float32Array(B * T).fill(1)),
    ]);
    expect(await s.close()).toBe(0);

    // The loss terms: pg_loss as the scaled advantages give it; KL, entropy and pg_clipfrac
    // untouched by the weights; some tokens clipped.
    const rel = (a: unknown, b: unknown) =>
      Math.abs((a as number) - (b as number)) / Math.max(Math.abs(b as number), 1e-12);
    expect(rel(weighted.reply.pg_loss, scaled.reply.pg_loss)).toBeLessThan(1e-6);
    expect(rel(weighted.reply.grad_norm, scaled.reply.grad_norm)).toBeLessThan(1e-6);
    for (const k of ["kl_loss", "entropy", "pg_clipfrac", "ppo_kl", "tokens"]) {
      expect(weighted.reply[k], k).toBe(plain.reply[k]);
    }
    expect(weighted.reply.pg_clipfrac).toBeGreaterThan(0);
    expect(rel(weighted.reply.pg_loss, plain.reply.pg_loss)).toBeGreaterThan(1e-2);
    expect(ones.reply).toEqual(plain.reply);

    // The updates: the step is lr·g/(|g| + 1e3), linear in g.
    const before = await readFloats(join(POLICY, "model.safetensors"));
    let move = 0;
    let diff = 0;
    let effect = 0;
    for (const [name, w0] of before) {
      const [a, b, p, o] = [weighted, scaled, plain, ones].map((x) => get(x.tensors, name));
      for (let i = 0; i < w0.length; i++) {
        move = Math.max(move, Math.abs((a?.[i] as number) - (w0[i] as number)));
        const [x, y] = [a?.[i] as number, b?.[i] as number];
        diff = Math.max(diff, Math.abs(x - y) - ulp(Math.max(Math.abs(x), Math.abs(y))));
        effect = Math.max(effect, Math.abs((a?.[i] as number) - (p?.[i] as number)));
        expect(o?.[i]).toBe(p?.[i]);
      }
    }
    expect(move).toBeGreaterThan(0);
    expect(diff).toBeLessThanOrEqual(1e-5 * move);
    expect(effect).toBeGreaterThan(0.1 * move);
  }, 120_000);

  it("refuses a weight that is negative or not finite on a loss token, and ignores the others", async () => {
    const s = new Serve();
    await s.ok("load", load);
    const lp = await logProbs(s, "policy");
    const base = [
      tensor("input_ids", ids),
      tensor("attention_mask", attention),
      tensor("response_mask", response),
      tensor("old_log_probs", lp),
      tensor("advantages", advantages),
    ];
    const at = (b: number, t: number) => b * T + t;
    for (const bad of [-0.5, Number.NaN, Number.POSITIVE_INFINITY]) {
      const w = Float32Array.from(weights);
      w[at(1, 5)] = bad; // a response token of row 1
      const error = await s.fails("update_actor", {
        batch: await writeBatchFile([...base, tensor("rollout_is_weights", w)]),
      });
      expect(error).toMatch(
        /rollout_is_weights must be finite and >= 0 on the loss tokens \(row 1, position 5/,
      );
    }
    // Off the loss tokens (the prompt, a hole, the padding) anything goes.
    const w = Float32Array.from(weights);
    for (const i of [at(0, 1), at(0, 6), at(3, 12)]) w[i] = Number.NaN;
    w[at(2, 0)] = -3;
    const poisoned = await s.ok("update_actor", {
      batch: await writeBatchFile([...base, tensor("rollout_is_weights", w)]),
    });
    await s.ok("load", load);
    const clean = await s.ok("update_actor", {
      batch: await writeBatchFile([...base, tensor("rollout_is_weights", weights)]),
    });
    expect(poisoned).toEqual(clean);
    expect(await s.close()).toBe(0);
  }, 120_000);
});
