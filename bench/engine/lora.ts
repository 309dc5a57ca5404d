/**
 * Benchmark: the engine's decode step with a LoRA adapter applied unmerged (native/src/engine/
 * PROTOCOL.md, "LoRA") against the base model alone, on the CPU, at a few batch sizes; and
 * the cost of handing the engine a new policy either way: loading the adapter folder
 * (`load_lora`) against loading a whole model folder of the base's size (`update_weights`,
 * what a merged export costs the engine; the merged model then decodes at the base's speed).
 *
 * Usage: npm run build && node dist/bench/engine/lora.js [-- OPTIONS]
 *   --threads N   engine threads (default 2)
 *   --rank R      adapter rank (default 16), on every linear layer
 *   --keep        keep the temporary folder
 *
 * Model: a random Qwen2 of bench:engine's 50m shape (vocab 32,000, hidden 512, intermediate
 * 1,408, 8 layers, 8 heads, 2 kv heads; src/world/model.ts writeTinyModel, fp32); adapter:
 * A and B drawn normal(0, 0.02), PEFT's names, written here.
 * Workload per batch size B: B greedy sequences of a 16-token prompt and 64 new tokens, all
 * with the adapter or none; one untimed run first. Step time = the time from the first
 * `tokens` event to the last, over the decode steps between them; the fastest of 5 runs each,
 * base and adapter in turn.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { Rng } from "../../src/runtime/rng.js";
import { table } from "../../src/runtime/table.js";
import { type NamedTensor, writeSafetensors } from "../../src/tensors/safetensors.js";
import { writeTinyModel } from "../../src/world/model.js";
import { fmt, log, threadCappedEnv } from "../common.js";
import { EngineProcess, greedy, timeDecodeSteps } from "./stdio.js";

const SHAPE = {
  hidden: 512,
  layers: 8,
  heads: 8,
  kvHeads: 2,
  intermediate: 1408,
  maxPositions: 1024,
  tied: false,
};
const VOCAB = 32_000;
const BATCHES = [1, 8, 32];
const NEW_TOKENS = 64;
const REPEATS = 5;

async function writeAdapter(dir: string, rank: number, rng: Rng): Promise<void> {
  const H = SHAPE.hidden;
  const K = (SHAPE.hidden / SHAPE.heads) * SHAPE.kvHeads;
  const I = SHAPE.intermediate;
  const shapes: [string, number, number][] = [
    ["self_attn.q_proj", H, H],
    ["self_attn.k_proj", H, K],
    ["self_attn.v_proj", H, K],
    ["self_attn.o_proj", H, H],
    ["mlp.gate_proj", H, I],
    ["mlp.up_proj", H, I],
    ["mlp.down_proj", I, H],
  ];
  const tensors: NamedTensor[] = [];
  const random = (n: number) => Float32Array.from({ length: n }, () => 0.02 * rng.normal());
  for (let l = 0; l < SHAPE.layers; l++) {
    for (const [m, inDim, outDim] of shapes) {
      const p = `base_model.model.model.layers.${l}.${m}`;
      tensors.push({
        name: `${p}.lora_A.weight`,
        dtype: "F32",
        shape: [rank, inDim],
        data: random(rank * inDim),
      });
      tensors.push({
        name: `${p}.lora_B.weight`,
        dtype: "F32",
        shape: [outDim, rank],
        data: random(outDim * rank),
      });
    }
  }
  await writeSafetensors(join(dir, "adapter_model.safetensors"), tensors, { format: "pt" });
  writeFileSync(
    join(dir, "adapter_config.json"),
    JSON.stringify({
      peft_type: "LORA",
      r: rank,
      lora_alpha: 2 * rank,
      target_modules: "all-linear",
    }),
  );
}

/** Seconds per decode step of `batch` greedy sequences (with the adapter `lora`, or none). */
async function stepSeconds(engine: EngineProcess, batch: number, lora: string | null, tag: string) {
  const prompt = Array.from({ length: 16 }, (_, i) => (i * 977 + 13) % VOCAB);
  const commands = Array.from({ length: batch }, (_, i) => ({
    // A token of its own first, so that no sequence shares another's prefix blocks.
    ...greedy(`${tag}-${i}`, [i + 1, ...prompt], NEW_TOKENS),
    ...(lora ? { lora } : {}),
  }));
  return (await timeDecodeSteps(engine, commands)).seconds;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { threads: { type: "string" }, rank: { type: "string" }, keep: { type: "boolean" } },
  });
  const threads = Number(values.threads ?? 2);
  const rank = Number(values.rank ?? 16);
  const dir = mkdtempSync(join(tmpdir(), "searchr1-bench-lora-"));
  try {
    const model = join(dir, "model");
    const adapter = join(dir, "adapter");
    for (const d of [model, adapter]) mkdirSync(d);
    await writeTinyModel(model, SHAPE, { vocabSize: VOCAB, endOfText: 0, imStart: 1, imEnd: 2 }, 1);
    await writeAdapter(adapter, rank, new Rng(2));
    const engine = new EngineProcess(
      nativeExecutable("searchr1-engine"),
      ["--model", model, "--device", "cpu", "--threads", String(threads), "--kv-cache-mb", "512"],
      threadCappedEnv(threads),
    );
    await engine.ready();
    let t = performance.now();
    await engine.control("load_lora", { name: "a", path: adapter });
    const loadLora = (performance.now() - t) / 1000;
    t = performance.now();
    await engine.control("update_weights", { model_path: model, abort_all: false });
    const reload = (performance.now() - t) / 1000;
    await stepSeconds(engine, 2, "a", "warm"); // untimed
    const rows: string[][] = [];
    for (const batch of BATCHES) {
      // The fastest of REPEATS runs each, taken in turn: a shared machine's other work
      // only ever slows a run down.
      let base = Number.POSITIVE_INFINITY;
      let lora = Number.POSITIVE_INFINITY;
      for (let r = 0; r < REPEATS; r++) {
        base = Math.min(base, await stepSeconds(engine, batch, null, `b${batch}-${r}`));
        lora = Math.min(lora, await stepSeconds(engine, batch, "a", `l${batch}-${r}`));
      }
      log(`batch ${batch}: base ${fmt(base * 1000, 2)} ms, adapter ${fmt(lora * 1000, 2)} ms`);
      rows.push([
        String(batch),
        fmt(base * 1000, 2),
        fmt(lora * 1000, 2),
        `${fmt((lora / base - 1) * 100, 1)} %`,
      ]);
    }
    await engine.shutdown();
    process.stdout.write(
      `LoRA rank ${rank} on every linear layer, ${threads} threads, decode step (ms):\n` +
        table(
          [["batch", "base (= merged)", "adapter unmerged", "overhead"], ...rows],
          new Set([0, 1, 2, 3]),
        ).join("\n") +
        `\nnew policy into the engine: load_lora ${fmt(loadLora * 1000, 1)} ms, ` +
        `update_weights of the whole model ${fmt(reload * 1000, 1)} ms\n`,
    );
  } finally {
    if (values.keep) log(`kept ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

await main();
