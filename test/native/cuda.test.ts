// The CUDA backend (`--device cuda`: bf16 weights and activations, fp32 accumulation, fp32
// master weights, gradients and AdamW). Without a GPU this checks what can be checked
// anywhere: `info`, that the CUDA code compiled wherever nvcc is installed (CI), how
// `--device cuda` and `--device auto` behave, and the memory/timing reports on the CPU.
// With a GPU it checks the backend against the PyTorch fixtures and against the CPU
// backend on random shapes, within bf16 tolerances measured by bf16_tolerance.py.
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { readSafetensorsHeader } from "../../src/tensors/safetensors.js";
import {
  CPU,
  caseFile,
  get,
  MODELS,
  type ModelName,
  maxAbs,
  maxAbsDiff,
  modelDir,
  readFloats,
  tempDir,
  trainer,
  trainerOk,
} from "./helpers.js";
import {
  type ModelShape,
  paramSpecs,
  type RowPadding,
  writeRandomBatch,
  writeRandomModel,
} from "./random-model.js";

interface CudaStatus {
  built: boolean;
  available: boolean;
  reason: string;
  gpu: string;
  cublaslt: string;
}

/** `searchr1-trainer info`, read once to decide which tests run; undefined if it fails. */
function probeCuda(): CudaStatus | undefined {
  try {
    const r = trainer(["info"]);
    return (JSON.parse(r.stdout) as { cuda: CudaStatus }).cuda;
  } catch {
    return undefined; // the `info` test below says what went wrong
  }
}

const cuda = probeCuda();
const GPU = cuda?.available === true;
if (!GPU) {
  console.warn(
    `cuda.test.ts: the GPU tests are SKIPPED: ${cuda?.reason ?? "`searchr1-trainer info` failed"}`,
  );
}
const NVCC = spawnSync("nvcc", ["--version"]).error === undefined;
const DEVICES: ("cpu" | "cuda")[] = GPU ? ["cpu", "cuda"] : ["cpu"];
const CPU_NOTE = "searchr1: note: running on the CPU";

// bf16 tolerances. bf16 keeps 8 significant bits (relative rounding error up to 2^-9), so
// the CUDA results cannot match fp32 closely; test/native/bf16_tolerance.py emulates the
// backend's bf16 rounding on the fixtures and on every model of cuda-cases.json and
// measures the errors against float64. Each threshold is about 3-4x the largest error it
// measured (in brackets), room for a GPU rounding at a few more places or summing in
// another order. They still catch subtle bugs: when they were chosen, the same emulation
// with RoPE's theta doubled, the k bias dropped, or weights rounded to 4 significant bits
// exceeded the log-prob or gradient threshold on these models (a wrong head mapping or an
// unmasked padding key gives errors of order 1).
const TOL = {
  /** per token: |a - b| <= tol · (1 + |ref|), i.e. abs = rel = tol [1.17e-2] */
  logprob: 4e-2,
  /** all log-probs together: |a - b|_2 / |ref|_2 [4.95e-3] */
  logprobL2: 2e-2,
  /** per token, like the log-probs [9.61e-3] */
  entropy: 3e-2,
  /** |a - b| / sum |weights · ref log-probs|: the loss sums terms of both signs [1.35e-3] */
  loss: 5e-3,
  /** per tensor: max |a - b| / max |ref| (llm.c's per-tensor check) [7.79e-2] */
  grad: 0.25,
  /** 10-step fixture run: |loss - ref| at each step [2.40e-2] */
  sftLoss: 0.08,
  /** and |grad norm - ref| / ref at each step [8.23e-2] */
  sftNorm: 0.25,
};

/** Largest |a - b| / (1 + |ref|); unpredicted tokens (0 in ref) must be exactly 0. */
function tokenError(got: Float32Array, ref: Float32Array): number {
  expect(got.length).toBe(ref.length);
  let worst = 0;
  ref.forEach((r, i) => {
    const g = got[i] ?? Number.NaN;
    if (r === 0) expect(g, `token ${i} is not predicted`).toBe(0);
    worst = Math.max(worst, Math.abs(g - r) / (1 + Math.abs(r)));
  });
  return worst;
}

function l2Error(got: Float32Array, ref: Float32Array): number {
  let d = 0;
  let n = 0;
  ref.forEach((r, i) => {
    d += ((got[i] ?? Number.NaN) - r) ** 2;
    n += r * r;
  });
  return n === 0 ? Math.sqrt(d) : Math.sqrt(d / n);
}

function expectLogprobs(got: Map<string, Float32Array>, ref: Map<string, Float32Array>) {
  const lp = get(got, "logprobs");
  const refLp = get(ref, "logprobs");
  expect(tokenError(lp, refLp), "log-probs").toBeLessThan(TOL.logprob);
  expect(l2Error(lp, refLp), "log-probs, L2").toBeLessThan(TOL.logprobL2);
}

/** `score` output against a reference: log-probs and entropies. */
function expectScores(got: Map<string, Float32Array>, ref: Map<string, Float32Array>) {
  expectLogprobs(got, ref);
  const ent = tokenError(get(got, "entropy"), get(ref, "entropy"));
  expect(ent, "entropies").toBeLessThan(TOL.entropy);
}

/** `grad` output against a reference: the loss, the log-probs and every gradient. */
function expectGrads(
  got: Map<string, Float32Array>,
  ref: Map<string, Float32Array>,
  weights: Float32Array,
) {
  expectLogprobs(got, ref);
  const refLp = get(ref, "logprobs");
  const scale = weights.reduce((s, w, i) => s + Math.abs(w * (refLp[i] ?? 0)), 0);
  const dLoss = Math.abs((get(got, "loss")[0] ?? Number.NaN) - (get(ref, "loss")[0] ?? 0));
  // A batch with nothing to predict has loss 0 exactly.
  if (scale === 0) expect(dLoss).toBe(0);
  else expect(dLoss / scale, "loss").toBeLessThan(TOL.loss);

  const names = (m: Map<string, Float32Array>) =>
    [...m.keys()].filter((k) => k.startsWith("grad.")).sort();
  expect(names(got)).toEqual(names(ref));
  for (const name of names(ref)) {
    const r = get(ref, name);
    const g = get(got, name);
    const m = maxAbs(r);
    if (m === 0) expect(maxAbs(g), name).toBe(0);
    else expect(maxAbsDiff(g, r) / m, name).toBeLessThan(TOL.grad);
  }
}

function runScore(model: string, batch: string, extra: string[]) {
  const out = join(tempDir(), "score.safetensors");
  const r = trainerOk(["score", "--model", model, "--batch", batch, "--out", out, ...extra]);
  return { out, ...r };
}

function runGrad(model: string, batch: string, extra: string[]) {
  const out = join(tempDir(), "grad.safetensors");
  const r = trainerOk(["grad", "--model", model, "--batch", batch, "--out", out, ...extra]);
  return { out, ...r };
}

const jsonLines = <T>(text: string): T[] =>
  text
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as T);

interface StepMetrics {
  step: number;
  loss: number;
  grad_norm: number;
  lr: number;
  seconds: number;
  peak_memory_mb: number;
}

function sft(model: string, data: string, extra: string[]): StepMetrics[] {
  const dir = tempDir();
  const metrics = join(dir, "metrics.jsonl");
  trainerOk([
    ...["sft", "--model", model, "--data", data, "--out", join(dir, "out")],
    ...["--metrics", metrics, ...extra],
  ]);
  return jsonLines<StepMetrics>(readFileSync(metrics, "utf8"));
}

describe("searchr1-trainer info", () => {
  it("prints one JSON line with the CUDA status", () => {
    const r = trainerOk(["info"]);
    const lines = r.stdout.trim().split("\n");
    expect(lines).toHaveLength(1);
    const s = (JSON.parse(lines[0] ?? "") as { cuda: CudaStatus }).cuda;
    expect(typeof s.built).toBe("boolean");
    expect(typeof s.available).toBe("boolean");
    for (const key of ["reason", "gpu", "cublaslt"] as const) expect(typeof s[key]).toBe("string");
    if (s.available) {
      expect(s.built).toBe(true);
      expect(s.gpu).not.toBe("");
      expect(s.cublaslt).not.toBe("");
    } else {
      expect(s.reason).not.toBe("");
    }
  });

  // CI has nvcc but no GPU: this is what proves there that every kernel compiles.
  it.runIf(NVCC)("says the CUDA backend is built where nvcc is on the PATH", () => {
    // (A build folder once configured with SEARCHR1_CUDA=OFF keeps that setting.)
    expect(cuda?.built, `built without CUDA though nvcc is here: ${cuda?.reason}`).toBe(true);
  });
});

describe.skipIf(GPU)("without a usable GPU", () => {
  it("refuses --device cuda with exit 2 and the reason, and writes nothing", () => {
    const dir = tempDir();
    const message = `searchr1-trainer: --device cuda: ${cuda?.reason}`;
    const out = join(dir, "score.safetensors");
    const m = modelDir("untied");
    const r = trainer([
      ...["score", "--model", m, "--batch", caseFile("untied")],
      ...["--out", out, "--device", "cuda"],
    ]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(message);
    expect(existsSync(out)).toBe(false);
    const folder = join(dir, "trained");
    const s = trainer([
      ...["sft", "--model", m, "--data", caseFile("untied")],
      ...["--out", folder, "--device", "cuda"],
    ]);
    expect(s.code).toBe(2);
    expect(s.stderr).toContain(message);
    expect(existsSync(folder)).toBe(false);
  });

  it("runs --device auto (the default) on the CPU with a note, bit for bit as --device cpu", () => {
    for (const run of [runScore, runGrad]) {
      const cpu = run(modelDir("tied"), caseFile("tied"), CPU);
      expect(cpu.stderr).not.toContain(CPU_NOTE);
      for (const device of [["--device", "auto"], []]) {
        const auto = run(modelDir("tied"), caseFile("tied"), device);
        expect(auto.stderr.startsWith(CPU_NOTE), auto.stderr).toBe(true);
        expect(readFileSync(auto.out).equals(readFileSync(cpu.out))).toBe(true);
      }
    }
  });
});

// A model with several layers, so keeping every layer's activations (no --recompute)
// costs visibly more than keeping one layer's.
const MEMORY_SHAPE: ModelShape = {
  vocab: 1000,
  hidden: 256,
  intermediate: 768,
  layers: 6,
  heads: 4,
  kvHeads: 2,
  headDim: 64,
  tied: false,
  attentionBias: true,
};
const MEMORY_ROWS: RowPadding[] = [
  { left: 0, right: 0 },
  { left: 9, right: 0 },
  { left: 0, right: 30 },
  { left: 0, right: 0 },
];

describe.each(DEVICES)("reports on --device %s", (device) => {
  let model: string;
  let data: string;
  beforeAll(async () => {
    model = join(tempDir(), "model");
    data = join(tempDir(), "batch.safetensors");
    await writeRandomModel(model, MEMORY_SHAPE, 7);
    await writeRandomBatch(data, MEMORY_SHAPE.vocab, 128, MEMORY_ROWS, 8);
  }, 60_000);

  it("times each pass of score --repeat and writes the output once", async () => {
    const once = await readFloats(runScore(model, data, ["--device", device]).out);
    const r = runScore(model, data, ["--device", device, "--repeat", "3"]);
    const passes = jsonLines<{ pass: number; seconds: number; peak_memory_mb: number }>(r.stdout);
    expect(passes.map((p) => p.pass)).toEqual([1, 2, 3]);
    for (const p of passes) {
      expect(p.seconds).toBeGreaterThan(0);
      expect(p.peak_memory_mb).toBeGreaterThan(0);
    }
    const repeated = await readFloats(r.out);
    // The CPU is deterministic; a GPU's matmuls may sum in another order from run to run.
    if (device === "cpu") expect(repeated).toEqual(once);
    else expectScores(repeated, once);
  });

  it("reports each sft step's peak memory, lower with --recompute", () => {
    const args = ["--device", device, "--steps", "2", "--lr", "1e-4"];
    const full = sft(model, data, args);
    const recompute = sft(model, data, [...args, "--recompute"]);
    // Master weights, gradients and the two AdamW moments are fp32: 16 bytes a parameter,
    // all held during step 2, whatever else the backend keeps.
    const params = paramSpecs(MEMORY_SHAPE).reduce(
      (n, [, shape]) => n + shape.reduce((a, b) => a * b, 1),
      0,
    );
    const floor = (16 * params) / 2 ** 20;
    for (const steps of [full, recompute]) {
      expect(steps).toHaveLength(2);
      expect(steps[1]?.peak_memory_mb).toBeGreaterThan(floor);
    }
    const peak = (steps: StepMetrics[]) => Math.max(...steps.map((s) => s.peak_memory_mb));
    expect(peak(recompute)).toBeLessThan(peak(full));
  }, 120_000);
});

describe.runIf(GPU)("on a GPU", () => {
  it("runs --device auto on CUDA: no CPU note, and bf16 results, not the CPU's", async () => {
    const cpu = runScore(modelDir("untied"), caseFile("untied"), CPU);
    const auto = runScore(modelDir("untied"), caseFile("untied"), ["--device", "auto"]);
    expect(auto.stderr).not.toContain(CPU_NOTE);
    expect(readFileSync(auto.out).equals(readFileSync(cpu.out))).toBe(false);
    expectScores(await readFloats(auto.out), await readFloats(cpu.out));
  });

  it("refuses a head_dim its attention kernels are not built for, naming it", async () => {
    // 16, 32, 64 and 128 are built; 48 is valid for Qwen2 and runs on the CPU.
    const shape = { ...MEMORY_SHAPE, hidden: 96, heads: 2, kvHeads: 1, headDim: 48, layers: 1 };
    const dir = tempDir();
    const model = join(dir, "model");
    const batch = join(dir, "batch.safetensors");
    await writeRandomModel(model, shape, 9);
    await writeRandomBatch(batch, shape.vocab, 5, [{ left: 0, right: 0 }], 10);
    runScore(model, batch, CPU);
    const out = join(dir, "cuda.safetensors");
    const r = trainer([
      "score",
      "--model",
      model,
      "--batch",
      batch,
      "--out",
      out,
      "--device",
      "cuda",
    ]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("head_dim 48");
    expect(existsSync(out)).toBe(false);
  });
});

/** The fixture case's references under the names the trainer writes. */
async function fixtureRefs(m: ModelName): Promise<Map<string, Float32Array>> {
  const ref = await readFloats(caseFile(m));
  return new Map(
    [...ref].flatMap(([name, v]): [string, Float32Array][] => {
      if (name.startsWith("ref.")) return [[name.slice(4), v]];
      return name.startsWith("grad.") ? [[name, v]] : [];
    }),
  );
}

describe.runIf(GPU).each(MODELS)("%s model on CUDA against PyTorch (float64)", (m) => {
  it("scores log-probs and entropies within bf16 tolerance", async () => {
    const got = await readFloats(runScore(modelDir(m), caseFile(m), ["--device", "cuda"]).out);
    expectScores(got, await fixtureRefs(m));
  });

  it("computes the weighted loss and every gradient within bf16 tolerance", async () => {
    const got = await readFloats(runGrad(modelDir(m), caseFile(m), ["--device", "cuda"]).out);
    const weights = get(await readFloats(caseFile(m)), "weights");
    expectGrads(got, await fixtureRefs(m), weights);
  });

  it("follows the reference 10-step AdamW loss curve within bf16 tolerance", async () => {
    const header = await readSafetensorsHeader(caseFile(m));
    const hp = JSON.parse(header.metadata.sft ?? "{}") as Record<string, number | string>;
    const steps = sft(modelDir(m), caseFile(m), [
      ...["--device", "cuda", "--steps", String(hp.total_steps), "--lr", String(hp.lr)],
      ...["--lr-schedule", String(hp.schedule), "--warmup-steps", String(hp.warmup_steps)],
      ...["--min-lr-ratio", String(hp.min_lr_ratio), "--weight-decay", String(hp.weight_decay)],
      ...["--beta1", String(hp.beta1), "--beta2", String(hp.beta2), "--eps", String(hp.eps)],
      ...["--max-grad-norm", String(hp.max_grad_norm)],
    ]);
    const ref = await readFloats(caseFile(m));
    const losses = get(ref, "sft.loss");
    expect(steps).toHaveLength(losses.length);
    steps.forEach((s, i) => {
      expect(Math.abs(s.loss - (losses[i] ?? 0)), `step ${i + 1} loss`).toBeLessThan(TOL.sftLoss);
      const norm = get(ref, "sft.grad_norm")[i] ?? 0;
      expect(Math.abs(s.grad_norm - norm) / norm, `step ${i + 1} norm`).toBeLessThan(TOL.sftNorm);
      expect(s.lr).toBeCloseTo(get(ref, "sft.lr")[i] ?? 0, 7);
    });
    expect(steps.at(-1)?.loss ?? 0).toBeLessThan((steps[0]?.loss ?? 0) / 2);
  }, 120_000);
});

/** One random shape of cuda-cases.json (bf16_tolerance.py reads the same file). */
interface RandomCase {
  name: string;
  /** the model's seed; the batch's is seed + 1 */
  seed: number;
  T: number;
  rows: RowPadding[];
  model: ModelShape;
  /** trainer options of each CUDA run of score / grad, compared with one CPU run */
  score: string[][];
  grad: string[][];
}

const CASES = JSON.parse(
  readFileSync(new URL("./cuda-cases.json", import.meta.url), "utf8"),
) as RandomCase[];

describe.runIf(GPU).each(CASES)("CUDA against the CPU: $name", (c) => {
  let model: string;
  let batch: string;
  let cpuScore: Map<string, Float32Array>;
  let cpuGrad: Map<string, Float32Array>;
  let weights: Float32Array;
  beforeAll(async () => {
    model = join(tempDir(), "model");
    batch = join(tempDir(), "batch.safetensors");
    await writeRandomModel(model, c.model, c.seed);
    await writeRandomBatch(batch, c.model.vocab, c.T, c.rows, c.seed + 1);
    weights = get(await readFloats(batch), "weights");
    cpuScore = await readFloats(runScore(model, batch, CPU).out);
    cpuGrad = await readFloats(runGrad(model, batch, CPU).out);
  }, 60_000);

  for (const flags of c.score) {
    it(`score ${flags.join(" ") || "(defaults)"}`, async () => {
      const got = await readFloats(runScore(model, batch, ["--device", "cuda", ...flags]).out);
      expectScores(got, cpuScore);
    });
  }
  for (const flags of c.grad) {
    it(`grad ${flags.join(" ") || "(defaults)"}`, async () => {
      const got = await readFloats(runGrad(model, batch, ["--device", "cuda", ...flags]).out);
      expectGrads(got, cpuGrad, weights);
    });
  }
});
