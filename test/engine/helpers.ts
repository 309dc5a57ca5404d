import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { writeSafetensors } from "../../src/tensors/safetensors.js";
import { type CliResult, type RunningCli, startServing } from "../helpers/cli.js";
import { type Reply, request } from "../helpers/http.js";
import { get, readFloats, tempDir, trainerOk } from "../native/helpers.js";

export { type Reply, request };

export const FIXTURES = fileURLToPath(new URL("./fixtures/", import.meta.url));
export const MODELS = ["qwen-bpe", "llama-sp"] as const;
/**
 * The models of the CUDA engine test (cuda.test.ts): head dims the CUDA attention kernels
 * are built for (16 and 64; qwen-bpe and llama-sp have 8) and weights whose bf16 error was
 * measured (bf16_tolerance.py). Their prompts are qwen-bpe's and llama-sp's.
 */
export const CUDA_MODELS = ["qwen-hd16", "llama-hd64"] as const;
export type GreedyModel = (typeof MODELS)[number] | (typeof CUDA_MODELS)[number];
export type ModelName = GreedyModel | "tiny-vocab";
export const modelDir = (m: ModelName): string => `${FIXTURES}${m}`;

export function fixture<T>(name: string): T {
  return JSON.parse(readFileSync(`${FIXTURES}${name}`, "utf8")) as T;
}

export interface GreedyCase {
  model: GreedyModel;
  name: string;
  prompt_ids: number[];
  /** 24 tokens, not stopped at EOS. */
  output_ids: number[];
  /** log_softmax(logits)[output_ids[i]] in float32. */
  logprobs: number[];
  /** Index in output_ids of the first EOS, or null. */
  eos_at: number | null;
  /** decode(output_ids, skip_special_tokens=True). */
  text: string;
  min_margin: number;
}
export const greedy = () => fixture<{ max_new_tokens: number; cases: GreedyCase[] }>("greedy.json");

/** Engine threads per test server: CI machines have two cores shared by the test files. */
export const ENGINE_ARGS = ["--device", "cpu", "--threads", "1"];

export interface RunningEngine {
  /** `http://127.0.0.1:<port>`, as the server printed it. */
  base: string;
  cli: RunningCli;
  /** SIGTERM, then the exit code and output. */
  stop(): Promise<CliResult>;
}

/**
 * Starts `searchr1 serve-engine` with `args` (and --port 0, CPU, one engine thread) as a
 * child process and resolves once it prints the URL it serves at (the model is loaded);
 * rejects with its output if it exits first.
 */
export async function startEngine(
  args: string[],
  options: { env?: Record<string, string>; timeoutMs?: number } = {},
): Promise<RunningEngine> {
  const { url, cli, stop } = await startServing(
    ["serve-engine", "--port", "0", ...ENGINE_ARGS, ...args],
    /^serving .* at (http:\/\/\S+) \(/m,
    { env: options.env, timeoutMs: options.timeoutMs ?? 60_000 },
  );
  return { base: url, cli, stop };
}

/** POST /generate with a JSON value (or a raw string as is). */
export function generate(
  base: string,
  body: unknown,
  options: Parameters<typeof request>[4] = {},
): Promise<Reply> {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  return request(base, "POST", "/generate", text, options);
}

/** The answer object of a successful /generate (fails the test with the error otherwise). */
export interface Output {
  text: string;
  output_ids: number[];
  meta_info: {
    id: string;
    finish_reason: { type: string; matched: string | number | null };
    prompt_tokens: number;
    completion_tokens: number;
    cached_tokens: number;
    output_token_logprobs?: [number, number, null][];
    /** With return_logprob and top_logprobs_num: per output token, `[logprob, id, null]`s. */
    output_top_logprobs?: [number, number, null][][];
    weight_version: string;
  };
}

export async function generateOk<T = Output | Output[]>(base: string, body: unknown): Promise<T> {
  const r = await generate(base, body);
  if (r.status !== 200) throw new Error(`/generate answered ${r.status}: ${r.text}`);
  return r.json as T;
}

/** Greedy sampling params that reproduce the fixtures' 24 tokens. */
export const GREEDY = { temperature: 0, max_new_tokens: 24, ignore_eos: true };

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * searchr1-trainer score on the CPU (with the PEFT folder `adapter`, if given): each row's
 * tokens' log-probs after its prompt, teacher-forced, the rows right-padded into one batch.
 */
export async function teacherForced(
  model: string,
  rows: readonly { prompt: number[]; tokens: number[] }[],
  adapter?: string,
): Promise<number[][]> {
  const seqs = rows.map((o) => [...o.prompt, ...o.tokens]);
  const T = Math.max(...seqs.map((r) => r.length));
  const ids = new BigInt64Array(seqs.length * T);
  const mask = new BigInt64Array(seqs.length * T);
  seqs.forEach((r, b) => {
    r.forEach((id, t) => {
      ids[b * T + t] = BigInt(id);
      mask[b * T + t] = 1n;
    });
  });
  const dir = tempDir();
  const [batch, out] = [join(dir, "batch.safetensors"), join(dir, "score.safetensors")];
  const shape = [seqs.length, T];
  await writeSafetensors(batch, [
    { name: "input_ids", dtype: "I64", shape, data: ids },
    { name: "attention_mask", dtype: "I64", shape, data: mask },
  ]);
  const lora = adapter ? ["--lora", adapter] : [];
  trainerOk([
    "score",
    "--model",
    model,
    "--batch",
    batch,
    "--out",
    out,
    "--device",
    "cpu",
    ...lora,
  ]);
  const lp = get(await readFloats(out), "logprobs");
  return rows.map((o, b) => o.tokens.map((_, i) => lp[b * T + o.prompt.length + i] ?? Number.NaN));
}

/** log Σ exp(xs), computed stably. */
export function logSumExp(xs: number[]): number {
  const m = Math.max(...xs);
  return m + Math.log(xs.reduce((a, x) => a + Math.exp(x - m), 0));
}

/** id → log-prob of one step's top list ([logprob, id, text] triples). */
export const logprobsById = (top: [number, number, null][]): Map<number, number> =>
  new Map(top.map(([lp, id]) => [id, lp]));

/**
 * The model's unchanged next-token distribution after `inputIds` (temperature 1, no penalty
 * or grammar): id → log-prob of its `vocab` most likely tokens, from a one-token /generate.
 */
export async function nextTokenLogprobs(
  base: string,
  inputIds: number[],
  vocab: number,
): Promise<Map<number, number>> {
  const out = await generateOk<Output>(base, {
    input_ids: inputIds,
    sampling_params: { temperature: 1, max_new_tokens: 1 },
    return_logprob: true,
    top_logprobs_num: vocab,
  });
  return logprobsById((out.meta_info.output_top_logprobs as [number, number, null][][])[0] ?? []);
}
