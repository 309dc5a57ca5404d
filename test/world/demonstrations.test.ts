import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readSafetensors, toFloat32 } from "../../src/tensors/safetensors.js";
import { ModelTokenizer } from "../../src/text/model-tokenizer.js";
import {
  type DemonstrationSummary,
  openIndexSearch,
  readWorld,
  type WorldFile,
  type WorldSummary,
  writeDemonstrations,
  writeWorld,
} from "../../src/world/index.js";
import { runCli } from "../helpers/cli.js";
import { CPU, trainerOk } from "../native/helpers.js";

const root = mkdtempSync(join(tmpdir(), "sr1-world-demos-"));
const index = join(root, "bm25");
let world: WorldSummary;
let file: WorldFile;
let demos: DemonstrationSummary;

interface Run {
  mask: number;
  text: string;
}

interface DemoLine {
  id: string;
  data_source: string;
  question: string;
  golden_answers: string[];
  kind: string;
  searches: number;
  tokens: number;
  prompt: string;
  response: string;
}

beforeAll(async () => {
  world = await writeWorld(join(root, "world"), { seed: 7 });
  file = await readWorld(world.dir);
  const built = runCli([
    "build-index",
    "--retriever",
    "bm25",
    "--corpus",
    world.corpus,
    "--out",
    index,
    "--threads",
    "1",
    "--quiet",
  ]);
  if (built.code !== 0) throw new Error(`build-index failed: ${built.stderr}`);
  demos = await writeDemonstrations(world.dir, index);
}, 120_000);

afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("BM25 over the world's corpus", () => {
  it("finds the passage a hop needs in the top 3 for its query", async () => {
    const search = await openIndexSearch(index, world.corpus);
    try {
      const rate = async (hops: { query: string; subject: string }[]) => {
        const results = await search.search(
          hops.map((h) => h.query),
          3,
        );
        const found = results.filter((passages, i) =>
          passages.some((p) => p.contents.startsWith(`"${hops[i]?.subject}"\n`)),
        );
        return found.length / hops.length;
      };
      const firstHops = file.questions
        .filter((q) => q.dataSource === "world1hop")
        .map((q) => q.hops[0]);
      const secondHops = file.questions
        .filter((q) => q.dataSource === "world2hop")
        .map((q) => q.hops[1]);
      const oneHop = await rate(firstHops as { query: string; subject: string }[]);
      const twoHop = await rate(secondHops as { query: string; subject: string }[]);
      // Measured with the default world (seed 7): 1.0 for both.
      expect(oneHop).toBeGreaterThanOrEqual(0.95);
      expect(twoHop).toBeGreaterThanOrEqual(0.95);
    } finally {
      await search.close();
    }
  });
});

describe("writeDemonstrations", () => {
  let lines: DemoLine[];
  let tok: ModelTokenizer;
  beforeAll(() => {
    lines = readFileSync(demos.jsonl, "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as DemoLine);
    tok = ModelTokenizer.load(world.model);
  });

  it("demonstrates every training question, some searching and some guessing", () => {
    const train = file.questions.filter((q) => q.split === "train");
    expect(demos.rows).toBe(train.length);
    expect(lines).toHaveLength(train.length);
    expect(new Set(lines.map((l) => `${l.data_source}/${l.id}`)).size).toBe(train.length);
    expect(demos.kinds.guess).toBeGreaterThan(0.3 * train.length);
    expect(demos.kinds.search).toBeGreaterThan(0.3 * train.length);
    for (const l of lines) {
      const q = train.find((t) => t.id === l.id && t.dataSource === l.data_source);
      expect(q).toBeDefined();
      const answer = /<answer> (.*) <\/answer><\|im_end\|>$/.exec(l.response)?.[1];
      if (l.kind === "search") {
        expect(l.searches).toBe(q?.hops.length);
        expect(answer).toBe(q?.answer);
      }
      if (l.kind === "guess") {
        expect(l.searches).toBe(0);
        expect(l.response).not.toContain("<search>");
      }
      expect((l.response.match(/<information>/g) ?? []).length).toBe(l.searches);
    }
  });

  it("masks the prompt, the observations and a guess's name, and trains on every other generated token", async () => {
    const tensors = await readSafetensors(demos.safetensors);
    const ids = tensors.get("input_ids");
    const attention = tensors.get("attention_mask");
    const loss = tensors.get("loss_mask");
    if (!ids || !attention || !loss) throw new Error("a tensor is missing");
    const [B, T] = ids.shape as [number, number];
    expect(B).toBe(demos.rows);
    expect(T).toBe(demos.maxTokens);
    expect([ids.dtype, attention.dtype, loss.dtype]).toEqual(["I64", "I64", "F32"]);
    // The sentences of held-out facts: a training target must never state one.
    const heldOut = new Set(
      file.questions
        .filter((q) => q.split === "test")
        .flatMap((q) => q.hops)
        .filter((h) =>
          file.facts.people.some((p) => p.name === h.subject && p.heldOut === h.relation),
        )
        .map((h) => h.fact),
    );
    expect(heldOut.size).toBeGreaterThan(0);
    const idv = ids.data as BigInt64Array;
    const att = attention.data as BigInt64Array;
    const lm = toFloat32(loss);
    for (let b = 0; b < B; b++) {
      const line = lines[b] as DemoLine;
      const row = Array.from({ length: line.tokens }, (_, t) => Number(idv[b * T + t]));
      expect(att[b * T + line.tokens - 1]).toBe(1n);
      if (line.tokens < T) {
        expect(att[b * T + line.tokens]).toBe(0n);
        expect(lm[b * T + line.tokens]).toBe(0);
      }
      // The prompt's ids come first, exactly as the chat template renders and encodes them.
      const prompt = await tok.encode(line.prompt, { addSpecialTokens: false });
      expect(row.slice(0, prompt.length)).toEqual(prompt);
      expect(await tok.decode(row, false)).toBe(line.prompt + line.response);
      // Runs of equal mask: after the prompt, generated turns (1) and observations (0) alternate.
      const runs: Run[] = [];
      let start = 0;
      for (let t = 1; t <= line.tokens; t++) {
        if (t === line.tokens || lm[b * T + t] !== lm[b * T + start]) {
          const text = await tok.decode(row.slice(start, t), false);
          runs.push({ mask: lm[b * T + start] as number, text });
          start = t;
        }
      }
      expect(runs[0]).toEqual({ mask: 0, text: line.prompt });
      // A guess's name is not trained: its turn is three runs, the name masked between the
      // turn's head and its end.
      const guessed = line.kind !== "search";
      const turns = runs.slice(1);
      const last = guessed ? turns.splice(-3) : [];
      for (const [i, run] of turns.entries()) {
        expect(run.mask).toBe(i % 2 === 0 ? 1 : 0);
        if (run.mask === 1) {
          for (const fact of heldOut) expect(run.text).not.toContain(fact);
          expect(run.text).toMatch(/^<think> .* <\/think>\n<(search|answer)> /);
          expect(run.text).toMatch(/(<\/search>|<\/answer><\|im_end\|>)$/);
        } else {
          expect(run.text).toMatch(
            /^\n\n<information>Doc 1\(Title: "[^"]+"\) [\s\S]*<\/information>\n\n$/,
          );
        }
      }
      if (guessed) {
        const [head, name, end] = last as [Run, Run, Run];
        expect([head.mask, name.mask, end.mask]).toEqual([1, 0, 1]);
        expect(head.text).toMatch(/^<think> .* <\/think>\n<answer>$/);
        expect(name.text).toMatch(/^ [A-Z][a-z]+( [A-Z][a-z]+)?$/);
        expect(end.text).toBe(" </answer><|im_end|>");
      }
    }
  });

  it("loads into the native trainer, whose loss is finite over two SFT steps", () => {
    const out = join(root, "sft-model");
    const r = trainerOk([
      "sft",
      ...CPU,
      "--model",
      world.model,
      "--data",
      demos.safetensors,
      "--out",
      out,
      "--steps",
      "2",
      "--batch-size",
      "16",
      "--micro-batch-size",
      "8",
      "--lr",
      "1e-3",
    ]);
    const losses = [...r.stdout.matchAll(/loss (\S+)/g)].map((m) => Number(m[1]));
    expect(losses).toHaveLength(2);
    for (const loss of losses) expect(Number.isFinite(loss)).toBe(true);
    // An untrained model starts near ln(vocab) = ln(~1200) ≈ 7.1.
    expect(losses[0]).toBeGreaterThan(6);
    expect(losses[0]).toBeLessThan(8);
    expect(readFileSync(join(out, "tokenizer.json"), "utf8")).toBe(
      readFileSync(join(world.model, "tokenizer.json"), "utf8"),
    );
  });
});
