/**
 * Benchmark: what a grammar (constrained decoding: native/src/engine/grammar.h, token_mask.h)
 * costs the engine's decode step at a Qwen2.5-sized vocabulary, on the CPU: the same
 * sequences sampled with and without a JSON Schema.
 *
 * Usage: npm run build && node dist/bench/engine/grammar.js [-- --threads N]
 *
 * Model: a random Qwen2 with Qwen2.5's vocabulary size (151,936 rows), hidden 64, 2 layers,
 * so that the step is mostly the language-model head and the mask. Vocabulary bytes: 151,643
 * synthetic tokens (the 256 single bytes, then distinct word-like strings of 2–12 bytes from
 * a seeded letter model, half with a leading space, plus digit, punctuation and whitespace
 * runs) and 22 special tokens: Qwen2.5's counts; no real tokenizer.json is in the repository.
 * Workload: B sequences of a 16-token prompt sampled at temperature 1 for 128 new tokens,
 * without a grammar, then with `{"type": "object", "properties": {"text": {"type":
 * "string"}}, "required": ["text"]}` (nearly every token inside the string is allowed, the
 * walk's worst case) and with any JSON value. Step time = the time from the first `tokens`
 * event to the last over the decode steps between them; the fastest of 3 runs each.
 *
 * No competitor runs here: xgrammar and Outlines are Python packages this machine cannot
 * install (no PyPI); the figure is the grammar's own overhead over the unconstrained step.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { jsonSchemaGrammar } from "../../src/engine/grammar/json-schema.js";
import { nativeExecutable } from "../../src/runtime/native-executable.js";
import { Rng } from "../../src/runtime/rng.js";
import { table } from "../../src/runtime/table.js";
import { writeTinyModel } from "../../src/world/model.js";
import { fmt, log, threadCappedEnv } from "../common.js";
import { EngineProcess, greedy, timeDecodeSteps } from "./stdio.js";

const VOCAB = 151_936;
const REGULAR = 151_643;
const SHAPE = {
  hidden: 64,
  layers: 2,
  heads: 4,
  kvHeads: 2,
  intermediate: 128,
  maxPositions: 512,
  tied: true,
};
const BATCHES = [1, 8];
const NEW_TOKENS = 128;
const REPEATS = 3;

/** Hex bytes of the synthetic vocabulary; "" for the special tokens and the padding rows. */
function syntheticVocabulary(rng: Rng): string[] {
  const seen = new Set<string>();
  const out: string[] = [];
  const add = (s: string) => {
    const hex = Buffer.from(s, "latin1").toString("hex");
    if (s.length > 0 && !seen.has(hex)) {
      seen.add(hex);
      out.push(hex);
    }
  };
  for (let b = 0; b < 256; b++) add(String.fromCharCode(b));
  const letters = "etaoinshrdlcumwfgypbvkjxqz";
  const letter = () =>
    letters[Math.min(letters.length - 1, Math.floor(-Math.log(1 - rng.uniform()) * 6))] as string;
  const punct = "{}[]()\"':;,.!?-_/\\<>=+*&^%$#@|`~";
  while (out.length < REGULAR) {
    const r = rng.uniform();
    if (r < 0.85) {
      let w = "";
      const n = 2 + Math.floor(rng.uniform() * 11);
      for (let i = 0; i < n; i++) w += letter();
      if (rng.uniform() < 0.2) w = w[0]?.toUpperCase() + w.slice(1);
      add(rng.uniform() < 0.5 ? ` ${w}` : w);
    } else if (r < 0.92) {
      add(String(Math.floor(rng.uniform() * 1000)));
    } else if (r < 0.97) {
      let p = "";
      for (let i = 0, n = 1 + Math.floor(rng.uniform() * 3); i < n; i++) {
        p += punct[Math.floor(rng.uniform() * punct.length)];
      }
      add(rng.uniform() < 0.3 ? ` ${p}` : p);
    } else {
      add(
        `${"\n".repeat(Math.floor(rng.uniform() * 3))}${" ".repeat(1 + Math.floor(rng.uniform() * 16))}`,
      );
    }
  }
  return [...out.slice(0, REGULAR), ...Array.from({ length: VOCAB - REGULAR }, () => "")];
}

/** Seconds per decode step of `batch` sequences sampled with `grammar` (or none). */
function stepSeconds(engine: EngineProcess, batch: number, grammar: unknown, tag: string) {
  const commands = Array.from({ length: batch }, (_, i) => ({
    ...greedy(
      `${tag}-${i}`,
      [i + 1, ...Array.from({ length: 16 }, (_, k) => (k * 977 + 13) % REGULAR)],
      NEW_TOKENS,
    ),
    // Sampled, and free to end at EOS where the grammar may.
    temperature: 1,
    seed: i,
    ignore_eos: false,
    ...(grammar ? { grammar } : {}),
  }));
  return timeDecodeSteps(engine, commands);
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { threads: { type: "string" } } });
  const threads = Number(values.threads ?? 2);
  const dir = mkdtempSync(join(tmpdir(), "searchr1-bench-grammar-"));
  try {
    await writeTinyModel(
      dir,
      SHAPE,
      { vocabSize: VOCAB, endOfText: REGULAR, imStart: REGULAR + 1, imEnd: REGULAR + 2 },
      1,
    );
    const engine = new EngineProcess(
      nativeExecutable("searchr1-engine"),
      ["--model", dir, "--device", "cpu", "--threads", String(threads), "--kv-cache-mb", "256"],
      threadCappedEnv(threads),
    );
    await engine.ready();
    const t = performance.now();
    await engine.control("token_bytes", { tokens: syntheticVocabulary(new Rng(7)) });
    log(`token_bytes of ${VOCAB} tokens: ${fmt(performance.now() - t, 0)} ms`);
    const grammars: [string, unknown][] = [
      ["none", null],
      [
        "object with a string",
        jsonSchemaGrammar(
          { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
          "schema",
        ),
      ],
      ["any JSON value", jsonSchemaGrammar({}, "schema")],
    ];
    await stepSeconds(engine, 1, grammars[1]?.[1], "warm"); // untimed
    const rows: string[][] = [];
    for (const batch of BATCHES) {
      const best = grammars.map(() => ({ seconds: Number.POSITIVE_INFINITY, steps: 0 }));
      for (let r = 0; r < REPEATS; r++) {
        for (const [i, [, grammar]] of grammars.entries()) {
          const s = await stepSeconds(engine, batch, grammar, `b${batch}-${r}-${i}`);
          if (s.seconds < (best[i]?.seconds ?? 0)) best[i] = s;
        }
      }
      const base = best[0]?.seconds ?? 1;
      for (const [i, [name]] of grammars.entries()) {
        const s = best[i] as { seconds: number; steps: number };
        log(`batch ${batch}, ${name}: ${fmt(s.seconds * 1000, 2)} ms over ${s.steps} steps`);
        rows.push([
          String(batch),
          name,
          fmt(s.seconds * 1000, 2),
          i === 0 ? "" : `+${fmt((s.seconds - base) * 1000, 2)} ms`,
        ]);
      }
    }
    await engine.shutdown();
    process.stdout.write(
      `grammar masks at a vocabulary of ${VOCAB}, ${threads} threads, decode step (ms):\n` +
        table([["batch", "grammar", "step", "over none"], ...rows], new Set([0, 2, 3])).join("\n") +
        "\n",
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
