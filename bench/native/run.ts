/**
 * Benchmark: CPU training throughput (forward + backward + AdamW) of searchr1's native Qwen2
 * trainer against the same model in PyTorch eager (Debian's python3-torch, fp32), in the same
 * run, with the same thread count, on the very same random model files and batch.
 *
 * Usage: npm run build && npm run bench:native [-- OPTIONS]
 *   --steps K       timed steps per run, after one warm-up step (default 5)
 *   --threads N     CPU threads for both sides (default: all cores)
 *   --python PATH   the Python with torch (default /usr/bin/python3; with --gpu, python3)
 *   --rl            benchmark a GRPO actor update (PPO + KL loss, backward, AdamW) in
 *                   `searchr1-trainer serve` instead, padded and with padding removed
 *                   (bench/native/rl.ts says what it measures); with it (--steps default 3):
 *     --seq T                the batch's padded length (default 512; 16 sequences)
 *     --budget N             real tokens per micro-batch (default 4 × T)
 *     --attention sdpa|eager the torch side's attention (default sdpa)
 *   --gpu           benchmark the CUDA backend instead, against PyTorch on the same GPU
 *                   (bench/native/gpu.ts says what it measures); with it:
 *     --micro-batch-size N   sequences per forward/backward on both sides (default 8: all)
 *     --recompute            recompute layer activations in backward on both sides
 *     --peak-tflops X        the GPU's dense bf16 peak for MFU (known: H100, H200, A100)
 *     --profile              then one more sft step and score pass per shape with
 *                            --profile: the device time of each backend operation
 *     --opt-in               also time our sft and score with each opt-in CUDA path
 *                            (SEARCHR1_ATTENTION=mma, SEARCHR1_MATMUL_TUNING=on)
 *
 * Without --gpu:
 * For each model shape, bench/native/torch_step.py writes a seeded random fp32 Qwen2 folder
 * and a batch of 4 × 256 random tokens into a temporary folder; then `searchr1-trainer sft`
 * and `torch_step.py train` each run 1 + K steps of the same training step on them: token-mean
 * next-token cross-entropy over the whole batch, backward, grad-norm clipping at 1.0, AdamW
 * (lr 1e-4, weight decay 0.01). Each side times its own steps (the trainer's --metrics file,
 * time.perf_counter in Python), so process start-up and file loading are not counted. The
 * first step is a warm-up and is dropped; throughput = B × T tokens / the median step time.
 * Both sides start from the same weights and data, so their step-1 loss and gradient norm
 * must agree (fp32 rounding aside): the report shows them, and warns when they differ by more
 * than 1e-3 relative, as the comparison would then not be of the same computation.
 * LoRA against full fine-tuning: the trainer runs the same 1 + K steps once more with
 * `sft --lora-rank 8` (alpha 16, every linear layer of every decoder layer: PEFT's
 * all-linear), training the adapters alone on the frozen model; the report sets its median
 * step time and its peak memory (the most the trainer's backend held at once in a timed step,
 * as its --metrics file says) beside full fine-tuning's of the same run, with the ratios.
 * Its adapters' B starts at zero, so its step-1 loss must equal full fine-tuning's exactly
 * (a warning when it does not).
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { availableParallelism, cpus, loadavg, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { CliError } from "../../src/runtime/errors.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { packageRoot } from "../../src/runtime/package-root.js";
import { table } from "../../src/runtime/table.js";
import { readSafetensorsHeader } from "../../src/tensors/safetensors.js";
import { fmt, log, threadCappedEnv } from "../common.js";
import { gpuBench } from "./gpu.js";
import { rlBench } from "./rl.js";
import { CPU_SHAPES as SHAPES, type Shape, STEP_FLAGS, shapeArgs } from "./step.js";

const BATCH = 4;
const SEQ = 256;
/** Largest relative step-1 loss / grad-norm difference still taken as the same computation. */
const AGREEMENT = 1e-3;
/** The LoRA row's adapters: rank 8 on every linear layer (alpha: sft's default, 16). */
const LORA_RANK = 8;
const LORA_FLAGS = ["--lora-rank", String(LORA_RANK), "--lora-targets", "all-linear"];

const { values: opts } = parseArgs({
  options: {
    steps: { type: "string" },
    threads: { type: "string" },
    python: { type: "string" },
    gpu: { type: "boolean", default: false },
    "micro-batch-size": { type: "string" },
    recompute: { type: "boolean", default: false },
    profile: { type: "boolean", default: false },
    "opt-in": { type: "boolean", default: false },
    "peak-tflops": { type: "string" },
    rl: { type: "boolean", default: false },
    seq: { type: "string" },
    budget: { type: "string" },
    attention: { type: "string" },
  },
});

function positiveInt(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n <= 0) {
    console.error(`bench:native: --${name} expects a positive integer, got ${value}`);
    process.exit(2);
  }
  return n;
}

const timedSteps = positiveInt("steps", opts.steps, opts.rl ? 3 : 5);
const threads = positiveInt("threads", opts.threads, availableParallelism());
const python = opts.python ?? "/usr/bin/python3";
const script = join(packageRoot(), "bench", "native", "torch_step.py");
const childEnv = threadCappedEnv(threads);

/** One line of the trainer's --metrics file (torch_step.py prints the same). */
interface StepMetrics {
  step: number;
  loss: number;
  grad_norm: number;
  seconds: number;
  /** The trainer's: the most its backend held at once during the step (torch_step.py: none). */
  peak_memory_mb?: number;
}

/** One side's run of 1 + K steps. */
interface Run {
  steps: StepMetrics[];
  /** Median wall seconds of the K timed steps (the warm-up step excluded). */
  median: number;
  /** The trainer's largest peak over the timed steps, MiB (null for torch). */
  peakMiB: number | null;
}

function parseSteps(text: string, who: string): Run {
  const steps = text
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line) as StepMetrics);
  if (steps.length !== 1 + timedSteps) {
    throw new Error(`${who}: ${steps.length} steps reported, expected ${1 + timedSteps}`);
  }
  const timed = steps
    .slice(1)
    .map((s) => s.seconds)
    .sort((a, b) => a - b);
  const mid = timed.length >> 1;
  const median =
    timed.length % 2 === 1
      ? (timed[mid] as number)
      : ((timed[mid - 1] as number) + (timed[mid] as number)) / 2;
  const peaks = steps.slice(1).map((s) => s.peak_memory_mb);
  const peakMiB = peaks.every((p) => p !== undefined) ? Math.max(...(peaks as number[])) : null;
  return { steps, median, peakMiB };
}

/** Runs torch_step.py; exits with install instructions when torch cannot be imported. */
function runPython(args: string[]): string {
  const r = spawnSync(python, [script, ...args], {
    encoding: "utf8",
    env: childEnv,
    stdio: ["ignore", "pipe", "inherit"],
  });
  if (r.error || r.status === 3) {
    console.error(
      "bench:native needs PyTorch, the competitor it measures against, in " +
        `${python}${r.error ? " (not found)" : ""}.\n` +
        "  Debian/Ubuntu: apt-get update && apt-get install -y python3-torch libopenblas0\n" +
        "  (another Python with torch: pass --python PATH)",
    );
    process.exit(1);
  }
  if (r.status !== 0) throw new Error(`torch_step.py ${args[0]} failed (exit ${r.status})`);
  return r.stdout;
}

/** The trainer's path; exits with a message when it has not been built. */
function findTrainer(): string {
  try {
    return nativeExecutable("searchr1-trainer");
  } catch (err) {
    if (!(err instanceof CliError)) throw err;
    console.error(`bench:native: ${err.message}`);
    process.exit(1);
  }
}

/** `searchr1-trainer sft` with `flags` added (LORA_FLAGS for the LoRA row); `name` keeps its
 * metrics file and --out folder apart. */
function runNative(trainer: string, work: string, flags: string[] = [], name = "native"): Run {
  const metrics = join(work, `${name}-metrics.jsonl`);
  // The trainer's per-step lines go to stderr as progress; the figures come from --metrics.
  const r = spawnSync(
    trainer,
    [
      "sft",
      "--model",
      join(work, "model"),
      "--data",
      join(work, "data.safetensors"),
      "--out",
      join(work, `${name}-out`),
      "--overwrite",
      "--steps",
      String(1 + timedSteps),
      ...STEP_FLAGS,
      ...flags,
      "--threads",
      String(threads),
      "--metrics",
      metrics,
    ],
    { env: childEnv, stdio: ["ignore", 2, "inherit"] },
  );
  if (r.status !== 0) throw new Error(`searchr1-trainer sft failed (exit ${r.status})`);
  return parseSteps(readFileSync(metrics, "utf8"), "searchr1-trainer");
}

function runTorch(work: string): Run {
  const out = runPython([
    "train",
    "--model",
    join(work, "model"),
    "--data",
    join(work, "data.safetensors"),
    "--steps",
    String(1 + timedSteps),
    "--threads",
    String(threads),
    ...STEP_FLAGS,
  ]);
  return parseSteps(out, "torch_step.py");
}

interface Result {
  shape: Shape;
  params: number;
  native: Run;
  torch: Run;
  /** The same native steps training LoRA adapters alone, and their parameter count. */
  lora: Run;
  loraParams: number;
}

async function benchShape(trainer: string, shape: Shape): Promise<Result> {
  const work = mkdtempSync(join(tmpdir(), "searchr1-bench-native-"));
  try {
    log(`${shape.name}: writing a random model and batch to ${work} ...`);
    const made = JSON.parse(
      runPython([
        "make",
        "--out",
        work,
        ...shapeArgs(shape),
        "--batch",
        String(BATCH),
        "--seq",
        String(SEQ),
      ]),
    ) as { params: number };
    log(`${shape.name}: searchr1-trainer sft, ${1 + timedSteps} steps ...`);
    const native = runNative(trainer, work);
    log(`${shape.name}: torch_step.py train, ${1 + timedSteps} steps ...`);
    const torch = runTorch(work);
    log(
      `${shape.name}: searchr1-trainer sft --lora-rank ${LORA_RANK}, ${1 + timedSteps} steps ...`,
    );
    const lora = runNative(trainer, work, LORA_FLAGS, "lora");
    // The adapters' size, read off the PEFT folder sft wrote.
    const header = await readSafetensorsHeader(join(work, "lora-out", "adapter_model.safetensors"));
    const loraParams = header.tensors.reduce((n, t) => n + t.shape.reduce((a, b) => a * b, 1), 0);
    return { shape, params: made.params, native, torch, lora, loraParams };
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

const relDiff = (a: number, b: number) => Math.abs(a - b) / Math.max(Math.abs(b), 1e-12);

async function main() {
  const trainer = findTrainer();
  const versions = JSON.parse(runPython(["check"])) as {
    torch: string;
    python: string;
    blas: string;
  };
  const cpu = cpus()[0]?.model.trim() ?? "unknown CPU";
  const loadBefore = loadavg()[0] as number;
  const results: Result[] = [];
  for (const shape of SHAPES) results.push(await benchShape(trainer, shape));

  const tokens = BATCH * SEQ;
  const lines: string[] = [
    "",
    "## Native Qwen2 training vs PyTorch eager (CPU, fp32)",
    "",
    `Machine: ${cpu}, ${availableParallelism()} cores, ${fmt(totalmem() / 2 ** 30, 1)} GiB RAM; ` +
      `${threads} threads for both sides. PyTorch ${versions.torch} (Python ${versions.python}, ` +
      `BLAS ${versions.blas}). 1-minute load average ${loadBefore.toFixed(2)} at the start, ` +
      `${(loadavg()[0] as number).toFixed(2)} at the end (other work on the machine skews the figures).`,
    `Step: forward + backward + clip + AdamW on ${BATCH} × ${SEQ} tokens; tokens/s = ` +
      `${tokens} / the median of ${timedSteps} step${timedSteps === 1 ? "" : "s"} after 1 warm-up step.`,
    "",
    ...table(
      [
        [
          "shape",
          "params",
          "V / H / I / layers / heads / kv",
          "native s/step",
          "native tokens/s",
          "torch s/step",
          "torch tokens/s",
          "native / torch",
        ],
        ...results.map((r) => [
          r.shape.name,
          fmt(r.params),
          `${r.shape.vocab} / ${r.shape.hidden} / ${r.shape.intermediate} / ${r.shape.layers} / ` +
            `${r.shape.heads} / ${r.shape.kvHeads}${r.shape.tied ? ", tied" : ", untied"}`,
          r.native.median.toFixed(3),
          fmt(tokens / r.native.median),
          r.torch.median.toFixed(3),
          fmt(tokens / r.torch.median),
          `${(r.torch.median / r.native.median).toFixed(2)}×`,
        ]),
      ],
      new Set([1, 3, 4, 5, 6, 7]),
    ),
    "",
    "Same computation? Step 1 (same weights, same batch) on both sides:",
    "",
  ];
  const agreement: string[][] = [
    [
      "shape",
      "native loss",
      "torch loss",
      "rel diff",
      "native grad norm",
      "torch grad norm",
      "rel diff",
    ],
  ];
  const mismatches: string[] = [];
  for (const r of results) {
    const n = r.native.steps[0] as StepMetrics;
    const t = r.torch.steps[0] as StepMetrics;
    const dLoss = relDiff(n.loss, t.loss);
    const dNorm = relDiff(n.grad_norm, t.grad_norm);
    agreement.push([
      r.shape.name,
      n.loss.toFixed(6),
      t.loss.toFixed(6),
      dLoss.toExponential(1),
      n.grad_norm.toFixed(6),
      t.grad_norm.toFixed(6),
      dNorm.toExponential(1),
    ]);
    if (dLoss > AGREEMENT || dNorm > AGREEMENT) mismatches.push(r.shape.name);
  }
  lines.push(...table(agreement, new Set([1, 2, 3, 4, 5, 6])));
  if (mismatches.length > 0) {
    lines.push(
      "",
      `WARNING: step-1 loss or gradient norm differ by more than ${AGREEMENT} (relative) for ` +
        `${mismatches.join(", ")}: the two sides do not compute the same thing, so their ` +
        "throughputs are not comparable.",
    );
  }
  lines.push(...loraLines(results));
  console.log(lines.join("\n"));
}

/** The LoRA row: its step time and peak memory beside full fine-tuning's, the same run's. */
function loraLines(results: Result[]): string[] {
  const mib = (r: Run) => (r.peakMiB === null ? "?" : fmt(r.peakMiB, 1));
  const ratio = (full: number | null, lora: number | null) =>
    full === null || lora === null ? "?" : `${(full / lora).toFixed(2)}×`;
  const lines = [
    "",
    `## LoRA rank ${LORA_RANK} (all-linear, alpha 16) vs full fine-tuning, the native trainer (CPU, fp32)`,
    "",
    "The same steps, model and batch with `sft --lora-rank`: the adapters trained alone on the " +
      "frozen model. Peak = the most the trainer's backend held at once in a timed step " +
      "(its --metrics file's peak_memory_mb).",
    "",
    ...table(
      [
        [
          "shape",
          "trained params (full / LoRA)",
          "full s/step",
          "LoRA s/step",
          "full / LoRA time",
          "full peak MiB",
          "LoRA peak MiB",
          "full / LoRA memory",
        ],
        ...results.map((r) => [
          r.shape.name,
          `${fmt(r.params)} / ${fmt(r.loraParams)}`,
          r.native.median.toFixed(3),
          r.lora.median.toFixed(3),
          `${(r.native.median / r.lora.median).toFixed(2)}×`,
          mib(r.native),
          mib(r.lora),
          ratio(r.native.peakMiB, r.lora.peakMiB),
        ]),
      ],
      new Set([1, 2, 3, 4, 5, 6, 7]),
    ),
  ];
  // B starts at zero: LoRA's first forward is the frozen model's, bit for bit.
  const differ = results.filter((r) => r.lora.steps[0]?.loss !== r.native.steps[0]?.loss);
  if (differ.length > 0) {
    lines.push(
      "",
      `WARNING: LoRA's step-1 loss differs from full fine-tuning's for ${differ.map((r) => r.shape.name).join(", ")}: ` +
        "with B at zero they must be equal, so the two runs are not of the same model and batch.",
    );
  }
  return lines;
}

function positiveNumber(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!(n > 0) || !Number.isFinite(n)) {
    console.error(`bench:native: --${name} expects a positive number, got ${value}`);
    process.exit(2);
  }
  return n;
}

if (opts.gpu) {
  if (opts.rl) {
    console.error("bench:native: --rl and --gpu are separate benchmarks");
    process.exit(2);
  }
  if (opts.threads !== undefined) {
    console.error("bench:native: --threads is for the CPU benchmark, not --gpu");
    process.exit(2);
  }
  gpuBench({
    steps: timedSteps,
    microBatchSize:
      opts["micro-batch-size"] === undefined
        ? undefined
        : positiveInt("micro-batch-size", opts["micro-batch-size"], 0),
    recompute: opts.recompute,
    profile: opts.profile,
    optIn: opts["opt-in"],
    peakTflops: positiveNumber("peak-tflops", opts["peak-tflops"]),
    python: opts.python ?? "python3",
  });
} else {
  for (const gpuOnly of [
    "micro-batch-size",
    "recompute",
    "peak-tflops",
    "profile",
    "opt-in",
  ] as const) {
    if (opts[gpuOnly]) {
      console.error(`bench:native: --${gpuOnly} needs --gpu`);
      process.exit(2);
    }
  }
  if (opts.rl) {
    const attention = opts.attention ?? "sdpa";
    if (attention !== "sdpa" && attention !== "eager") {
      console.error(`bench:native: --attention expects sdpa or eager, got ${attention}`);
      process.exit(2);
    }
    await rlBench({
      steps: timedSteps,
      threads,
      python,
      seq: positiveInt("seq", opts.seq, 512),
      budget: opts.budget === undefined ? undefined : positiveInt("budget", opts.budget, 0),
      attention,
    });
  } else {
    for (const rlOnly of ["seq", "budget", "attention"] as const) {
      if (opts[rlOnly] !== undefined) {
        console.error(`bench:native: --${rlOnly} needs --rl`);
        process.exit(2);
      }
    }
    await main();
  }
}
