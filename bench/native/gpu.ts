/**
 * GPU mode of `npm run bench:native -- --gpu` (bench/native/run.ts parses the options):
 * bf16 training and scoring throughput of searchr1's native trainer on CUDA against the same
 * model in PyTorch eager on the same GPU, on the very same random model files and batch.
 *
 * Shapes: Qwen2.5-0.5B and Qwen2.5-1.5B (tied embeddings), random weights written in bf16
 * by bench/native/torch_gpu.py `make` (which needs torch, not a GPU), batch 8 × 2048
 * uniformly random tokens. For each shape:
 *   train  `searchr1-trainer sft --device cuda` and `torch_gpu.py train` each run 1 + K
 *          steps (forward, token-mean cross-entropy, backward, clip at 1.0, AdamW lr 1e-4,
 *          weight decay 0.01; fp32 master weights, bf16 compute), with the same
 *          --micro-batch-size and --recompute when given. Each side times its own steps
 *          (the trainer's --metrics file; torch.cuda.synchronize + perf_counter in
 *          torch_gpu.py, whose docstring says exactly what the torch side computes).
 *   score  `searchr1-trainer score --device cuda --repeat 1+K` and `torch_gpu.py score`:
 *          forward passes giving every token's log-prob and entropy.
 * The first step or pass is a warm-up and is dropped; times are medians of the other K;
 * tokens/s = 8 × 2048 / median seconds. Peak memory is the largest of the K: searchr1's
 * peak_memory_mb (the bytes its backend's buffers held, so not the CUDA context or the
 * cuBLASLt workspace) and torch.cuda.max_memory_allocated (not the caching allocator's
 * unused reserve).
 *
 * MFU = tokens/s × FLOPs per token / the GPU's peak dense bf16 FLOP/s (H100 and H200: 989
 * TFLOP/s, A100: 312; other GPUs need --peak-tflops). FLOPs per token, training:
 * 6 × N + 6 × layers × T × heads × head_dim, N = every parameter, the lm_head matmul
 * included (a tied matrix counted once, as the head; an embedding lookup is no matmul),
 * the second term causal attention forward + backward; scoring: a third of that (2 × N +
 * 2 × layers × T × heads × head_dim). Both sides do the same work, so the ratios compare
 * throughput and MFU alike.
 *
 * Without torch + CUDA in --python, only searchr1's side is measured and the report says
 * the comparison was not run. A side that fails (out of memory, say) is reported as such.
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CliError } from "../../src/runtime/errors.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { packageRoot } from "../../src/runtime/package-root.js";
import { table } from "../../src/runtime/table.js";
import { fmt, log } from "../common.js";
import { QWEN25_05B, type Shape, STEP_FLAGS } from "./step.js";

export interface GpuOptions {
  /** timed steps / passes after one warm-up */
  steps: number;
  microBatchSize?: number;
  recompute: boolean;
  /** also profile one sft step and one score pass per shape (their tables printed) */
  profile: boolean;
  /** also time our side with each opt-in CUDA path (OPT_INS) */
  optIn: boolean;
  peakTflops?: number;
  python: string;
}

const SHAPES: Shape[] = [
  QWEN25_05B,
  {
    name: "Qwen2.5-1.5B",
    vocab: 151936,
    hidden: 1536,
    intermediate: 8960,
    layers: 28,
    heads: 12,
    kvHeads: 2,
    tied: true,
  },
];
/** The trainer's opt-in CUDA paths, not yet run on a GPU and off by default
 * (docs/gpu-status.md): --opt-in times our side again with each. */
const OPT_INS = [
  { name: "mma", env: { SEARCHR1_ATTENTION: "mma" }, what: "attention_mma.cu's attention" },
  {
    name: "tuned",
    env: { SEARCHR1_MATMUL_TUNING: "on" },
    what: "cuBLASLt's candidates timed",
  },
] as const;
type OptIn = (typeof OPT_INS)[number]["name"];

const BATCH = 8;
const SEQ = 2048;
/** Step-1 loss / grad norm differences above this (relative) mean not the same computation:
 * two bf16 computations of one step differ by about 1e-3 (test/native/bf16_tolerance.py). */
const AGREEMENT = 1e-2;
/** torch_gpu.py's exit codes: torch cannot be imported; the GPU ran out of memory. */
const NO_TORCH = 3;
const OOM = 4;

/** Dense bf16 peak of the GPUs we know, in TFLOP/s, by a pattern of the device name. */
const PEAK_TFLOPS: [RegExp, number][] = [
  [/H100|H200/, 989],
  [/A100/, 312],
];

interface CudaStatus {
  available: boolean;
  reason: string;
  gpu: string;
  cublaslt: string;
}

interface TorchStatus {
  torch: string;
  python: string;
  cuda: boolean;
  gpu: string;
  reason: string;
}

/** One timed line of either side: a training step or a scoring pass. */
interface Timed {
  seconds: number;
  peak_memory_mb: number;
  loss?: number;
  grad_norm?: number;
}

/** One side's run: its lines, or why there are none. */
type Run = { lines: Timed[]; median: number; peakMb: number } | { error: string };

interface Result {
  shape: Shape;
  params: number;
  train: { native: Run; torch?: Run; optIn: Partial<Record<OptIn, Run>> };
  score: { native: Run; torch?: Run; optIn: Partial<Record<OptIn, Run>> };
}

function fail(message: string, code = 1): never {
  console.error(`bench:native --gpu: ${message}`);
  process.exit(code);
}

/** Lines of JSON, 1 + K of them; the median and peak are over the K after the warm-up. */
function parseRun(text: string, expected: number, who: string): Run {
  const lines = text
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l) => JSON.parse(l) as Timed);
  if (lines.length !== expected) {
    return { error: `${who}: ${lines.length} lines reported, expected ${expected}` };
  }
  const timed = lines.slice(1);
  const sorted = timed.map((l) => l.seconds).sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  const median =
    sorted.length % 2 === 1
      ? (sorted[mid] as number)
      : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
  return { lines, median, peakMb: Math.max(...timed.map((l) => l.peak_memory_mb)) };
}

/** The last line of a failed child's stderr: its own account of what went wrong. */
function lastLine(stderr: string, fallback: string): string {
  return (
    stderr
      .trim()
      .split("\n")
      .filter((l) => l.trim() !== "")
      .at(-1) ?? fallback
  );
}

export function gpuBench(o: GpuOptions): void {
  let trainer: string;
  try {
    trainer = nativeExecutable("searchr1-trainer");
  } catch (err) {
    if (!(err instanceof CliError)) throw err;
    fail(err.message);
  }
  const info = spawnSync(trainer, ["info"], { encoding: "utf8" });
  if (info.status !== 0) fail(`searchr1-trainer info failed: ${info.stderr}`);
  const cuda = (JSON.parse(info.stdout) as { cuda: CudaStatus }).cuda;
  if (!cuda.available) fail(`searchr1-trainer cannot use a GPU here: ${cuda.reason}`);
  const known = PEAK_TFLOPS.find(([pattern]) => pattern.test(cuda.gpu));
  const peakTflops = o.peakTflops ?? known?.[1];
  if (peakTflops === undefined) {
    fail(`no peak bf16 TFLOP/s known for '${cuda.gpu}': pass --peak-tflops X`, 2);
  }

  const script = join(packageRoot(), "bench", "native", "torch_gpu.py");
  const python = (args: string[], inherit = false) =>
    spawnSync(o.python, [script, ...args], {
      encoding: "utf8",
      maxBuffer: 1 << 26,
      stdio: ["ignore", "pipe", inherit ? "inherit" : "pipe"],
    });
  const check = python(["check"]);
  if (check.error || check.status === NO_TORCH) {
    fail(
      `the random models are written by PyTorch, which ${o.python} does not have` +
        `${check.error ? " (not found)" : ""}; pass --python PATH of a Python with torch`,
    );
  }
  if (check.status !== 0) fail(`torch_gpu.py check failed: ${check.stderr}`);
  const torch = JSON.parse(check.stdout) as TorchStatus;
  if (!torch.cuda) log(`PyTorch ${torch.torch} cannot use the GPU (${torch.reason}).`);

  const steps = 1 + o.steps;
  const trainFlags = [
    ...(o.microBatchSize === undefined ? [] : ["--micro-batch-size", String(o.microBatchSize)]),
    ...(o.recompute ? ["--recompute"] : []),
  ];

  function torchRun(args: string[], who: string): Run {
    const r = python(args);
    if (r.status === OOM) return { error: "out of GPU memory" };
    if (r.status !== 0)
      return { error: `${who} failed: ${lastLine(r.stderr, `exit ${r.status}`)}` };
    return parseRun(r.stdout, steps, who);
  }

  function nativeRun(args: string[], who: string, metrics?: string, env = {}): Run {
    const r = spawnSync(trainer, args, {
      encoding: "utf8",
      maxBuffer: 1 << 26,
      env: { ...process.env, ...env },
    });
    if (r.status !== 0)
      return { error: `${who} failed: ${lastLine(r.stderr, `exit ${r.status}`)}` };
    return parseRun(metrics === undefined ? r.stdout : readFileSync(metrics, "utf8"), steps, who);
  }

  function benchShape(shape: Shape): Result {
    const work = mkdtempSync(join(tmpdir(), "searchr1-bench-gpu-"));
    try {
      log(`${shape.name}: writing a random bf16 model and a ${BATCH} × ${SEQ} batch ...`);
      const made = python(
        [
          ...["make", "--out", work, "--vocab", String(shape.vocab)],
          ...["--hidden", String(shape.hidden), "--intermediate", String(shape.intermediate)],
          ...["--layers", String(shape.layers), "--heads", String(shape.heads)],
          ...["--kv-heads", String(shape.kvHeads), ...(shape.tied ? ["--tied"] : [])],
          ...["--batch", String(BATCH), "--seq", String(SEQ)],
        ],
        true,
      );
      if (made.status !== 0) fail(`torch_gpu.py make failed (exit ${made.status})`);
      const params = (JSON.parse(made.stdout) as { params: number }).params;
      const model = join(work, "model");
      const data = join(work, "data.safetensors");
      const metrics = join(work, "metrics.jsonl");
      const common = ["--model", model, "--device", "cuda"];

      const sftArgs = [
        ...["sft", ...common, "--data", data, "--out", join(work, "out"), "--overwrite"],
        ...["--steps", String(steps), ...STEP_FLAGS],
        ...["--metrics", metrics, ...trainFlags],
      ];
      const scoreArgs = [
        ...["score", ...common, "--batch", data, "--out", join(work, "score.safetensors")],
        ...["--repeat", String(steps)],
      ];
      log(`${shape.name}: searchr1-trainer sft, ${steps} steps ...`);
      const nativeTrain = nativeRun(sftArgs, "searchr1-trainer sft", metrics);
      log(`${shape.name}: searchr1-trainer score, ${steps} passes ...`);
      const nativeScore = nativeRun(scoreArgs, "searchr1-trainer score");
      const optIn: Record<"train" | "score", Partial<Record<OptIn, Run>>> = {
        train: {},
        score: {},
      };
      for (const v of o.optIn ? OPT_INS : []) {
        log(`${shape.name}: searchr1-trainer sft and score with ${v.what} ...`);
        optIn.train[v.name] = nativeRun(sftArgs, `sft (${v.name})`, metrics, v.env);
        optIn.score[v.name] = nativeRun(scoreArgs, `score (${v.name})`, undefined, v.env);
      }
      if (o.profile) {
        // Separate runs, so that the events around every operation do not touch the timings
        // above. Device time per operation does not count the host's first-call set-up.
        const profiled = (args: string[], who: string) => {
          log(`${shape.name}: ${who} --profile ...`);
          const r = spawnSync(trainer, [...args, "--profile"], { encoding: "utf8" });
          const table = r.stderr.slice(Math.max(0, r.stderr.indexOf("profile (")));
          console.log(
            r.status === 0 ? `${shape.name}, ${who}: ${table}` : `${who} failed: ${r.stderr}`,
          );
        };
        profiled(
          [
            ...["sft", ...common, "--data", data, "--out", join(work, "out"), "--overwrite"],
            ...["--steps", "2", ...STEP_FLAGS, ...trainFlags],
          ],
          "searchr1-trainer sft, 2 steps",
        );
        profiled(
          [...["score", ...common, "--batch", data, "--out", join(work, "score.safetensors")]],
          "searchr1-trainer score, 1 pass",
        );
      }
      const result: Result = {
        shape,
        params,
        train: { native: nativeTrain, optIn: optIn.train },
        score: { native: nativeScore, optIn: optIn.score },
      };
      if (torch.cuda) {
        log(`${shape.name}: torch_gpu.py train, ${steps} steps ...`);
        result.train.torch = torchRun(
          [
            ...["train", "--model", model, "--data", data, "--steps", String(steps)],
            ...STEP_FLAGS,
            ...trainFlags,
          ],
          "torch_gpu.py train",
        );
        log(`${shape.name}: torch_gpu.py score, ${steps} passes ...`);
        result.score.torch = torchRun(
          ["score", "--model", model, "--data", data, "--repeat", String(steps)],
          "torch_gpu.py score",
        );
      }
      return result;
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  }

  const results = SHAPES.map(benchShape);
  report(results, o, cuda, torch, peakTflops);
}

/** Training FLOPs per token (forward + backward); scoring does a third of them. */
function trainFlopsPerToken(s: Shape, params: number): number {
  const headDim = s.hidden / s.heads;
  // The embedding lookup is no matmul: an untied embedding does not count (the lm_head
  // does); a tied matrix is counted once, as the head.
  const matmulParams = s.tied ? params : params - s.vocab * s.hidden;
  return 6 * matmulParams + 6 * s.layers * SEQ * s.heads * headDim;
}

function report(
  results: Result[],
  o: GpuOptions,
  cuda: CudaStatus,
  torch: TorchStatus,
  peakTflops: number,
): void {
  const tokens = BATCH * SEQ;
  // A side's four columns, or why it has no figures (in the first of them).
  const perSide = (run: Run | undefined, flops: number) =>
    run === undefined || "error" in run
      ? [run?.error ?? "not run", "–", "–", "–"]
      : [
          run.median.toFixed(3),
          fmt(tokens / run.median),
          `${fmt((100 * tokens * flops) / run.median / (peakTflops * 1e12), 1)}%`,
          fmt(run.peakMb / 1024, 1),
        ];
  const ratios = (native: Run, other: Run | undefined) =>
    other === undefined || "error" in native || "error" in other
      ? ["–", "–"]
      : [
          `${(other.median / native.median).toFixed(2)}×`,
          `${(native.peakMb / other.peakMb).toFixed(2)}×`,
        ];
  const header = [
    "shape",
    "params",
    "searchr1 s",
    "tokens/s",
    "MFU",
    "peak GiB",
    "torch s",
    "tokens/s",
    "MFU",
    "peak GiB",
    "speed ×",
    "memory ×",
  ];
  const rows = (which: "train" | "score", share: number) => [
    header,
    ...results.map((r) => {
      const flops = trainFlopsPerToken(r.shape, r.params) * share;
      const { native, torch: other } = r[which];
      return [
        r.shape.name,
        fmt(r.params),
        ...perSide(native, flops),
        ...perSide(other, flops),
        ...ratios(native, other),
      ];
    }),
  ];
  const right = new Set([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
  const settings = `micro-batch ${o.microBatchSize ?? BATCH}${o.recompute ? ", --recompute" : ""}`;
  const lines = [
    "",
    "## Native Qwen2 on the GPU vs PyTorch eager (bf16 compute, fp32 master weights)",
    "",
    `GPU: ${cuda.gpu}; searchr1 cuBLASLt: ${cuda.cublaslt}. ` +
      (torch.cuda
        ? `PyTorch ${torch.torch} (Python ${torch.python}) on ${torch.gpu}.`
        : `PyTorch side NOT RUN: PyTorch ${torch.torch} in ${o.python} cannot use the GPU ` +
          `(${torch.reason}); only searchr1's figures are shown.`),
    `Batch ${BATCH} × ${SEQ} random tokens; times are medians of ${o.steps} after 1 warm-up; ` +
      `MFU against ${peakTflops} TFLOP/s dense bf16` +
      (o.peakTflops === undefined ? " (from the GPU's name)" : " (--peak-tflops)") +
      "; speed × = searchr1 tokens/s ÷ torch tokens/s; memory × = searchr1 peak ÷ torch peak.",
    "",
    `### Training step (forward + backward + clip + AdamW; ${settings})`,
    "",
    ...table(rows("train", 1), right),
    "",
    "### Scoring (forward pass: log-probs and entropies of every token)",
    "",
    ...table(rows("score", 1 / 3), right),
  ];

  for (const v of o.optIn ? OPT_INS : []) {
    const env = Object.entries(v.env).map(([k, x]) => `${k}=${x}`);
    lines.push("", `With ${env.join(" ")} (${v.what}, opt-in), our side:`, "");
    for (const r of results) {
      for (const which of ["train", "score"] as const) {
        const { native, optIn } = r[which];
        const run = optIn[v.name];
        const figures = (x: Run | undefined) =>
          x === undefined || "error" in x ? (x?.error ?? "not run") : `${x.median.toFixed(3)} s`;
        const ratio =
          run === undefined || "error" in run || "error" in native
            ? ""
            : ` (${(native.median / run.median).toFixed(2)}× the default's speed)`;
        lines.push(
          `- ${r.shape.name} ${which}: ${v.name} ${figures(run)}, default ${figures(native)}${ratio}`,
        );
      }
    }
  }

  const agreement: string[][] = [
    ["shape", "searchr1 loss", "torch loss", "rel diff", "searchr1 norm", "torch norm", "rel diff"],
  ];
  const mismatches: string[] = [];
  for (const r of results) {
    const n = r.train.native;
    const t = r.train.torch;
    if (t === undefined || "error" in n || "error" in t) continue;
    const a = n.lines[0] as Timed;
    const b = t.lines[0] as Timed;
    const rel = (x = 0, y = 0) => Math.abs(x - y) / Math.max(Math.abs(y), 1e-12);
    const dLoss = rel(a.loss, b.loss);
    const dNorm = rel(a.grad_norm, b.grad_norm);
    agreement.push([
      r.shape.name,
      (a.loss ?? 0).toFixed(5),
      (b.loss ?? 0).toFixed(5),
      dLoss.toExponential(1),
      (a.grad_norm ?? 0).toFixed(5),
      (b.grad_norm ?? 0).toFixed(5),
      dNorm.toExponential(1),
    ]);
    if (dLoss > AGREEMENT || dNorm > AGREEMENT) mismatches.push(r.shape.name);
  }
  if (agreement.length > 1) {
    lines.push(
      "",
      "Same computation? Step 1 (same weights, same batch) on both sides:",
      "",
      ...table(agreement, new Set([1, 2, 3, 4, 5, 6])),
    );
  }
  if (mismatches.length > 0) {
    lines.push(
      "",
      `WARNING: step-1 loss or gradient norm differ by more than ${AGREEMENT} (relative) for ` +
        `${mismatches.join(", ")}: the two sides do not compute the same thing, so their ` +
        "throughputs are not comparable.",
    );
  }
  console.log(lines.join("\n"));
}
