// The CPU backend against the PyTorch reference fixtures (test/native/make_fixtures.py,
// float64): log-probs and entropies, the weighted-objective loss and every gradient, and
// a 10-step AdamW training run. --device cpu throughout: the default, auto, would pick a
// GPU where there is one, whose bf16 results cuda.test.ts checks with bf16 tolerances.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { readSafetensorsHeader } from "../../src/tensors/safetensors.js";
import { CPU, caseFile, get, MODELS, modelDir, readFloats, tempDir, trainerOk } from "./helpers.js";
import { itMatchesPyTorch } from "./parity-checks.js";

describe.each(MODELS)("%s model against PyTorch", (model) => {
  // score's log-probs and entropies within 1e-4, grad's loss and gradients within 1e-3
  // (parity-checks.ts, which portable-gemm.test.ts runs on its portable sgemm build too).
  itMatchesPyTorch(model);

  it("follows the reference 10-step AdamW loss curve within 1e-4", async () => {
    const header = await readSafetensorsHeader(caseFile(model));
    const hp = JSON.parse(header.metadata.sft ?? "{}") as Record<string, number | string>;
    const dir = tempDir();
    const metrics = join(dir, "metrics.jsonl");
    trainerOk([
      "sft",
      ...["--model", modelDir(model), "--data", caseFile(model), "--out", join(dir, "out")],
      ...["--steps", String(hp.total_steps), "--lr", String(hp.lr)],
      ...["--lr-schedule", String(hp.schedule), "--warmup-steps", String(hp.warmup_steps)],
      ...["--min-lr-ratio", String(hp.min_lr_ratio), "--weight-decay", String(hp.weight_decay)],
      ...["--beta1", String(hp.beta1), "--beta2", String(hp.beta2), "--eps", String(hp.eps)],
      ...["--max-grad-norm", String(hp.max_grad_norm), "--metrics", metrics, ...CPU],
    ]);
    const steps = readFileSync(metrics, "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { loss: number; grad_norm: number; lr: number });
    const ref = await readFloats(caseFile(model));
    const losses = get(ref, "sft.loss");
    expect(steps).toHaveLength(losses.length);
    steps.forEach((s, i) => {
      expect(Math.abs(s.loss - (losses[i] ?? 0)), `step ${i + 1} loss`).toBeLessThan(1e-4);
      const norm = get(ref, "sft.grad_norm")[i] ?? 0;
      expect(Math.abs(s.grad_norm - norm) / norm, `step ${i + 1} grad norm`).toBeLessThan(1e-3);
      expect(s.lr).toBeCloseTo(get(ref, "sft.lr")[i] ?? 0, 7);
    });
    // The run really trains: the loss falls well below its start.
    expect(steps.at(-1)?.loss ?? 0).toBeLessThan((steps[0]?.loss ?? 0) / 2);
  });
});
