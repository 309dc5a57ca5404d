/**
 * GPU mode of `npm run bench:engine -- --gpu` (bench/engine/run.ts parses the options):
 * generation speed of searchr1's native inference engine (searchr1-engine --device cuda, bf16)
 * against Hugging Face transformers' `generate` (bf16, cuda, eager) on the same GPU, on the
 * very same random model folders and prompt tokens, greedy, in the same run.
 *
 * Model folders (random weights written in bf16 by bench/engine/hf_generate.py
 * `make --dtype bfloat16`, i.e. transformers' save_pretrained: config.json + model.safetensors;
 * rope_theta 1e6, qkv biases, tied embeddings), picked with --shapes (default both):
 *   0.5b      Qwen2.5-0.5B's shape: vocab 151,936, hidden 896, intermediate 4,864, 24 layers,
 *             14 heads, 2 kv heads (494M parameters)
 *   0.5b-32k  the same with a vocabulary of 32,000, to show what the vocabulary costs a step
 *
 * Workloads (prompt tokens drawn uniformly from the vocabulary by src/runtime/rng.ts's Rng,
 * seeded; every sequence greedy and run to exactly max_new_tokens: ignore_eos on our side,
 * no EOS on theirs):
 *   decode B  for B = 1, 8, 32, 128, 256: B prompts of 64 tokens, 128 new tokens each, all
 *             submitted at once. Decode step time = (the last `done` − the moment every
 *             sequence had its first token) / 127, the tokens each sequence generates after
 *             its first; tok/s = B / that step time. The engine runs with --chunk-tokens
 *             16,384 (256 × 64), so that a batch's prompts are prefilled together and its
 *             sequences decode together. The engine reads its stdin 64 KiB at a time, so the
 *             requests of a large batch may start over a few steps, and as many of the last
 *             timed steps then run part of the batch (B = 256 at vocab 151,936: 2 of 127); the
 *             report warns when that is over 5 % of the timed steps.
 *             transformers: B = 1 and 128 only, with the same formula: its first-token moment
 *             is the first call of a logits processor that synchronises the GPU there (see
 *             hf_generate_gpu.py); the tok/s of its whole generate calls, prefill included,
 *             is printed under the table too.
 *   decode B=128, top-p 0.95  the B = 128 decode with the v0.2 recipes' sampling (temperature
 *             1, top_p 0.95, request i seeded i): the filtered sampler's cost per step (ours
 *             only; on random weights most rows' cut falls past the device's 1,024
 *             candidates, so this is near its worst case, the host finishing them).
 *   prefill   128 prompts of 64 tokens, 1 new token: time from writing the requests to the
 *             last `done` (transformers: the generate call, max_new_tokens=1); tok/s = prompt
 *             tokens (8,192) / that time.
 *   GRPO      16 prompts × 8 samples = 128 sequences, all submitted at once: each prompt is
 *             one shared 300-token prefix + a distinct suffix of 17–32 tokens; 256 new tokens
 *             each; tok/s = generated tokens (32,768) / the whole workload's time, prefill
 *             included. Our engine gets 128 separate requests and finds the shared prefix
 *             itself; transformers runs the 128 sequences as ONE left-padded batch (attention
 *             mask) through one generate call.
 *
 * Our side: searchr1-engine driven directly over its stdio protocol (bench/engine/stdio.ts),
 * one process per model folder: --device cuda --context-length 1024 --max-running 256
 * --chunk-tokens 16384 and the default KV cache (room for 256 sequences of 1,024 tokens);
 * model load, an untimed warm-up (8 prompts of 64 tokens, 8 new tokens), then each workload,
 * the prefix cache flushed (`flush_cache`) before each. Times are Node's performance.now() as
 * the engine's events are read. GPU utilisation: `nvidia-smi --query-gpu=utilization.gpu
 * -lms 100` runs beside our workloads; its samples that fall inside a workload are averaged.
 * Their side: bench/engine/hf_generate_gpu.py `generate` (its docstring says exactly what it
 * does and times: torch.cuda.synchronize() around each generate call), after an untimed
 * warm-up, with the GPU to itself (our engine has exited by then).
 * speed × = ours tok/s ÷ transformers tok/s.
 *
 * --eager runs the decode workloads again on a second engine process with --enforce-eager (every
 * step op by op, no CUDA graphs) after its own warm-up, and shows its ms per step beside.
 *
 * --opt-in does the same on one engine per opt-in CUDA path, not yet run on a GPU and off by
 * default (docs/gpu-status.md), a column each: SEARCHR1_GEMV=auto (gemv.cu's kernel where
 * it beats cuBLASLt on a product of up to 8 rows), SEARCHR1_FUSED_DECODE=on with it (the fused
 * decode kernels, the gate/up GEMV ending in SwiGLU), SEARCHR1_MATMUL_TUNING=on (cuBLASLt's
 * candidates timed) and SEARCHR1_FILTERED_SAMPLING=device (which changes only the top-p row).
 *
 * --profile passes --profile to the engine (a device timer around every operation, which
 * slows it), takes the engine's `profile` after each workload (the device time of each
 * operation since the last one) and prints a table per workload: where a batch-1 decode step
 * goes, apart from the batch-256 one; it is refused when the engine's --help does not list
 * --profile.
 *
 * Exits 1 with a message when there is no usable GPU (`searchr1-trainer info`, and the
 * engine's `ready` event must say device cuda). The random models need torch and transformers
 * in --python (on the CPU is enough); where that torch cannot use the GPU, only our side is
 * measured and the report says the comparison was not run.
 */
import { type ChildProcessWithoutNullStreams, spawn, spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { createInterface } from "node:readline";
import { CliError } from "../../src/runtime/errors.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { packageRoot } from "../../src/runtime/package-root.js";
import { Rng } from "../../src/runtime/rng.js";
import { table } from "../../src/runtime/table.js";
import { fmt, log } from "../common.js";
import { type Shape as NativeShape, QWEN25_05B, shapeArgs } from "../native/step.js";
import { type EngineEvent, EngineProcess, greedy } from "./stdio.js";

export interface EngineGpuOptions {
  /** A Python with torch and transformers (with CUDA for the comparison). */
  python: string;
  /** --shapes as given: comma-separated keys of SHAPES. */
  shapes?: string;
  keep: boolean;
  profile: boolean;
  /** also run the decode workloads with --enforce-eager */
  eager: boolean;
  /** also run the decode workloads with each opt-in CUDA path */
  optIn: boolean;
}

/** Operations shown per workload with --profile (the largest). */
const PROFILE_ROWS = 12;
/** The engines the decode workloads run on again, beside the default one, for a column each;
 * `option` is the one that asks for it. */
const VARIANTS = [
  { key: "eager", option: "eager", column: "eager ms", args: ["--enforce-eager"], env: {} },
  { key: "gemv", option: "optIn", column: "GEMV ms", args: [], env: { SEARCHR1_GEMV: "auto" } },
  {
    key: "fused",
    option: "optIn",
    column: "fused ms",
    args: [],
    env: { SEARCHR1_FUSED_DECODE: "on", SEARCHR1_GEMV: "auto" },
  },
  {
    key: "tuned",
    option: "optIn",
    column: "tuned ms",
    args: [],
    env: { SEARCHR1_MATMUL_TUNING: "on" },
  },
  {
    key: "device",
    option: "optIn",
    column: "device filter ms",
    args: [],
    env: { SEARCHR1_FILTERED_SAMPLING: "device" },
  },
] as const;
type Variant = (typeof VARIANTS)[number]["key"];

interface Shape extends NativeShape {
  key: string;
}

const SHAPES: Shape[] = [
  { ...QWEN25_05B, key: "0.5b" },
  { ...QWEN25_05B, key: "0.5b-32k", name: "Qwen2.5-0.5B, 32k vocab", vocab: 32000 },
];
const DECODE_BATCHES = [1, 8, 32, 128, 256];
/** The decode batches transformers runs too. */
const THEIR_DECODE_BATCHES = new Set([1, 128]);
const DECODE_PROMPT = 64;
const DECODE_NEW = 128;
const PREFILL_SEQS = 128;
const PREFILL_PROMPT = 64;
const GRPO_PROMPTS = 16;
const GRPO_SAMPLES = 8;
const GRPO_PREFIX = 300;
const GRPO_SUFFIX_MIN = 17;
const GRPO_NEW = 256;
const WARM_SEQS = 8;
const WARM_NEW = 8;
const BLOCK = 16;
const CONTEXT = 1024;
const MAX_RUNNING = 256;
/** Every decode batch's prompts in one prefill step. */
const CHUNK_TOKENS = Math.max(...DECODE_BATCHES) * DECODE_PROMPT;
const SEED = 20250501;
/** Token ids the prompts avoid: the folder's pad (0) and EOS (1). */
const FIRST_ID = 2;
/** hf_generate*.py's exit status when torch or transformers cannot be imported. */
const NO_TORCH = 3;
const UTIL_PERIOD_MS = 100;
/** The share of a decode batch's timed steps that may run part of the batch before the report
 * warns. The engine reads its stdin 64 KiB at a time and steps in between, so a batch whose
 * requests are larger starts over a few steps, and as many of its last timed steps run the
 * sequences that started late alone (B = 256 at vocab 151,936: 3 steps, so 2 of 127). */
const MAX_PARTIAL_STEPS = 0.05;

type Kind = "decode" | "prefill" | "grpo";

interface Workload {
  name: string;
  kind: Kind;
  /** One entry per sequence (GRPO: prompt p's samples at p·8 … p·8+7). */
  prompts: number[][];
  maxNew: number;
  /** Whether transformers runs it too. */
  theirs: boolean;
  /** Sampling instead of greedy: request i is seeded i. */
  sampling?: { temperature: number; top_p: number };
}

/** One workload on our side. */
interface Ours {
  seconds: number;
  /** Until every sequence had its first token. */
  firstTokenSeconds: number;
  /** `tokens` events (engine steps) until every sequence had its first token. */
  startSteps: number;
  /** Σ cached_tokens / Σ prompt_tokens of the workload's `done` events. */
  hitRate: number;
  /** Mean nvidia-smi utilization.gpu over the workload, and the samples it is from. */
  util?: { mean: number; samples: number };
  /** With --profile: the device time of each operation over the workload. */
  profile?: { op: string; calls: number; ms: number }[];
}

/** One workload on theirs, or why there is none. */
type Theirs = { seconds: number; firstTokenSeconds: number } | { error: string };

interface TorchStatus {
  torch: string;
  transformers: string;
  python: string;
  cuda: boolean;
  gpu: string;
  reason: string;
}

interface ShapeResult {
  shape: Shape;
  params: number;
  kvBlocks: number;
  rows: { w: Workload; ours: Ours; variants: Partial<Record<Variant, Ours>>; theirs?: Theirs }[];
  util?: { mean: number; samples: number };
  attn?: string;
}

function fail(message: string, code = 1): never {
  console.error(`bench:engine --gpu: ${message}`);
  process.exit(code);
}

/** The last non-empty line of a child's output: its own account of what went wrong. */
function lastLine(text: string, fallback: string): string {
  return (
    text
      .trim()
      .split("\n")
      .filter((l) => l.trim() !== "")
      .at(-1) ?? fallback
  );
}

function pickShapes(spec: string | undefined): Shape[] {
  if (spec === undefined) return SHAPES;
  return spec.split(",").map((k) => {
    const s = SHAPES.find((x) => x.key === k.trim());
    if (!s) {
      fail(
        `--shapes: unknown shape '${k}' (known with --gpu: ${SHAPES.map((x) => x.key).join(", ")})`,
        2,
      );
    }
    return s;
  });
}

function workloads(shape: Shape): Workload[] {
  const draw = new Rng(SEED);
  const tokens = (n: number) =>
    Array.from({ length: n }, () => FIRST_ID + draw.int(shape.vocab - FIRST_ID));
  const batch = (n: number, len: number) => Array.from({ length: n }, () => tokens(len));
  const out: Workload[] = DECODE_BATCHES.map((b) => ({
    name: `decode B=${b}`,
    kind: "decode",
    prompts: batch(b, DECODE_PROMPT),
    maxNew: DECODE_NEW,
    theirs: THEIR_DECODE_BATCHES.has(b),
  }));
  out.push({
    name: "decode B=128, top-p 0.95",
    kind: "decode",
    prompts: batch(128, DECODE_PROMPT),
    maxNew: DECODE_NEW,
    theirs: false,
    sampling: { temperature: 1, top_p: 0.95 },
  });
  out.push({
    name: "prefill",
    kind: "prefill",
    prompts: batch(PREFILL_SEQS, PREFILL_PROMPT),
    maxNew: 1,
    theirs: true,
  });
  const prefix = tokens(GRPO_PREFIX);
  const grpo: number[][] = [];
  for (let p = 0; p < GRPO_PROMPTS; p++) {
    const prompt = [...prefix, ...tokens(GRPO_SUFFIX_MIN + p)];
    for (let s = 0; s < GRPO_SAMPLES; s++) grpo.push(prompt);
  }
  out.push({
    name: `GRPO ${GRPO_PROMPTS}×${GRPO_SAMPLES}`,
    kind: "grpo",
    prompts: grpo,
    maxNew: GRPO_NEW,
    theirs: true,
  });
  return out;
}

// ---- GPU utilisation, sampled beside our workloads ----

class UtilSampler {
  private samples: [number, number][] = [];
  private child: ChildProcessWithoutNullStreams | undefined;

  constructor(gpu: string) {
    const child = spawn("nvidia-smi", [
      ...["-i", gpu, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
      ...["-lms", String(UTIL_PERIOD_MS)],
    ]);
    child.on("error", () => {
      this.child = undefined; // no nvidia-smi: no figure
    });
    child.stderr.resume();
    createInterface({ input: child.stdout }).on("line", (line) => {
      const v = Number(line.trim());
      if (line.trim() !== "" && Number.isFinite(v)) this.samples.push([performance.now(), v]);
    });
    this.child = child;
  }

  /** The mean of the samples taken in [from, to] (performance.now() times). */
  mean(from: number, to: number): { mean: number; samples: number } | undefined {
    const inside = this.samples.filter(([t]) => t >= from && t <= to).map(([, v]) => v);
    if (inside.length === 0) return undefined;
    return { mean: inside.reduce((a, b) => a + b, 0) / inside.length, samples: inside.length };
  }

  stop() {
    this.child?.kill();
  }
}

/** The mean of several workloads' means, weighted by their samples. */
function pooled(utils: ({ mean: number; samples: number } | undefined)[]) {
  const have = utils.filter((u) => u !== undefined);
  const samples = have.reduce((s, u) => s + u.samples, 0);
  if (samples === 0) return undefined;
  return { mean: have.reduce((s, u) => s + u.mean * u.samples, 0) / samples, samples };
}

// ---- our side ----

async function runOurWorkload(
  engine: EngineProcess,
  w: Workload,
  tag: string,
): Promise<Ours & { start: number; end: number }> {
  await engine.control("flush_cache");
  const n = w.prompts.length;
  const rids = w.prompts.map((_, i) => `${tag}-${i}`);
  const index = new Map(rids.map((r, i) => [r, i]));
  const got = new Array<number>(n).fill(0);
  let started = 0;
  let steps = 0;
  let startSteps = 0;
  let firstAll = 0;
  let finished = 0;
  let prompt = 0;
  let cached = 0;
  let end = 0;
  let problem: string | undefined;
  const done = engine.until((e) => {
    if (e.ev === "tokens") {
      let mine = false;
      for (const [rid] of e.out as [string, number, number][]) {
        const i = index.get(rid);
        if (i === undefined) continue;
        mine = true;
        if (got[i] === 0 && ++started === n) firstAll = performance.now();
        got[i] = (got[i] as number) + 1;
      }
      if (mine) {
        steps++;
        if (startSteps === 0 && started === n) startSteps = steps;
      }
    } else if (e.ev === "done" && index.has(e.rid as string)) {
      if (e.reason !== "length" || e.completion_tokens !== w.maxNew) {
        problem ??= `${e.rid} ended with ${e.reason} after ${e.completion_tokens} tokens`;
      }
      prompt += e.prompt_tokens as number;
      cached += e.cached_tokens as number;
      if (++finished === n) end = performance.now();
    }
    return finished === n;
  });
  const start = performance.now();
  engine.send(
    w.prompts.map((p, i) => ({
      ...greedy(rids[i] as string, p, w.maxNew),
      ...(w.sampling && { ...w.sampling, seed: i }),
    })),
  );
  await done;
  if (problem !== undefined) throw new Error(`searchr1-engine, ${w.name}: ${problem}`);
  return {
    seconds: (end - start) / 1000,
    firstTokenSeconds: (firstAll - start) / 1000,
    startSteps,
    hitRate: cached / prompt,
    start,
    end,
  };
}

async function runOurs(
  exe: string,
  model: string,
  shape: Shape,
  ws: Workload[],
  o: EngineGpuOptions,
  gpuIndex: string,
  extra: string[] = [],
  env: Record<string, string> = {},
) {
  const engine = new EngineProcess(
    exe,
    [
      ...["--model", model, "--device", "cuda", "--context-length", String(CONTEXT)],
      ...["--max-running", String(MAX_RUNNING), "--chunk-tokens", String(CHUNK_TOKENS)],
      ...(o.profile ? ["--profile"] : []),
      ...extra,
    ],
    { ...process.env, ...env },
    !o.profile,
  );
  let ready: EngineEvent;
  try {
    ready = await engine.ready();
  } catch (err) {
    fail(
      `searchr1-engine --device cuda did not start (${(err as Error).message}):\n` +
        engine.stderr.trim(),
    );
  }
  if (ready.device !== "cuda") {
    await engine.shutdown();
    fail(`searchr1-engine says device ${String(ready.device)}, not cuda`);
  }
  if (ready.block_size !== BLOCK) throw new Error(`block_size ${ready.block_size}, not ${BLOCK}`);
  // Warm-up, untimed: the first 8 prompts of the first decode batch that has 8, 8 tokens each.
  const warm: Workload = {
    name: "warm-up",
    kind: "decode",
    prompts: ws.find((w) => w.prompts.length >= WARM_SEQS)?.prompts.slice(0, WARM_SEQS) ?? [],
    maxNew: WARM_NEW,
    theirs: false,
  };
  await runOurWorkload(engine, warm, "warm");
  // The engine's `profile` returns the times since the last one: one per workload.
  const profile = async () =>
    o.profile ? ((await engine.control("profile")).ops as Ours["profile"]) : undefined;
  await profile();
  const sampler = new UtilSampler(gpuIndex);
  const out: Ours[] = [];
  try {
    for (const [i, w] of ws.entries()) {
      log(`${shape.name}: searchr1-engine, ${w.name} ...`);
      const m = await runOurWorkload(engine, w, `w${i}`);
      out.push({ ...m, util: sampler.mean(m.start, m.end), profile: await profile() });
    }
  } finally {
    sampler.stop();
  }
  const code = await engine.shutdown();
  if (code !== 0) log(`${shape.name}: searchr1-engine exited with ${code}`);
  return { out, kvBlocks: ready.kv_blocks as number };
}

// ---- their side ----

interface HfWorkload {
  name: string;
  seconds?: number;
  first_token_s?: number;
  error?: string;
}

// ---- the benchmark ----

export async function engineGpuBench(o: EngineGpuOptions): Promise<void> {
  const shapes = pickShapes(o.shapes);
  let exe: string;
  let trainer: string;
  try {
    exe = nativeExecutable("searchr1-engine");
    trainer = nativeExecutable("searchr1-trainer");
  } catch (err) {
    if (!(err instanceof CliError)) throw err;
    fail(err.message);
  }
  if (o.profile) {
    const help = spawnSync(exe, ["--help"], { encoding: "utf8" });
    if (!/--profile\b/.test(`${help.stdout}`)) {
      fail(
        `--profile: this build of searchr1-engine (${exe}) has no --profile flag (its --help ` +
          "does not list it); rebuild it from sources that have it (npm run build), or drop --profile",
        2,
      );
    }
  }

  // A usable GPU, as bench/gpu.sh checks it: the native build's own account.
  const info = spawnSync(trainer, ["info"], { encoding: "utf8" });
  if (info.status !== 0) fail(`searchr1-trainer info failed: ${info.stderr.trim()}`);
  const cuda = (JSON.parse(info.stdout) as { cuda: { available: boolean; reason: string } }).cuda;
  if (!cuda.available) fail(`no usable GPU: searchr1-trainer info says: ${cuda.reason}`);
  const smi = spawnSync("nvidia-smi", ["--query-gpu=name,memory.total", "--format=csv,noheader"], {
    encoding: "utf8",
  });
  const gpuLine =
    smi.status === 0
      ? smi.stdout
          .trim()
          .split("\n")
          .map((l) => l.trim())
          .join("; ")
      : "unknown (nvidia-smi did not answer)";
  // The GPU the engine uses: CUDA's first visible one.
  const gpuIndex = process.env.CUDA_VISIBLE_DEVICES?.split(",")[0]?.trim() || "0";

  const env = {
    ...process.env,
    HF_HUB_DISABLE_PROGRESS_BARS: "1",
    TRANSFORMERS_VERBOSITY: "error",
  };
  const script = (name: string) => join(packageRoot(), "bench", "engine", name);
  const python = (name: string, args: string[], inheritStderr = false) =>
    spawnSync(o.python, [script(name), ...args], {
      encoding: "utf8",
      env,
      maxBuffer: 1 << 26,
      stdio: ["ignore", "pipe", inheritStderr ? "inherit" : "pipe"],
    });
  const check = python("hf_generate_gpu.py", ["check"]);
  if (check.error || check.status === NO_TORCH) {
    fail(
      "the random model folders are written by transformers' save_pretrained, which needs " +
        `torch and transformers in ${o.python}${check.error ? " (not found)" : ""}; ` +
        "pass --python PATH of a Python that has them",
    );
  }
  if (check.status !== 0) fail(`hf_generate_gpu.py check failed: ${check.stderr.trim()}`);
  const torch = JSON.parse(check.stdout) as TorchStatus;
  if (!torch.cuda) {
    log(
      `transformers side NOT RUN: PyTorch ${torch.torch} in ${o.python} cannot use the GPU ` +
        `(${torch.reason}); only our engine is measured.`,
    );
  }

  const root = mkdtempSync(join(tmpdir(), "searchr1-bench-engine-gpu-"));
  const results: ShapeResult[] = [];
  try {
    for (const shape of shapes) {
      const work = join(root, shape.key);
      mkdirSync(work, { recursive: true });
      const model = join(work, "model");
      log(`${shape.name}: writing a random bf16 model to ${model} ...`);
      const made = python(
        "hf_generate.py",
        ["make", "--out", model, ...shapeArgs(shape), "--dtype", "bfloat16"],
        true,
      );
      if (made.status !== 0) fail(`hf_generate.py make failed (exit ${made.status})`);
      const params = (JSON.parse(made.stdout) as { params: number }).params;
      const ws = workloads(shape);

      const ours = await runOurs(exe, model, shape, ws, o, gpuIndex);
      const decodes = ws.filter((w) => w.kind === "decode");
      const variants: Partial<Record<Variant, Ours[]>> = {};
      for (const v of VARIANTS.filter((x) => o[x.option])) {
        const run = await runOurs(
          exe,
          model,
          shape,
          decodes,
          { ...o, profile: false },
          gpuIndex,
          [...v.args],
          v.env,
        );
        variants[v.key] = run.out;
      }
      const result: ShapeResult = {
        shape,
        params,
        kvBlocks: ours.kvBlocks,
        rows: ws.map((w, i) => ({
          w,
          ours: ours.out[i] as Ours,
          variants: Object.fromEntries(
            Object.entries(variants).map(([k, out]) => [k, out[decodes.indexOf(w)]]),
          ),
        })),
        util: pooled(ours.out.map((m) => m.util)),
      };

      if (torch.cuda) {
        const theirs = ws.filter((w) => w.theirs);
        const workFile = join(work, "workloads.json");
        writeFileSync(
          workFile,
          JSON.stringify({
            workloads: theirs.map((w) => ({
              name: w.name,
              prompts: w.prompts,
              max_new_tokens: w.maxNew,
            })),
          }),
        );
        log(`${shape.name}: transformers generate, ${theirs.map((w) => w.name).join(", ")} ...`);
        const r = python("hf_generate_gpu.py", ["generate", "--model", model, "--work", workFile]);
        const byName = new Map<string, Theirs>();
        if (r.status === 0) {
          const out = JSON.parse(r.stdout) as {
            attn_implementation: string;
            workloads: HfWorkload[];
          };
          result.attn = out.attn_implementation;
          for (const h of out.workloads) {
            byName.set(
              h.name,
              h.error !== undefined
                ? { error: h.error }
                : { seconds: h.seconds as number, firstTokenSeconds: h.first_token_s as number },
            );
          }
        } else {
          process.stderr.write(r.stderr);
          const why = `failed: ${lastLine(r.stderr, `exit ${r.status}`)}`;
          for (const w of theirs) byName.set(w.name, { error: why });
        }
        for (const row of result.rows) row.theirs = byName.get(row.w.name);
      }
      results.push(result);
    }
  } finally {
    if (o.keep) log(`kept ${root}`);
    else rmSync(root, { recursive: true, force: true });
  }
  console.log(report(results, gpuLine, torch, o).join("\n"));
}

// ---- the report ----

/** [ms, tok/s] of a workload: per decode step for `decode`, else of the whole workload. */
function figures(w: Workload, m: { seconds: number; firstTokenSeconds: number }): number[] {
  const n = w.prompts.length;
  switch (w.kind) {
    case "decode": {
      const step = (m.seconds - m.firstTokenSeconds) / (w.maxNew - 1);
      return [step * 1000, n / step];
    }
    case "prefill":
      return [m.seconds * 1000, w.prompts.reduce((s, p) => s + p.length, 0) / m.seconds];
    case "grpo":
      return [m.seconds * 1000, (n * w.maxNew) / m.seconds];
  }
}

function report(
  results: ShapeResult[],
  gpuLine: string,
  torch: TorchStatus,
  o: EngineGpuOptions,
): string[] {
  const attn = [...new Set(results.map((r) => r.attn).filter((a) => a !== undefined))];
  const lines = [
    "",
    "## Native inference engine vs Hugging Face transformers generate (GPU, bf16, greedy)",
    "",
    `GPU: ${gpuLine}`,
    `Ours: searchr1-engine --device cuda --context-length ${CONTEXT} --max-running ` +
      `${MAX_RUNNING} --chunk-tokens ${CHUNK_TOKENS}${o.profile ? " --profile" : ""}, driven ` +
      "over its stdio protocol (not HTTP). " +
      (torch.cuda
        ? `Theirs: transformers ${torch.transformers}, PyTorch ${torch.torch} (Python ` +
          `${torch.python}), bf16 on cuda, eager, attention ${attn.join("/") || "?"}, one ` +
          "left-padded generate call per workload."
        : `transformers comparison NOT RUN: PyTorch ${torch.torch} in ${o.python} cannot use ` +
          `the GPU (${torch.reason}); only our figures are shown.`),
    `decode B: ms = per decode step = (last done − every sequence's first token) / ` +
      `${DECODE_NEW - 1}, tok/s = B / that, on both sides (transformers runs B = 1 and 128 ` +
      "only). prefill: ms = the whole workload, tok/s = prompt tokens / s. GRPO: ms = the " +
      "whole workload, tok/s = generated tokens / s, prefill included. " +
      "speed × = ours tok/s ÷ transformers tok/s. GPU util = mean of nvidia-smi " +
      `utilization.gpu every ${UTIL_PERIOD_MS} ms during our workload.`,
  ];
  if (o.profile) {
    lines.push(
      "NOTE: --profile: the engine timed every operation on the device, which slows it: " +
        "its figures here are not its speed.",
    );
  }
  const warnings: string[] = [];
  for (const r of results) {
    const rows: string[][] = [
      [
        "workload",
        "seqs × new",
        "ours ms",
        "ours tok/s",
        "GPU util",
        ...VARIANTS.filter((v) => o[v.option]).map((v) => v.column),
        "transformers ms",
        "transformers tok/s",
        "speed ×",
      ],
    ];
    const wholeGenerate: string[] = [];
    for (const { w, ours, variants, theirs } of r.rows) {
      const [oursMs, oursRate] = figures(w, ours) as [number, number];
      let theirCells = ["–", "–", "–"];
      if (theirs !== undefined && "error" in theirs) theirCells = [theirs.error, "–", "–"];
      else if (theirs !== undefined) {
        const [ms, rate] = figures(w, theirs) as [number, number];
        theirCells = [fmt(ms, 2), fmt(rate, 0), `${(oursRate / rate).toFixed(2)}×`];
        if (w.kind === "decode") {
          wholeGenerate.push(
            `${w.name} ${fmt((w.prompts.length * w.maxNew) / theirs.seconds, 0)} tok/s`,
          );
        }
      }
      rows.push([
        w.name,
        `${w.prompts.length} × ${w.maxNew}`,
        fmt(oursMs, 2),
        fmt(oursRate, 0),
        ours.util === undefined ? "–" : `${fmt(ours.util.mean, 0)} %`,
        ...VARIANTS.filter((v) => o[v.option]).map((v) => {
          const run = variants[v.key];
          return run === undefined ? "–" : fmt(figures(w, run)[0] as number, 2);
        }),
        ...theirCells,
      ]);
      if (w.kind === "decode" && ours.startSteps - 1 > MAX_PARTIAL_STEPS * (w.maxNew - 1)) {
        warnings.push(
          `${r.shape.name} ${w.name}: the sequences got their first tokens over ` +
            `${ours.startSteps} engine steps, so ${ours.startSteps - 1} of the ` +
            `${w.maxNew - 1} timed steps ran fewer than B sequences`,
        );
      }
    }
    const grpo = r.rows.find((x) => x.w.kind === "grpo");
    lines.push(
      "",
      `### ${r.shape.name}: vocab ${fmt(r.shape.vocab)}, ${fmt(r.params)} parameters ` +
        `(our KV cache: ${fmt(r.kvBlocks)} blocks of ${BLOCK} tokens)`,
      "",
      ...table(rows, new Set((rows[0] as string[]).map((_, i) => i).filter((i) => i >= 2))),
      "",
    );
    if (wholeGenerate.length > 0) {
      lines.push(
        `transformers' whole generate calls (prefill included): ${wholeGenerate.join(", ")}.`,
      );
    }
    lines.push(
      `Our GRPO prefix-cache hit rate: ${fmt(100 * (grpo?.ours.hitRate ?? 0), 1)} % of prompt ` +
        "tokens. Mean GPU utilisation over our workloads: " +
        (r.util === undefined
          ? "not measured (nvidia-smi gave no samples)."
          : `${fmt(r.util.mean, 1)} % (${r.util.samples} samples).`),
    );
    for (const { w, ours } of r.rows) {
      if (ours.profile === undefined) continue;
      const total = ours.profile.reduce((t, p) => t + p.ms, 0);
      lines.push(
        "",
        `#### searchr1-engine --profile, ${r.shape.name}, ${w.name}: ${fmt(total, 1)} ms of ` +
          "device time",
        "",
        ...table(
          [
            ["operation", "calls", "ms", "µs a call", "share"],
            ...ours.profile
              .slice(0, PROFILE_ROWS)
              .map((p) => [
                p.op,
                fmt(p.calls),
                fmt(p.ms, 2),
                fmt((1000 * p.ms) / Math.max(1, p.calls), 1),
                `${fmt((100 * p.ms) / Math.max(total, 1e-9), 1)} %`,
              ]),
          ],
          new Set([1, 2, 3, 4]),
        ),
      );
    }
  }
  if (warnings.length > 0) lines.push("", "WARNING:", ...warnings.map((w) => `  ${w}`));
  return lines;
}
