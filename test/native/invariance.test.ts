// Results that must not depend on how a batch is laid out or computed: padding side,
// packing, logits chunk size, activation recomputation and micro-batching, on the CPU backend
// (--device cpu: its fp32 results allow these tight tolerances; cuda.test.ts covers CUDA).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { readSafetensors, writeSafetensors } from "../../src/tensors/safetensors.js";
import {
  CPU,
  caseFile,
  get,
  maxAbs,
  maxAbsDiff,
  modelDir,
  readFloats,
  tempDir,
  trainerOk,
} from "./helpers.js";

const MODEL = "tied";

async function caseInputs() {
  const t = await readSafetensors(caseFile(MODEL));
  const ids = get(t, "input_ids");
  const mask = get(t, "attention_mask");
  const [B = 0, T = 0] = ids.shape;
  return { ids: ids.data as BigInt64Array, mask: mask.data as BigInt64Array, B, T };
}

function score(batch: string, extra: string[] = []): Promise<Map<string, Float32Array>> {
  const out = join(tempDir(), "score.safetensors");
  trainerOk([
    "score",
    "--model",
    modelDir(MODEL),
    "--batch",
    batch,
    "--out",
    out,
    ...CPU,
    ...extra,
  ]);
  return readFloats(out);
}

function grad(extra: string[]): Promise<Map<string, Float32Array>> {
  const out = join(tempDir(), "grad.safetensors");
  trainerOk([
    "grad",
    "--model",
    modelDir(MODEL),
    "--batch",
    caseFile(MODEL),
    "--out",
    out,
    ...CPU,
    ...extra,
  ]);
  return readFloats(out);
}

function expectSameTensors(
  a: Map<string, Float32Array>,
  b: Map<string, Float32Array>,
  tol: number,
) {
  expect([...a.keys()].sort()).toEqual([...b.keys()].sort());
  for (const [name, x] of a) {
    const scale = Math.max(maxAbs(get(b, name)), 1e-6);
    expect(maxAbsDiff(x, get(b, name)) / scale, name).toBeLessThan(tol);
  }
}

describe("native layout invariance", () => {
  it("gives each row of a left/right-padded batch the log-probs it has alone, unpadded", async () => {
    const { ids, mask, B, T } = await caseInputs();
    const padded = await score(caseFile(MODEL));
    const dir = tempDir();
    for (let b = 0; b < B; b++) {
      const real: bigint[] = [];
      const where: number[] = [];
      for (let t = 0; t < T; t++) {
        if (mask[b * T + t] === 1n) {
          real.push(ids[b * T + t] ?? 0n);
          where.push(b * T + t);
        }
      }
      const file = join(dir, `row${b}.safetensors`);
      await writeSafetensors(file, [
        {
          name: "input_ids",
          dtype: "I32",
          shape: [1, real.length],
          data: Int32Array.from(real, Number),
        },
      ]);
      const alone = await score(file);
      const lp = get(alone, "logprobs");
      const ent = get(alone, "entropy");
      where.forEach((i, t) => {
        expect(Math.abs((lp[t] ?? 0) - (get(padded, "logprobs")[i] ?? 0))).toBeLessThan(1e-5);
        expect(Math.abs((ent[t] ?? 0) - (get(padded, "entropy")[i] ?? 0))).toBeLessThan(1e-5);
      });
    }
  });

  // score packs the batch's rows end to end into one (each sequence attending to itself
  // only); grad computes the padded [B, T] layout. Measured: 1.9e-6 at most (|log-prob| up to
  // 9.9: fp32 rounding); a sequence seeing its neighbour's keys would be off by far more.
  it("packs a left/right-padded batch to the padded forward's log-probs", async () => {
    const { mask } = await caseInputs();
    const packed = get(await score(caseFile(MODEL)), "logprobs");
    const padded = get(await grad([]), "logprobs");
    mask.forEach((m, i) => {
      const d = Math.abs((packed[i] ?? 0) - (padded[i] ?? 0));
      expect(m === 1n ? d < 1e-5 : packed[i] === 0, `position ${i}`).toBe(true);
    });
  });

  it("gives the same log-probs whatever the logits chunk size", async () => {
    const whole = await score(caseFile(MODEL), ["--logits-chunk", "100000"]);
    for (const chunk of ["1", "7"]) {
      const parts = await score(caseFile(MODEL), ["--logits-chunk", chunk]);
      expectSameTensors(parts, whole, 1e-6);
    }
  });

  it("gives the same gradients chunked, unchunked and with recomputation", async () => {
    const base = await grad(["--logits-chunk", "100000"]);
    expectSameTensors(await grad(["--logits-chunk", "3"]), base, 1e-5);
    expectSameTensors(await grad(["--recompute"]), base, 1e-6);
  });

  it("trains the same with gradient accumulation over micro-batches", () => {
    const run = (extra: string[]) => {
      const dir = tempDir();
      const metrics = join(dir, "m.jsonl");
      trainerOk([
        "sft",
        ...["--model", modelDir(MODEL), "--data", caseFile(MODEL), "--out", join(dir, "o")],
        ...["--steps", "4", "--lr", "5e-3", "--metrics", metrics, ...CPU, ...extra],
      ]);
      return readFileSync(metrics, "utf8")
        .trim()
        .split("\n")
        .map((l) => (JSON.parse(l) as { loss: number }).loss);
    };
    const whole = run([]);
    const micro = run(["--micro-batch-size", "1", "--recompute"]);
    expect(whole[3] ?? 0).toBeLessThan(whole[0] ?? 0);
    micro.forEach((l, i) => {
      expect(Math.abs(l - (whole[i] ?? 0))).toBeLessThan(1e-5);
    });
  });
});
