// `searchr1 quickstart` end to end, shortened (a few warm-start and RL steps): every real
// command runs in order and the figures, reports, run and plots are where it says.
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, expect, it } from "vitest";
import { startCli } from "../helpers/cli.js";

const dir = mkdtempSync(path.join(os.tmpdir(), "searchr1-quickstart-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

it("runs world → preprocess → build-index → sft → eval → train → eval and reports before/after", async () => {
  const out = path.join(dir, "qs");
  const r = await startCli([
    "quickstart",
    "--dir",
    out,
    "--threads",
    "1",
    "sft_steps=20",
    "train_steps=2",
  ]).result;
  expect(r.code, r.stderr.slice(-3000)).toBe(0);
  for (const phase of [
    "preprocess",
    "build-index",
    "warm start",
    "serve-retriever",
    "eval of the warm-started model",
    "train (grpo)",
    "eval of the trained model",
  ]) {
    expect(r.stderr).toContain(`== ${phase}`);
  }
  const figures = JSON.parse(readFileSync(path.join(out, "quickstart.json"), "utf8"));
  expect(Object.keys(figures).sort()).toEqual(["after", "algorithm", "before", "seconds", "seed"]);
  for (const side of [figures.before, figures.after]) {
    expect(Object.keys(side).sort()).toEqual(["em", "searches_per_question", "valid_action_rate"]);
    expect(side.em).toBeGreaterThanOrEqual(0);
    expect(side.em).toBeLessThanOrEqual(1);
  }
  expect(figures).toMatchObject({ algorithm: "grpo", seed: 1 });
  // The pooled EM equals the trajectories' mean.
  const records = readFileSync(path.join(out, "eval-after", "trajectories.jsonl"), "utf8")
    .split("\n")
    .filter((l) => l)
    .map((l) => JSON.parse(l) as { em: number });
  expect(figures.after.em).toBeCloseTo(records.reduce((s, x) => s + x.em, 0) / records.length, 12);
  expect(r.stdout).toMatch(/warm start \(before\)\s+\d\.\d{3}/);
  expect(r.stdout).toMatch(/after GRPO\s+\d\.\d{3}/);
  const run = path.join(out, "runs", "quickstart", "grpo");
  expect(existsSync(path.join(run, "plots", "reward.svg"))).toBe(true);
  expect(existsSync(path.join(run, "global_step_2", "policy", "model.safetensors"))).toBe(true);
}, 600_000);
