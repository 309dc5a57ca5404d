// The critic of `searchr1-trainer serve` (native/src/train/SERVE.md) against the float64
// PyTorch references of test/native/make_critic_fixtures.py: a critic (critic-untied: the
// untied model's transformer and a random, non-zero value head, as a
// Qwen2ForTokenClassification folder) on a batch with left and right padding.
//  - `values` equal the reference, aligned as the log-probs (0 where not predicted).
//  - `update_critic`, for each loss_agg_mode, with cliprange_value set so that tokens clip
//    above and below: vf_loss, vf_clipfrac, vpred_mean and grad_norm equal the reference,
//    and so does the gradient of every parameter, with and without remove_padding (which
//    agree to float rounding), the mini-batch cut into micro-batches by the token budget.
//    The gradients are recovered from one AdamW step (critic-helpers.ts), read from
//    save_checkpoint's fp32 critic folder.
//  - A critic started from the causal LM's folder has a zero value head: values all 0;
//    save_checkpoint writes dir/critic as a Qwen2ForTokenClassification folder (the LM's
//    transformer weights, score.weight/score.bias at 0, no lm_head) that serve loads back;
//    a trained critic's checkpoint reloads with the same values, bit for bit.
//    (make_critic_fixtures.py checks that transformers loads such folders.)
//
// Tolerances, from measured error (CPU backend). values: 1e-5 absolute (measured 1.8e-6;
// transformers in float32 is off by 2.2e-6). vf_loss, vpred_mean, grad_norm and each
// parameter's gradient norm: 1e-5 relative plus 1e-7 absolute (measured worst 1.8e-6
// relative, on score.bias's single entry; vpred_mean, 0.029 summed over values of both
// signs, is off by 3.6e-8). Gradient entries: 1e-4 relative plus a floor of 1e-5 of the
// tensor's largest |entry|, as ppo.test.ts (measured at most 2.0e-6 of it beyond 1e-4
// relative, 5.5e-6 in all, on a k_proj.bias whose gradient nearly cancels). vf_clipfrac: the
// reference's count of clipped tokens over the loss tokens, to 1e-12. remove_padding on vs
// off: 1e-5 of each tensor's largest |entry| (measured 1.0e-6).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { readSafetensors, readSafetensorsHeader } from "../../src/tensors/safetensors.js";
import { excess, LR, OPTIM, type Reply, serve, stepGradient } from "./critic-helpers.js";
import { FIXTURES, get, maxAbs, modelDir, readFloats, tempDir } from "./helpers.js";

const POLICY = modelDir("untied");
const CRITIC = join(FIXTURES, "critic-untied");
const BATCH = join(FIXTURES, "critic-batch.safetensors");
const CASES = join(FIXTURES, "critic-cases.safetensors");
const BUDGET = 30; // real tokens per micro-batch (rows hold 10 to 20)
const VALUES_ABS = 1e-5;
const SCALAR_REL = 1e-5;
const SCALAR_ABS = 1e-7;
const GRAD_REL = 1e-4;
const GRAD_FLOOR = 1e-5; // times the tensor's largest |entry|
const PADDING_FLOOR = 1e-5; // remove_padding on vs off, times the tensor's largest |entry|

const load = (critic: string, optim: Record<string, unknown> = OPTIM) => ({
  op: "load",
  policy: POLICY,
  critic,
  critic_optim: optim,
});

const header = await readSafetensorsHeader(CASES);
const PARAMS = JSON.parse(header.metadata.params ?? "[]") as string[];
const MODES = JSON.parse(header.metadata.modes ?? "[]") as string[];
const CLIPRANGE = Number(header.metadata.cliprange_value);
const ref = await readFloats(CASES);
const cases = await readSafetensors(CASES);
const samples = new Map(
  [...cases]
    .filter(([name]) => name.startsWith("sample."))
    .map(([name, t]) => [name.slice("sample.".length), Array.from(t.data, Number)]),
);
const batch = await readSafetensors(BATCH);
const [B, T] = get(batch, "input_ids").shape as [number, number];
const mask = Array.from(get(batch, "attention_mask").data, Number);
/** predicted[i]: position t >= 1 of its row with tokens t and t-1 both real. */
const predicted = mask.map((m, i) => i % T > 0 && m === 1 && mask[i - 1] === 1);

const scalarOk = (got: unknown, want: number) =>
  excess([Number(got)], [want], SCALAR_REL, SCALAR_ABS) <= 1;

/** Every parameter's gradient, recovered from one AdamW step's change of the weights. */
async function gradients(checkpoint: string): Promise<Map<string, Float64Array>> {
  const before = await readFloats(join(CRITIC, "model.safetensors"));
  const after = await readFloats(join(checkpoint, "critic", "model.safetensors"));
  expect([...after.keys()].sort()).toEqual([...PARAMS].sort());
  return new Map(PARAMS.map((name) => [name, stepGradient(get(before, name), get(after, name))]));
}

const norm = (x: ArrayLike<number>) => Math.sqrt(Array.from(x).reduce((s, v) => s + v * v, 0));

describe("the critic against PyTorch (float64)", () => {
  it("has the fixtures the script promises", () => {
    expect(MODES).toEqual(["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]);
    expect(PARAMS).toHaveLength(28);
    expect(PARAMS.slice(-2)).toEqual(["score.weight", "score.bias"]);
    expect(CLIPRANGE).toBe(0.2);
    const config = JSON.parse(readFileSync(join(CRITIC, "config.json"), "utf8"));
    expect(config.architectures).toEqual(["Qwen2ForTokenClassification"]);
    expect(Object.keys(config.id2label)).toHaveLength(1);
  });

  it("values on a padded batch (left and right padding) equal the reference", async () => {
    const out = join(tempDir(), "values.safetensors");
    serve([load(CRITIC), { op: "values", batch: BATCH, out }]);
    const got = get(await readFloats(out), "values");
    const want = get(ref, "ref.values");
    expect(got).toHaveLength(B * T);
    expect(excess(got, want, 0, VALUES_ABS)).toBeLessThanOrEqual(1);
    predicted.forEach((p, i) => {
      if (!p) expect(got[i], `position ${i}`).toBe(0);
    });
    expect(maxAbs(want)).toBeGreaterThan(0.5); // the value head is not zero
  });

  it.each(MODES)("update_critic %s: loss, clip fraction and every gradient", async (mode) => {
    const dirs = [join(tempDir(), "rmpad"), join(tempDir(), "padded")];
    const update = (removePadding: boolean) => ({
      op: "update_critic",
      batch: BATCH,
      cliprange_value: CLIPRANGE,
      loss_agg_mode: mode,
      ppo_mini_batch_size: 0,
      ppo_epochs: 1,
      shuffle: false,
      remove_padding: removePadding,
      ppo_max_token_len_per_gpu: BUDGET,
    });
    const replies = serve([
      load(CRITIC),
      update(true),
      { op: "save_checkpoint", dir: dirs[0] },
      load(CRITIC),
      update(false),
      { op: "save_checkpoint", dir: dirs[1] },
    ]);
    const clipfrac =
      Number(get(cases, "clipped").data[0]) / Number(get(cases, "loss_tokens").data[0]);
    expect(clipfrac).toBeGreaterThan(0.2); // tokens clip (above and below: the script checks)
    const grads = [];
    for (const [k, dir] of dirs.entries()) {
      const r = replies[1 + 3 * k] as Reply;
      expect(r.optimizer_steps).toBe(1);
      expect(r.global_step).toBe(1);
      expect(r.lr).toBe(LR);
      expect(r.micro_batches as number).toBeGreaterThanOrEqual(3);
      for (const key of ["vf_loss", "vpred_mean", "grad_norm"]) {
        const want = get(ref, `${mode}.${key}`)[0] ?? Number.NaN;
        expect(scalarOk(r[key], want), `${key}: ${r[key]} vs ${want}`).toBe(true);
      }
      expect(Math.abs((r.vf_clipfrac as number) - clipfrac)).toBeLessThan(1e-12);
      expect(get(ref, `${mode}.vf_clipfrac`)[0]).toBeCloseTo(clipfrac, 6);

      const g = await gradients(dir);
      const norms = get(ref, `${mode}.grad_norms`);
      PARAMS.forEach((name, p) => {
        const full = get(g, name);
        const want = get(ref, `${mode}.grad.${name}`);
        const picked = get(samples, name).map((i) => full[i] ?? Number.NaN);
        const floor = GRAD_FLOOR * Math.max(maxAbs(want), 1e-12);
        expect(excess(picked, want, GRAD_REL, floor), name).toBeLessThanOrEqual(1);
        // The whole tensor, through its norm.
        expect(scalarOk(norm(full), norms[p] ?? Number.NaN), `norm of ${name}`).toBe(true);
      });
      const total = norm(PARAMS.map((name) => norm(get(g, name))));
      expect(scalarOk(total, get(ref, `${mode}.grad_norm`)[0] ?? Number.NaN)).toBe(true);
      grads.push(g);
    }

    // remove_padding on and off: the same update, to float rounding.
    const [rmpad, padded] = grads as [Map<string, Float64Array>, Map<string, Float64Array>];
    for (const name of PARAMS) {
      const a = get(rmpad, name);
      const floor = PADDING_FLOOR * Math.max(maxAbs(a), 1e-12);
      expect(excess(get(padded, name), a, 0, floor), name).toBeLessThanOrEqual(1);
    }
  });
});

describe("a critic started from the causal LM's folder", () => {
  it("has a zero value head and saves a token-classification folder that loads back", async () => {
    const dir = tempDir();
    const [v0, v1] = [join(dir, "v0.safetensors"), join(dir, "v1.safetensors")];
    serve([
      load(POLICY),
      { op: "values", batch: BATCH, out: v0 },
      { op: "save_checkpoint", dir: join(dir, "ckpt") },
      load(join(dir, "ckpt", "critic")),
      { op: "values", batch: BATCH, out: v1 },
    ]);
    for (const out of [v0, v1]) {
      const values = get(await readFloats(out), "values");
      expect(values).toHaveLength(B * T);
      expect(values.every((x) => x === 0)).toBe(true);
    }

    const folder = join(dir, "ckpt", "critic");
    const config = JSON.parse(readFileSync(join(folder, "config.json"), "utf8"));
    expect(config.architectures).toEqual(["Qwen2ForTokenClassification"]);
    expect(config.id2label).toEqual({ "0": "LABEL_0" });
    expect(config.label2id).toEqual({ LABEL_0: 0 });
    const saved = await readFloats(join(folder, "model.safetensors"));
    expect([...saved.keys()].sort()).toEqual([...PARAMS].sort()); // no lm_head
    const lm = await readFloats(join(POLICY, "model.safetensors"));
    for (const name of PARAMS) {
      if (name.startsWith("score.")) {
        expect(
          get(saved, name).every((x) => x === 0),
          name,
        ).toBe(true);
      } else {
        expect(get(saved, name), name).toEqual(get(lm, name));
      }
    }
    expect(get(saved, "score.weight")).toHaveLength(64);
    expect(get(saved, "score.bias")).toHaveLength(1);
  });

  it("a trained critic's checkpoint reloads with the same values, bit for bit", async () => {
    const dir = tempDir();
    const [v0, v1] = [join(dir, "v0.safetensors"), join(dir, "v1.safetensors")];
    const optim = { lr: 1e-3, weight_decay: 0 };
    serve([
      load(POLICY, optim),
      { op: "update_critic", batch: BATCH, shuffle: false, ppo_max_token_len_per_gpu: BUDGET },
      { op: "values", batch: BATCH, out: v0 },
      { op: "save_checkpoint", dir: join(dir, "ckpt") },
      load(join(dir, "ckpt", "critic"), optim),
      { op: "values", batch: BATCH, out: v1 },
    ]);
    const [a, b] = [get(await readFloats(v0), "values"), get(await readFloats(v1), "values")];
    expect(maxAbs(a)).toBeGreaterThan(1e-3); // the update moved the value head off zero
    expect(b).toEqual(a);
  });
});
