// The forward and backward PyTorch parity checks, shared by parity.test.ts (the default
// native/build trainer) and portable-gemm.test.ts (its own build on the portable sgemm): one
// `score` and one `grad` of a fixture model's case batch on the fp32 CPU backend, against the
// float64 reference that make_fixtures.py wrote into the case file.
import { join } from "node:path";
import { expect, it } from "vitest";
import {
  CPU,
  caseFile,
  get,
  type ModelName,
  maxAbs,
  maxAbsDiff,
  modelDir,
  readFloats,
  tempDir,
  trainerOk,
} from "./helpers.js";

/** Runs `op` (score or grad) on the model's case batch; its output and the reference. */
async function runCase(op: "score" | "grad", model: ModelName, exe?: string) {
  const out = join(tempDir(), `${op}.safetensors`);
  trainerOk(
    [op, "--model", modelDir(model), "--batch", caseFile(model), "--out", out, ...CPU],
    exe,
  );
  return { got: await readFloats(out), ref: await readFloats(caseFile(model)) };
}

/**
 * Defines, in the calling describe, the score and grad tests of `model` against PyTorch,
 * run with the searchr1-trainer at `exe` (default: native/build's).
 */
export function itMatchesPyTorch(model: ModelName, exe?: string): void {
  it("scores log-probs and entropies within 1e-4", async () => {
    const { got, ref } = await runCase("score", model, exe);
    for (const [name, refName] of [
      ["logprobs", "ref.logprobs"],
      ["entropy", "ref.entropy"],
    ] as const) {
      const a = get(got, name);
      const b = get(ref, refName);
      expect(maxAbsDiff(a, b)).toBeLessThan(1e-4);
      // Unpredicted positions (position 0, padding, first token after left padding) are 0.
      b.forEach((v, i) => {
        if (v === 0) expect(a[i]).toBe(0);
      });
    }
  });

  it("computes the weighted loss and every parameter gradient within 1e-3", async () => {
    const { got, ref } = await runCase("grad", model, exe);
    // The loss within 1e-4, relative once it exceeds 1.
    const refLoss = get(ref, "ref.loss")[0] ?? Number.NaN;
    expect(Math.abs((get(got, "loss")[0] ?? 0) - refLoss)).toBeLessThan(
      1e-4 * Math.max(1, Math.abs(refLoss)),
    );

    // Every parameter's gradient, no more and no fewer, each within 1e-3 of its own largest
    // |entry| (1e-6 at the least, so a vanishing gradient is held to an absolute bound).
    const gradNames = (m: Map<string, Float32Array>) =>
      [...m.keys()].filter((k) => k.startsWith("grad.")).sort();
    expect(gradNames(got)).toEqual(gradNames(ref));
    for (const name of gradNames(ref)) {
      const b = get(ref, name);
      const scale = Math.max(maxAbs(b), 1e-6);
      expect(maxAbsDiff(get(got, name), b) / scale, name).toBeLessThan(1e-3);
    }
  });
}
