import { spawnSync } from "node:child_process";
import { cpSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { Rng } from "../../src/runtime/rng.js";
import {
  type NamedTensor,
  readSafetensors,
  type Tensor,
  toFloat32,
  writeSafetensors,
} from "../../src/tensors/safetensors.js";

export const FIXTURES = fileURLToPath(new URL("./fixtures/", import.meta.url));
/** make_fixtures.py's models; untied-tf5's config.json is in transformers 5's format. */
export const MODELS = ["untied", "tied", "untied-tf5"] as const;
export type ModelName = (typeof MODELS)[number];

export const modelDir = (m: ModelName): string => join(FIXTURES, m);
/** Pins a run to the fp32 CPU backend (the default, auto, picks a GPU where there is one). */
export const CPU = ["--device", "cpu"];
export const caseFile = (m: ModelName): string => join(FIXTURES, `${m}.case.safetensors`);

export interface TrainerResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs the real native searchr1-trainer (two threads keep CI machines responsive); `exe`
 * runs another build of it (portable-gemm.test.ts's).
 */
export function trainer(
  args: string[],
  exe: string = nativeExecutable("searchr1-trainer"),
  env: Record<string, string> = {},
): TrainerResult {
  const r = spawnSync(exe, args, {
    encoding: "utf8",
    timeout: 120_000,
    env: { ...process.env, OMP_NUM_THREADS: "2", ...env },
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Runs the trainer and fails the test with its stderr unless it exits 0. */
export function trainerOk(
  args: string[],
  exe?: string,
  env: Record<string, string> = {},
): TrainerResult {
  const r = trainer(args, exe, env);
  if (r.code !== 0) throw new Error(`searchr1-trainer ${args[0]} exited ${r.code}: ${r.stderr}`);
  return r;
}

export function tempDir(): string {
  return mkdtempSync(join(tmpdir(), "sr1-native-"));
}

/** A writable copy of a fixture model folder. */
export function copyModel(m: ModelName): string {
  const dir = join(tempDir(), m);
  cpSync(modelDir(m), dir, { recursive: true });
  return dir;
}

export async function readFloats(path: string): Promise<Map<string, Float32Array>> {
  const tensors = await readSafetensors(path);
  return new Map([...tensors].map(([name, t]: [string, Tensor]) => [name, toFloat32(t)]));
}

export function get<T>(map: Map<string, T>, name: string): T {
  const v = map.get(name);
  if (v === undefined) throw new Error(`tensor ${name} is missing`);
  return v;
}

/** Largest |a - b| over two equally long arrays. */
export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} != ${b.length}`);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs((a[i] ?? 0) - (b[i] ?? 0)));
  return worst;
}

export function maxAbs(a: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] ?? 0));
  return m;
}

/** Largest |a - b| relative to the largest |b| (that floored at 1e-30, for a b of zeros). */
export const relDiff = (a: Float32Array, b: Float32Array): number =>
  maxAbsDiff(a, b) / Math.max(maxAbs(b), 1e-30);

/** Whether two float arrays hold the same bytes (bit for bit; NaN equals the same NaN). */
export const sameBits = (a: Float32Array, b: Float32Array): boolean =>
  Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(
    Buffer.from(b.buffer, b.byteOffset, b.byteLength),
  );

/** What `searchr1-trainer info` says of CUDA. */
export interface CudaStatus {
  built: boolean;
  available: boolean;
  reason: string;
  gpu: string;
  cublaslt: string;
}

/**
 * Reads `searchr1-trainer info` once to decide which tests of `file` run: `cuda` is its
 * CUDA status (undefined if `info` failed), `gpu` whether a GPU is usable. Without one, a
 * warning says that `file`'s GPU tests are skipped and why.
 */
export function gpuStatus(file: string): { cuda: CudaStatus | undefined; gpu: boolean } {
  let cuda: CudaStatus | undefined;
  try {
    cuda = (JSON.parse(trainer(["info"]).stdout) as { cuda: CudaStatus }).cuda;
  } catch {
    cuda = undefined; // a test that reads `info` says what went wrong
  }
  const gpu = cuda?.available === true;
  if (!gpu) {
    console.warn(
      `${file}: the GPU tests are SKIPPED: ${cuda?.reason ?? "`searchr1-trainer info` failed"}`,
    );
  }
  return { cuda, gpu };
}

/**
 * A rollout batch for the trainer's serve tests: B right-padded sequences of `lengths`, each
 * `prompts[b]` prompt tokens then a response whose mask has a hole of `holeLength` tokens (an
 * <information> block) two tokens in, in every other sequence; rows in `noLoss` have no loss
 * token. Token ids come from a seeded Rng; `perToken` draws each real token's other values
 * from the same generator right after its id, so a test's values depend only on its seed.
 */
export function rolloutBatch(spec: {
  T: number;
  lengths: readonly number[];
  prompts: readonly number[];
  seed: number;
  holeLength: number;
  noLoss?: readonly number[];
  perToken?: (b: number, i: number, rand: () => number) => void;
}) {
  const { T, lengths, prompts } = spec;
  const B = lengths.length;
  const rng = new Rng(spec.seed);
  const rand = () => rng.uniform();
  const ids = new BigInt64Array(B * T);
  const attention = new BigInt64Array(B * T);
  const response = new BigInt64Array(B * T);
  for (let b = 0; b < B; b++) {
    const [len, prompt] = [lengths[b] ?? 0, prompts[b] ?? 0];
    for (let t = 0; t < len; t++) {
      const i = b * T + t;
      ids[i] = BigInt(3 + Math.floor(rand() * 509));
      attention[i] = 1n;
      const hole = b % 2 === 0 && t >= prompt + 2 && t < prompt + 2 + spec.holeLength;
      response[i] = t >= prompt && !hole && !spec.noLoss?.includes(b) ? 1n : 0n;
      spec.perToken?.(b, i, rand);
    }
  }
  /** A [B, T] tensor of the batch file. */
  const tensor = (name: string, data: BigInt64Array | Float32Array): NamedTensor => ({
    name,
    dtype: data instanceof BigInt64Array ? "I64" : "F32",
    shape: [B, T],
    data,
  });
  return { B, ids, attention, response, tensor };
}

/** The tensors written as one batch file in a fresh temporary folder. */
export async function writeBatchFile(tensors: NamedTensor[]): Promise<string> {
  const file = join(tempDir(), "batch.safetensors");
  await writeSafetensors(file, tensors);
  return file;
}
