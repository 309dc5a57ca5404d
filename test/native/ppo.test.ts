// searchr1-trainer grad --loss ppo (the actor's RL objective) against the PyTorch
// reference fixtures of test/native/make_ppo_fixtures.py (float64 from the fp32 weights of
// the untied model): loss, pg_loss, pg_clipfrac, kl_loss, entropy, log-probs and every
// parameter's gradient for each case (aggregation modes, KL types, dual clip on/off,
// asymmetric clip, entropy on/off, temperature, no KL term, defaults); values at ignored
// positions, NaN and inf included, change nothing; missing tensors and bad flags are named.
//
// Tolerances, from measured error (CPU backend, all cases). The five values: 1e-4 relative
// with an absolute floor of 1e-6 (measured worst 5.3e-6 relative, 1.1e-7 absolute, on a
// pg_loss of 0.02 that sums terms of both signs). Gradients, per entry: 1e-4 relative plus
// a floor of 1e-5 of the tensor's largest |entry| (measured: at most 2.4e-6 of it beyond
// 1e-4 relative; transformers run in float32 is off by 1.6e-6). Log-probs: 1e-4 absolute,
// as parity.test.ts (measured 2.9e-6). These still tell the cases apart: each case's
// output misses every other case's reference by more than 4000 times the tolerance.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  type NamedTensor,
  readSafetensors,
  readSafetensorsHeader,
  writeSafetensors,
} from "../../src/tensors/safetensors.js";
import { CPU, FIXTURES, get, maxAbs, modelDir, readFloats, tempDir, trainer } from "./helpers.js";

const MODEL = modelDir("untied");
const BATCH = join(FIXTURES, "ppo.batch.safetensors");
const CASES = join(FIXTURES, "ppo.cases.safetensors");
const VALUES = ["loss", "pg_loss", "pg_clipfrac", "kl_loss", "entropy"] as const;
const VALUE_REL = 1e-4;
const VALUE_FLOOR = 1e-6;
const GRAD_REL = 1e-4;
const GRAD_FLOOR = 1e-5; // times the tensor's largest |entry|

interface Case {
  name: string;
  flags: Record<string, string>;
  grads: "full" | "sampled";
  covers: string;
}

const cases = JSON.parse((await readSafetensorsHeader(CASES)).metadata.cases ?? "[]") as Case[];

/** The command line; `flags` may replace --loss ppo. */
function ppo(batch: string, out: string, flags: Record<string, string> = {}): string[] {
  return [
    ...["grad", "--model", MODEL, "--batch", batch, "--out", out],
    ...Object.entries({ "--loss": "ppo", ...flags }).flat(),
    ...CPU,
  ];
}

/** Runs grad --loss ppo and returns its outputs; fails with stderr unless it exits 0. */
async function run(flags: Record<string, string>, batch = BATCH) {
  const out = join(tempDir(), "ppo.safetensors");
  const r = trainer(ppo(batch, out, flags));
  if (r.code !== 0) throw new Error(`grad --loss ppo exited ${r.code}: ${r.stderr}`);
  return readFloats(out);
}

/** The worst excess of |got - want| over rel*|want| + floor, as a fraction of floor (> 1 fails). */
function excess(got: ArrayLike<number>, want: ArrayLike<number>, rel: number, floor: number) {
  expect(got.length).toBe(want.length);
  let worst = 0;
  for (let i = 0; i < want.length; i++) {
    const w = want[i] ?? Number.NaN;
    const err = Math.abs((got[i] ?? Number.NaN) - w);
    const ratio = (err - rel * Math.abs(w)) / floor;
    worst = Number.isNaN(ratio) ? Number.POSITIVE_INFINITY : Math.max(worst, ratio);
  }
  return worst;
}

describe("grad --loss ppo against PyTorch", async () => {
  const ref = await readFloats(CASES);
  const samples = new Map(
    [...(await readSafetensors(CASES))]
      .filter(([name]) => name.startsWith("sample."))
      .map(([name, t]) => [name.slice("sample.".length), Array.from(t.data, Number)]),
  );

  it("has the cases the fixtures promise", () => {
    expect(cases.map((c) => c.name)).toEqual([
      "search_r1",
      "seq_sum_kl",
      "seq_mean_mse_t07",
      "abs_kl",
      "dual_clip_off",
      "asymmetric_clip",
      "entropy_no_kl",
      "defaults",
    ]);
    expect(samples.size).toBeGreaterThan(20);
  });

  it.each(cases.map((c) => [c.name, c] as const))("%s", async (name, c) => {
    const got = await run(c.flags);
    for (const v of VALUES) {
      const want = get(ref, `${name}.${v}`);
      expect(
        excess(get(got, v), want, VALUE_REL, VALUE_FLOOR),
        `${v}: ${get(got, v)[0]} vs ${want[0]}`,
      ).toBeLessThanOrEqual(1);
    }

    // Log-probs at the case's temperature; unpredicted positions are exactly 0.
    const lp = get(got, "logprobs");
    const wantLp = get(ref, `${name}.logprobs`);
    expect(excess(lp, wantLp, 0, 1e-4), "logprobs").toBeLessThanOrEqual(1);
    wantLp.forEach((v, i) => {
      if (v === 0) expect(lp[i]).toBe(0);
    });

    // Every parameter's gradient: whole, or at the sampled flat indices.
    const gradNames = [...samples.keys()].map((n) => `grad.${n}`).sort();
    expect([...got.keys()].filter((k) => k.startsWith("grad.")).sort()).toEqual(gradNames);
    for (const g of gradNames) {
      const want = get(ref, `${name}.${g}`);
      const full = get(got, g);
      const at = get(samples, g.slice("grad.".length));
      const picked = c.grads === "full" ? full : at.map((i) => full[i] ?? Number.NaN);
      const floor = GRAD_FLOOR * Math.max(maxAbs(want), 1e-12);
      expect(excess(picked, want, GRAD_REL, floor), g).toBeLessThanOrEqual(1);
    }
  });
});

describe("grad --loss ppo inputs", async () => {
  const batch = await readSafetensors(BATCH);
  const tensors = (): NamedTensor[] => [...batch].map(([name, t]) => ({ name, ...t }));
  const write = async (list: NamedTensor[]) => {
    const file = join(tempDir(), "batch.safetensors");
    await writeSafetensors(file, list);
    return file;
  };
  const [B, T] = get(batch, "input_ids").shape as [number, number];

  it("ignores whatever old, ref and advantages hold off the loss tokens, NaN and inf too", async () => {
    const ids = get(batch, "attention_mask").data as BigInt64Array;
    const resp = get(batch, "response_mask").data as BigInt64Array;
    const poison = [Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY];
    let k = 0;
    const changed = tensors().map((t) => {
      if (!["old_log_probs", "ref_log_probs", "advantages"].includes(t.name)) return t;
      const data = Float32Array.from(t.data as Float32Array);
      for (let i = 0; i < data.length; i++) {
        const predicted = i % T > 0 && ids[i] === 1n && ids[i - 1] === 1n;
        if (!(predicted && resp[i] === 1n)) data[i] = poison[k++ % poison.length] ?? 0;
      }
      return { ...t, data };
    });
    const flags = cases.find((c) => c.name === "search_r1")?.flags ?? {};
    const [a, b] = [await run(flags), await run(flags, await write(changed))];
    expect([...b.keys()]).toEqual([...a.keys()]);
    for (const [name, values] of a) expect(get(b, name), name).toEqual(values);
  });

  it.each(["response_mask", "old_log_probs", "ref_log_probs", "advantages"])(
    "names a missing %s",
    async (missing) => {
      const file = await write(tensors().filter((t) => t.name !== missing));
      const r = trainer(ppo(file, join(tempDir(), "o"), { "--kl-loss-coef": "0.001" }));
      expect(r.code).toBe(1);
      expect(r.stderr).toContain(`${file}: tensor '${missing}' is missing`);
    },
  );

  it("names a tensor of the wrong shape", async () => {
    const list = tensors().map((t) =>
      t.name === "advantages" ? { ...t, shape: [B, T - 1], data: t.data.slice(0, B * (T - 1)) } : t,
    );
    const file = await write(list);
    const r = trainer(ppo(file, join(tempDir(), "o")));
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(
      `tensor 'advantages' has shape [${B}, ${T - 1}]; expected [${B}, ${T}]`,
    );
  });

  it.each([
    ["--clip-ratio", "-0.1"],
    ["--clip-ratio-low", "-1"],
    ["--clip-ratio-low", "1.5"],
    ["--clip-ratio-high", "-0.5"],
    ["--clip-ratio-c", "0.5"],
    ["--kl-loss-type", "full"],
    ["--kl-loss-coef", "-1"],
    ["--loss-agg-mode", "seq-mean"],
    ["--temperature", "0"],
    ["--clip-ratio", "abc"],
    ["--loss", "dpo"],
  ])("exits 2 for %s %s, naming the flag", (flag, value) => {
    const out = join(tempDir(), "o");
    const r = trainer(ppo(BATCH, out, { [flag]: value }));
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(flag);
    expect(existsSync(out)).toBe(false);
  });
});
