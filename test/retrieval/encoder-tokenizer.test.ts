// The dense encoder's tokenizer against transformers' AutoTokenizer (Search-R1's retriever
// and index builder) on BERT folders without a complete tokenizer.json: one saved by
// `tokenizers`' BertWordPieceTokenizer (no post-processor) and one with only vocab.txt, and
// variants of their tokenizer_config.json (test/retrieval/make_bert_tokenizer_fixtures.py,
// committed). `build-index` on them writes transformers' vectors.
import { copyFileSync, cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { buildDenseIndex } from "../../src/retrieval/dense/build.js";
import { denseRecipe } from "../../src/retrieval/dense/recipe.js";
import { DenseRetriever } from "../../src/retrieval/dense/retriever.js";
import { InputError } from "../../src/runtime/errors.js";
import { createProgress } from "../../src/runtime/progress.js";
import { readSafetensors, type Tensor } from "../../src/tensors/safetensors.js";
import { loadEncoderTokenizer } from "../../src/text/encoder-tokenizer.js";

const FIXTURES = fileURLToPath(new URL("./fixtures/", import.meta.url));
const HERE = join(FIXTURES, "bert-tokenizers");
const MODEL = join(FIXTURES, "bert", "model");

interface Case {
  name: string;
  base: "wordpiece-saved" | "vocab-only";
  /** Files replaced in the base folder (null: removed). */
  files: Record<string, object | null>;
  /** Keys of tokenizer.json replaced. */
  tokenizer_json: Record<string, unknown>;
  refused: boolean;
  class?: string;
  input_ids?: number[][];
}
const cases = JSON.parse(readFileSync(join(HERE, "cases.json"), "utf8")) as {
  max_length: number;
  texts: string[];
  cases: Case[];
};
const expected = await readSafetensors(join(HERE, "expected.safetensors"));
const tensor = (name: string): Tensor => {
  const t = expected.get(name);
  if (!t) throw new Error(`expected.safetensors: no ${name}`);
  return t;
};

const tmp = mkdtempSync(join(tmpdir(), "sr1-enc-tok-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
let folders = 0;

/** A case's folder, with the fixture model's config.json (and weights when asked). */
function caseFolder(c: Pick<Case, "base" | "files" | "tokenizer_json">, weights = false): string {
  const dir = join(tmp, `case-${folders++}`);
  cpSync(join(HERE, c.base), dir, { recursive: true });
  copyFileSync(join(MODEL, "config.json"), join(dir, "config.json"));
  if (weights) copyFileSync(join(MODEL, "model.safetensors"), join(dir, "model.safetensors"));
  for (const [name, value] of Object.entries(c.files)) {
    if (value === null) rmSync(join(dir, name));
    else writeFileSync(join(dir, name), JSON.stringify(value));
  }
  if (Object.keys(c.tokenizer_json).length > 0) {
    const path = join(dir, "tokenizer.json");
    const json = JSON.parse(readFileSync(path, "utf8"));
    writeFileSync(path, JSON.stringify({ ...json, ...c.tokenizer_json }));
  }
  return dir;
}

/** Rows of an [B, T] I64 tensor, cut to their attention masks. */
function maskedRows(ids: Tensor, mask: Tensor): number[][] {
  const [B, T] = ids.shape as [number, number];
  const data = ids.data as BigInt64Array;
  const m = mask.data as BigInt64Array;
  return Array.from({ length: B }, (_, b) => {
    const row: number[] = [];
    for (let t = 0; t < T; t++) if (m[b * T + t] === 1n) row.push(Number(data[b * T + t]));
    return row;
  });
}

describe("the encoder's tokenizer: ids equal transformers' AutoTokenizer", () => {
  const accepted = cases.cases.filter((c) => !c.refused);
  it.each(accepted.map((c) => [`${c.name} (${c.class})`, c] as const))("%s", async (_, c) => {
    const tok = loadEncoderTokenizer(caseFolder(c), { maxLength: cases.max_length });
    const ids = await tok.encodeBatch(cases.texts, { addSpecialTokens: true });
    ids.forEach((row, i) => {
      expect(row, JSON.stringify(cases.texts[i])).toEqual(c.input_ids?.[i]);
    });
  });

  it("on a complete tokenizer.json (fixtures/bert/model, e5-base-v2's layout) too", async () => {
    const bert = await readSafetensors(join(FIXTURES, "bert", "expected.safetensors"));
    const texts = JSON.parse(readFileSync(join(FIXTURES, "bert", "texts.json"), "utf8")) as {
      max_length: number;
      texts: string[];
    };
    const tok = loadEncoderTokenizer(MODEL, { maxLength: texts.max_length });
    const ids = await tok.encodeBatch(texts.texts, { addSpecialTokens: true });
    expect(ids).toEqual(
      maskedRows(bert.get("input_ids") as Tensor, bert.get("attention_mask") as Tensor),
    );
  });

  it("the long text is cut to max_length with room for [CLS] and [SEP]", () => {
    const c = accepted.find((c) => c.name === "vocab-only") as Case;
    const long = c.input_ids?.at(-1) as number[];
    expect(long).toHaveLength(cases.max_length);
    expect([long[0], long.at(-1)]).toEqual([2, 3]);
  });
});

describe("the encoder's tokenizer: refusals name the file", () => {
  const refused = cases.cases.filter((c) => c.refused);
  it.each(refused.map((c) => [c.name, c] as const))("%s", (_, c) => {
    const dir = caseFolder(c);
    const file = join(dir, c.base === "vocab-only" ? "vocab.txt" : "tokenizer.json");
    expect(() => loadEncoderTokenizer(dir)).toThrow(InputError);
    expect(() => loadEncoderTokenizer(dir)).toThrow(`${file}: `);
    const cls = (c.files["tokenizer_config.json"] as { tokenizer_class: string }).tokenizer_class;
    expect(() => loadEncoderTokenizer(dir)).toThrow(cls);
  });

  it("a folder with neither tokenizer.json nor vocab.txt", () => {
    const dir = caseFolder({ base: "vocab-only", files: {}, tokenizer_json: {} });
    rmSync(join(dir, "vocab.txt"));
    expect(() => loadEncoderTokenizer(dir, { missing: "needed here" })).toThrow(
      `${join(dir, "tokenizer.json")}: no such file (nor vocab.txt); needed here`,
    );
  });

  it("an unk_token missing from the vocabulary, a bad option", () => {
    const unk = caseFolder({
      base: "vocab-only",
      files: {
        "tokenizer_config.json": { tokenizer_class: "BertTokenizer", unk_token: "<unk>" },
        "special_tokens_map.json": null, // whose unk_token would win
      },
      tokenizer_json: {},
    });
    expect(() => loadEncoderTokenizer(unk)).toThrow(
      `${join(unk, "vocab.txt")}: the unk_token "<unk>" is not in the vocabulary`,
    );
    const bad = caseFolder({
      base: "wordpiece-saved",
      files: {
        "tokenizer_config.json": { tokenizer_class: "BertTokenizer", do_lower_case: "yes" },
      },
      tokenizer_json: {},
    });
    expect(() => loadEncoderTokenizer(bad)).toThrow(
      `${join(bad, "tokenizer_config.json")}: do_lower_case: expected true or false, got "yes"`,
    );
  });
});

/** The float vectors of a faiss IndexFlat file (data from byte 45). */
function flatVectors(file: string): Float32Array {
  const copy = new Uint8Array(readFileSync(file).subarray(45));
  return new Float32Array(copy.buffer, 0, copy.length / 4);
}

describe("build-index --retriever e5 on these folders", () => {
  it.each(["wordpiece-saved", "vocab-only"] as const)(
    "%s: transformers' vectors (index_builder.py's e5 recipe, cut to the 64 positions)",
    async (base) => {
      const model = caseFolder({ base, files: {}, tokenizer_json: {} }, true);
      const corpus = join(tmp, `${base}.jsonl`);
      const rows = cases.texts.map((contents, i) => JSON.stringify({ id: `doc-${i}`, contents }));
      writeFileSync(corpus, `${rows.join("\n")}\n`);
      const recipe = denseRecipe("e5");
      // what the build encodes: "passage: " + contents, cut to the model's positions
      const tok = loadEncoderTokenizer(model, { maxLength: 64 });
      const ids = await tok.encodeBatch(
        cases.texts.map((t) => recipe.passagePrefix + t),
        { addSpecialTokens: true },
      );
      expect(ids).toEqual(
        maskedRows(tensor(`${base}.input_ids`), tensor(`${base}.attention_mask`)),
      );

      const out = join(tmp, `${base}.index`);
      const result = await buildDenseIndex({
        corpus,
        out,
        model,
        recipe,
        batchSize: 3,
        device: "cpu",
        threads: 1,
        overwrite: false,
        faissType: "Flat",
        efConstruction: null,
        progress: createProgress({ quiet: true }),
      });
      expect(result.rows).toBe(cases.texts.length);
      const got = flatVectors(out);
      const want = tensor(`${base}.mean`).data as Float32Array;
      expect(got.length).toBe(want.length);
      let worst = 0;
      for (let i = 0; i < got.length; i++) {
        worst = Math.max(worst, Math.abs((got[i] as number) - (want[i] as number)));
      }
      expect(worst).toBeLessThan(1e-5);

      // serve-retriever's query side tokenizes the same way: each text, prefixed as its
      // passage was, finds its own row with cosine 1
      const retriever = await DenseRetriever.open({
        kind: "e5",
        index: out,
        model,
        recipe: { ...recipe, queryPrefix: recipe.passagePrefix },
        efSearch: null,
        device: "cpu",
        threads: 1,
      });
      try {
        const hits = await retriever.search(cases.texts, 1);
        expect(hits.map((h) => h[0]?.row)).toEqual(cases.texts.map((_, i) => i));
        for (const h of hits) expect(h[0]?.score).toBeCloseTo(1, 5);
      } finally {
        await retriever.close();
      }
    },
    60_000,
  );
});
