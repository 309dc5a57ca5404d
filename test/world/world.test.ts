import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readSafetensors, toFloat32 } from "../../src/tensors/safetensors.js";
import { ModelTokenizer } from "../../src/text/model-tokenizer.js";
import {
  DATA_SOURCES,
  readWorld,
  WORLD_FILES,
  type WorldFile,
  type WorldQuestion,
  type WorldSummary,
  writeWorld,
} from "../../src/world/index.js";
import { TAG_TOKENS } from "../../src/world/tokenizer.js";
import { runCli } from "../helpers/cli.js";

const root = mkdtempSync(join(tmpdir(), "sr1-world-"));
let world: WorldSummary;
let file: WorldFile;
let corpus: { id: string; contents: string }[];
/** Passage text by title. */
let byTitle: Map<string, string>;

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, encoding: "utf8" })
    .filter((f) => statSync(join(dir, f)).isFile())
    .sort();
}

function jsonl<T>(path: string): T[] {
  return readFileSync(path, "utf8")
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as T);
}

beforeAll(async () => {
  world = await writeWorld(join(root, "a"), { seed: 7 });
  file = await readWorld(world.dir);
  corpus = jsonl(world.corpus);
  byTitle = new Map(
    corpus.map((r) => {
      const [title = "", ...rest] = r.contents.split("\n");
      return [title.slice(1, -1), rest.join("\n")];
    }),
  );
}, 60_000);

afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("writeWorld", () => {
  it("writes the same bytes for the same seed and another world for another seed", async () => {
    const again = await writeWorld(join(root, "b"), { seed: 7 });
    const names = filesUnder(world.dir);
    expect(filesUnder(again.dir)).toEqual(names);
    for (const name of names) {
      const same = readFileSync(join(world.dir, name)).equals(readFileSync(join(again.dir, name)));
      expect(same, name).toBe(true);
    }
    const other = await writeWorld(join(root, "c"), { seed: 8 });
    for (const name of [WORLD_FILES.corpus, "model/tokenizer.json", "model/model.safetensors"]) {
      expect(readFileSync(join(other.dir, name)).equals(readFileSync(join(world.dir, name)))).toBe(
        false,
      );
    }
  }, 60_000);

  it("refuses a folder that exists unless told to overwrite", async () => {
    await expect(writeWorld(world.dir, { seed: 7 })).rejects.toThrow(/--overwrite/);
  });

  it("lays out the corpus in Search-R1's format, one passage per entity plus distractors", () => {
    const { facts } = file;
    const entities =
      facts.people.length +
      facts.cities.length +
      facts.countries.length +
      facts.organisations.length;
    expect(corpus.length).toBe(entities + facts.distractors.length);
    expect(corpus.length).toBeLessThan(300);
    corpus.forEach((row, i) => {
      expect(Object.keys(row)).toEqual(["id", "contents"]);
      expect(row.id).toBe(String(i));
      expect(row.contents).toMatch(/^"[^"\n]+"\n[^\n]+$/);
    });
    expect(byTitle.size).toBe(corpus.length);
  });

  it("writes FlashRAG datasets that preprocess reads, matching world.json", () => {
    let train = 0;
    let test = 0;
    for (const source of DATA_SOURCES) {
      for (const split of ["train", "test"] as const) {
        const rows = jsonl<{ id: string; question: string; golden_answers: string[] }>(
          join(world.datasets, source, `${split}.jsonl`),
        );
        const expected = file.questions.filter((q) => q.dataSource === source && q.split === split);
        expect(rows).toEqual(
          expected.map((q) => ({ id: q.id, question: q.question, golden_answers: [q.answer] })),
        );
        if (split === "train") train += rows.length;
        else test += rows.length;
      }
    }
    expect(train).toBeGreaterThanOrEqual(200);
    expect(test).toBeGreaterThanOrEqual(50);
    expect(test).toBeLessThanOrEqual(100);

    const out = join(root, "parquet");
    const r = runCli(["preprocess", ...DATA_SOURCES, "--input", world.datasets, "--out", out]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`train\\.parquet +${train} rows`));
    expect(r.stdout).toMatch(new RegExp(`test\\.parquet +${test} rows`));
  });

  it("answers every question from the corpus: each hop's fact is in its subject's passage", () => {
    for (const q of file.questions) {
      expect(q.hops.length).toBe(q.dataSource === "world1hop" ? 1 : 2);
      q.hops.forEach((hop, i) => {
        const passage = byTitle.get(hop.subject);
        expect(passage, `${q.question}: no passage for ${hop.subject}`).toBeDefined();
        expect(passage).toContain(hop.fact);
        expect(hop.fact).toContain(hop.answer);
        // 2-hop: the second hop starts from what the first found.
        if (i > 0) expect(hop.subject).toBe(q.hops[i - 1]?.answer);
      });
      expect(q.answer).toBe(q.hops[q.hops.length - 1]?.answer);
      // The question names its person, and only the first hop's subject.
      expect(q.question).toContain(q.hops[0]?.subject);
    }
  });

  it("holds out facts: test questions need one, no training question states one", () => {
    const heldOut = new Set(
      file.facts.people.filter((p) => p.heldOut !== null).map((p) => `${p.name}/${p.heldOut}`),
    );
    expect(heldOut.size).toBe(Math.round(file.facts.people.length * 3 * 0.12));
    const needs = (q: WorldQuestion) =>
      q.hops.some((h) => heldOut.has(`${h.subject}/${h.relation}`));
    const train = file.questions.filter((q) => q.split === "train");
    const test = file.questions.filter((q) => q.split === "test");
    for (const q of train) expect(needs(q), q.question).toBe(false);
    for (const q of test) expect(needs(q), q.question).toBe(true);
    // Every held-out fact is asked about directly, and every person's name is in training.
    for (const fact of heldOut) {
      expect(
        test.some(
          (q) => q.hops.length === 1 && needs(q) && fact.startsWith(`${q.hops[0]?.subject}/`),
        ),
      ).toBe(true);
    }
    for (const p of file.facts.people) {
      expect(
        train.some((q) => q.hops[0]?.subject === p.name),
        p.name,
      ).toBe(true);
    }
    const trainTexts = new Set(train.map((q) => q.question));
    for (const q of test) expect(trainTexts.has(q.question)).toBe(false);
  });
});

describe("the world's tokenizer", () => {
  let tok: ModelTokenizer;
  beforeAll(() => {
    tok = ModelTokenizer.load(world.model);
  });

  it("round-trips every passage and question and keeps the vocabulary small", async () => {
    expect(tok.tokenizer.vocabSize).toBe(world.tokenIds.vocabSize);
    expect(world.tokenIds.vocabSize).toBeGreaterThan(800);
    expect(world.tokenIds.vocabSize).toBeLessThanOrEqual(2000);
    const texts = [...corpus.map((r) => r.contents), ...file.questions.map((q) => q.question)];
    const ids = await tok.tokenizer.encodeBatch(texts, { addSpecialTokens: false });
    const decoded = await tok.tokenizer.decodeBatch(ids, false);
    expect(decoded).toEqual(texts);
    // Names are single tokens after a space, mostly.
    const names = file.facts.people.map((p) => ` ${p.name}`);
    const lengths = await tok.tokenizer.encodeBatch(names, { addSpecialTokens: false });
    const single = lengths.filter((l) => l.length === 1).length;
    expect(single / names.length).toBeGreaterThan(0.8);
  });

  it("has the agent's tags as single non-special tokens and ChatML's special tokens", async () => {
    for (const tag of TAG_TOKENS) {
      const ids = await tok.encode(tag, { addSpecialTokens: false });
      expect(ids, tag).toHaveLength(1);
      expect(await tok.decode(ids, true)).toBe(tag);
    }
    for (const special of ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) {
      const ids = await tok.encode(special, { addSpecialTokens: false });
      expect(ids, special).toHaveLength(1);
      expect(await tok.decode(ids, true)).toBe("");
    }
    expect(tok.tokenizer.tokenToId("<|im_end|>")).toBe(world.tokenIds.imEnd);
    expect(tok.specialTokens).toMatchObject({
      eos_token: "<|im_end|>",
      pad_token: "<|endoftext|>",
    });
    // No special token is added by encode.
    const plain = await tok.encode("Where was it?", { addSpecialTokens: false });
    expect(await tok.encode("Where was it?", { addSpecialTokens: true })).toEqual(plain);
  });

  it("renders the chat template as Qwen2.5 does and keeps the Search-R1 prompt short", async () => {
    const content = "Answer the given question. Question: Where was X born?\n";
    const text = tok.applyChatTemplate([{ role: "user", content }], { addGenerationPrompt: true });
    expect(text).toBe(
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" +
        `<|im_start|>user\n${content}<|im_end|>\n<|im_start|>assistant\n`,
    );
    const withSystem = tok.applyChatTemplate(
      [
        { role: "system", content: "S" },
        { role: "user", content: "U" },
      ],
      { addGenerationPrompt: false },
    );
    expect(withSystem).toBe("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");

    const template = readFileSync(
      join(import.meta.dirname, "../../templates/search-r1.txt"),
      "utf8",
    );
    const lengths: number[] = [];
    for (const q of file.questions.slice(0, 50)) {
      const messages = [{ role: "user", content: template.replace("{question}", q.question) }];
      lengths.push((await tok.encodeChat(messages, { addGenerationPrompt: true })).length);
    }
    expect(Math.max(...lengths)).toBeLessThanOrEqual(150);
  });
});

describe("the world's model", () => {
  it("is a Qwen2 folder sized by the tokenizer, initialised with std 0.02", async () => {
    const config = JSON.parse(readFileSync(join(world.model, "config.json"), "utf8"));
    expect(config).toMatchObject({
      model_type: "qwen2",
      vocab_size: world.tokenIds.vocabSize,
      hidden_size: 128,
      eos_token_id: world.tokenIds.imEnd,
      max_position_embeddings: 1024,
      tie_word_embeddings: true,
    });
    const generation = JSON.parse(
      readFileSync(join(world.model, "generation_config.json"), "utf8"),
    );
    expect(generation.eos_token_id).toEqual([world.tokenIds.imEnd, world.tokenIds.endOfText]);
    const tensors = await readSafetensors(join(world.model, "model.safetensors"));
    const tensor = (name: string) => {
      const t = tensors.get(name);
      if (!t) throw new Error(`${name} is missing`);
      return t;
    };
    expect(tensor("model.embed_tokens.weight").shape).toEqual([world.tokenIds.vocabSize, 128]);
    const embed = toFloat32(tensor("model.embed_tokens.weight"));
    let sq = 0;
    for (const x of embed) sq += x * x;
    expect(Math.sqrt(sq / embed.length)).toBeCloseTo(0.02, 3);
    expect(toFloat32(tensor("model.norm.weight")).every((x) => x === 1)).toBe(true);
    expect(toFloat32(tensor("model.layers.0.self_attn.q_proj.bias")).every((x) => x === 0)).toBe(
      true,
    );
    expect(tensors.has("lm_head.weight")).toBe(false);
    const count = [...tensors.values()].reduce((n, t) => n + t.shape.reduce((a, b) => a * b, 1), 0);
    expect(count).toBe(world.parameters);
    expect(relative(world.dir, world.model)).toBe(WORLD_FILES.model);
  });
});
