import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "tokenizers";
import { afterAll, describe, expect, it } from "vitest";
import {
  f32ToBf16,
  type NamedTensor,
  readSafetensors,
  type Tensor,
  writeSafetensors,
} from "../../src/tensors/safetensors.js";
import { gpuStatus } from "../native/helpers.js";
import { runIndex } from "./index-tool.js";

const FIXTURES = fileURLToPath(new URL("./fixtures/bert/", import.meta.url));
const MODEL = join(FIXTURES, "model");
const EXPECTED = join(FIXTURES, "expected.safetensors");
const TOL = 1e-4; // max |native - transformers| of an embedding element (fp32 both)
const tmp = mkdtempSync(join(tmpdir(), "sr1-bert-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const index = runIndex;

const expected = await readSafetensors(EXPECTED);
const tensor = (name: string): Tensor => {
  const t = expected.get(name);
  if (!t) throw new Error(`${EXPECTED}: no ${name}`);
  return t;
};
const [B, T] = tensor("input_ids").shape as [number, number];
const ids = tensor("input_ids").data as BigInt64Array;
const mask = tensor("attention_mask").data as BigInt64Array;
const DIM = tensor("mean").shape[1] as number;
const texts = JSON.parse(readFileSync(join(FIXTURES, "texts.json"), "utf8")) as {
  max_length: number;
  texts: string[];
};

let files = 0;
/** An input file of int64 rows (and a mask unless null). */
async function input(
  rows: bigint[][],
  rowMask: bigint[][] | null,
  dtype: "I64" | "I32" = "I64",
): Promise<string> {
  const path = join(tmp, `in-${files++}.safetensors`);
  const shape = [rows.length, rows[0]?.length ?? 0];
  const pack = (r: bigint[][]) =>
    dtype === "I64" ? BigInt64Array.from(r.flat()) : Int32Array.from(r.flat(), Number);
  const tensors: NamedTensor[] = [{ name: "input_ids", dtype, shape, data: pack(rows) }];
  if (rowMask) tensors.push({ name: "attention_mask", dtype, shape, data: pack(rowMask) });
  await writeSafetensors(path, tensors);
  return path;
}

/** Runs encode and returns the embeddings [rows, DIM] and the JSON line. */
async function encode(
  inputPath: string,
  extra: string[] = [],
  model = MODEL,
  env: Record<string, string> = {},
): Promise<{ emb: Float32Array; line: { rows: number; dim: number; seconds: number } }> {
  const out = join(tmp, `out-${files++}.safetensors`);
  const args = ["encode", "--model", model, "--input", inputPath, "--out", out, ...extra];
  const r = index(args, undefined, env);
  if (r.code !== 0) throw new Error(`encode exited ${r.code}: ${r.stderr}`);
  const t = (await readSafetensors(out)).get("embeddings") as Tensor;
  expect(t.dtype).toBe("F32");
  expect(t.shape[1]).toBe(DIM);
  return { emb: t.data as Float32Array, line: JSON.parse(r.stdout) };
}

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) {
    worst = Math.max(worst, Math.abs((a[i] as number) - (b[i] as number)));
  }
  return worst;
}

/** Row b of the fixture batch, cut to its real tokens (right padding). */
function realRow(b: number): bigint[] {
  const row: bigint[] = [];
  for (let t = 0; t < T; t++) if (mask[b * T + t] === 1n) row.push(ids[b * T + t] as bigint);
  return row;
}

const batchRows = (): bigint[][] =>
  Array.from({ length: B }, (_, b) => Array.from(ids.subarray(b * T, (b + 1) * T)));
const batchMask = (): bigint[][] =>
  Array.from({ length: B }, (_, b) => Array.from(mask.subarray(b * T, (b + 1) * T)));

describe("searchr1-index encode against transformers", () => {
  it("the fixture pads and truncates: rows of 3 to max_length real tokens", () => {
    const lengths = Array.from({ length: B }, (_, b) => realRow(b).length);
    expect(T).toBe(texts.max_length);
    expect(Math.max(...lengths)).toBe(T);
    expect(Math.min(...lengths)).toBeLessThan(8);
  });

  it("gives the mean-pooled, L2-normalised embeddings (padded rows included)", async () => {
    const { emb, line } = await encode(EXPECTED, ["--device", "cpu"]);
    expect(line.rows).toBe(B);
    expect(line.dim).toBe(DIM);
    const diff = maxAbsDiff(emb, tensor("mean").data as Float32Array);
    console.log(`encode --pooling mean: max |native - transformers| = ${diff.toExponential(2)}`);
    expect(diff).toBeLessThan(TOL);
  });

  it("gives the [CLS] embeddings", async () => {
    const { emb } = await encode(EXPECTED, ["--pooling", "cls", "--device", "cpu"]);
    const diff = maxAbsDiff(emb, tensor("cls").data as Float32Array);
    console.log(`encode --pooling cls: max |native - transformers| = ${diff.toExponential(2)}`);
    expect(diff).toBeLessThan(TOL);
  });

  it("--no-normalize keeps the pooled vectors, whose direction is the embedding", async () => {
    const { emb } = await encode(EXPECTED, ["--no-normalize", "--device", "cpu"]);
    const ref = tensor("mean").data as Float32Array;
    for (let b = 0; b < B; b++) {
      const row = emb.subarray(b * DIM, (b + 1) * DIM);
      const norm = Math.hypot(...row);
      expect(Math.abs(norm - 1)).toBeGreaterThan(1e-3);
      const unit = row.map((v) => v / norm);
      expect(maxAbsDiff(unit, ref.subarray(b * DIM, (b + 1) * DIM))).toBeLessThan(TOL);
    }
  });

  it("embeds a row alone as it does inside the padded batch (padding invariance)", async () => {
    const batch = await encode(EXPECTED);
    const alone = await Promise.all(
      Array.from({ length: B }, (_, b) => input([realRow(b)], null, b % 2 ? "I32" : "I64")),
    );
    let worst = 0;
    for (let b = 0; b < B; b++) {
      const { emb } = await encode(alone[b] as string);
      worst = Math.max(worst, maxAbsDiff(emb, batch.emb.subarray(b * DIM, (b + 1) * DIM)));
    }
    console.log(`a row alone vs in the padded batch: max diff ${worst.toExponential(2)}`);
    expect(worst).toBeLessThan(1e-5);
    // More padding (T = 40; positions count from the row's start, so padding stays on the
    // right, as the tokenizer puts it), padding ids other than [PAD], and the batch split in
    // forward passes of 3 rows.
    const wider = batchRows().map((r) => [...r, ...Array.from({ length: 8 }, () => 7n)]);
    const widerMask = batchMask().map((m) => [...m, ...Array.from({ length: 8 }, () => 0n)]);
    const { emb } = await encode(await input(wider, widerMask), ["--batch-size", "3"]);
    expect(maxAbsDiff(emb, batch.emb)).toBeLessThan(1e-5);
  });

  it("reads BF16 weights, a BertFor* checkpoint's 'bert.' prefix and LayerNorm gamma/beta", async () => {
    const weights = await readSafetensors(join(MODEL, "model.safetensors"));
    const rename = (name: string) =>
      `bert.${name.replace(/LayerNorm\.weight$/, "LayerNorm.gamma").replace(/LayerNorm\.bias$/, "LayerNorm.beta")}`;
    const renamed = join(tmp, "renamed");
    const bf16 = join(tmp, "bf16");
    for (const dir of [renamed, bf16]) {
      cpSync(MODEL, dir, { recursive: true });
      rmSync(join(dir, "model.safetensors"));
    }
    const named = [...weights].map(([name, t]) => ({ name: rename(name), ...t }));
    // a task head and the pooler are ignored
    named.push({
      name: "cls.predictions.bias",
      dtype: "F32",
      shape: [3],
      data: new Float32Array(3),
    });
    await writeSafetensors(join(renamed, "model.safetensors"), named);
    await writeSafetensors(
      join(bf16, "model.safetensors"),
      [...weights].map(([name, t]) => ({
        name,
        dtype: "BF16" as const,
        shape: t.shape,
        data: Uint16Array.from(t.data as Float32Array, f32ToBf16),
      })),
    );
    const ref = await encode(EXPECTED);
    expect((await encode(EXPECTED, [], renamed)).emb).toEqual(ref.emb);
    const fromBf16 = await encode(EXPECTED, [], bf16);
    const diff = maxAbsDiff(fromBf16.emb, ref.emb);
    expect(diff).toBeGreaterThan(0);
    expect(diff).toBeLessThan(0.05);
  });
});

describe("searchr1-index encode refuses bad input", () => {
  const fails = (args: string[], pattern: RegExp, code = 1) => {
    const r = index(["encode", "--device", "cpu", "--out", join(tmp, "x.safetensors"), ...args]);
    expect(r.code, r.stderr).toBe(code);
    const line = r.stderr.trim();
    expect(line.split("\n")).toHaveLength(1);
    expect(line).toMatch(pattern);
  };

  it("a missing model folder or input file", () => {
    fails(["--model", join(tmp, "nope"), "--input", EXPECTED], /nope\/config\.json/);
    fails(["--model", MODEL, "--input", join(tmp, "none.safetensors")], /none\.safetensors/);
  });

  it("more tokens per row than max_position_embeddings", async () => {
    const long = await input([Array.from({ length: 65 }, () => 5n)], null);
    fails(
      ["--model", MODEL, "--input", long],
      /'input_ids' has 65 tokens per row, more than the max_position_embeddings \(64\)/,
    );
  });

  it("a token id outside the vocabulary, a bad mask, a missing or misshapen tensor", async () => {
    const vocab = JSON.parse(readFileSync(join(MODEL, "config.json"), "utf8")).vocab_size;
    const row = realRow(0);
    fails(
      ["--model", MODEL, "--input", await input([[...row.slice(0, 2), BigInt(vocab)]], null)],
      new RegExp(`'input_ids' holds token ${vocab} at \\[0, 2\\], outside the vocabulary`),
    );
    fails(
      ["--model", MODEL, "--input", await input([[2n, -1n, 3n]], null)],
      /'input_ids' holds token -1 at \[0, 1\]/,
    );
    fails(
      ["--model", MODEL, "--input", await input([[2n, 5n, 3n]], [[1n, 2n, 1n]])],
      /'attention_mask' holds 2 at \[0, 1\]; expected 0 or 1/,
    );
    fails(
      ["--model", MODEL, "--input", await input([[2n, 5n, 3n]], [[0n, 0n, 0n]])],
      /row 0 of 'attention_mask' is all 0/,
    );
    const noIds = join(tmp, "no-ids.safetensors");
    await writeSafetensors(noIds, [
      { name: "tokens", dtype: "I64", shape: [1, 2], data: BigInt64Array.from([2n, 3n]) },
    ]);
    fails(
      ["--model", MODEL, "--input", noIds],
      /no-ids\.safetensors: tensor 'input_ids' is missing/,
    );
    const shape = join(tmp, "shape.safetensors");
    await writeSafetensors(shape, [
      { name: "input_ids", dtype: "I64", shape: [1, 3], data: BigInt64Array.from([2n, 5n, 3n]) },
      { name: "attention_mask", dtype: "I64", shape: [1, 2], data: BigInt64Array.from([1n, 1n]) },
    ]);
    fails(
      ["--model", MODEL, "--input", shape],
      /'attention_mask' has shape \[1, 2\]; expected \[1, 3\]/,
    );
    fails(
      ["--model", MODEL, "--input", EXPECTED, "--pooling", "max"],
      /--pooling must be mean or cls/,
      2,
    );
  });

  it("a config.json of another architecture, or a missing weight", () => {
    const dir = join(tmp, "bad-model");
    cpSync(MODEL, dir, { recursive: true });
    const config = JSON.parse(readFileSync(join(MODEL, "config.json"), "utf8"));
    const write = (c: object) => writeFileSync(join(dir, "config.json"), JSON.stringify(c));
    write({ ...config, hidden_act: "gelu_new" });
    fails(
      ["--model", dir, "--input", EXPECTED],
      /config\.json: field 'hidden_act' 'gelu_new' is not supported/,
    );
    write({ ...config, model_type: "qwen2" });
    fails(["--model", dir, "--input", EXPECTED], /config\.json: field 'model_type' 'qwen2'/);
    write({ ...config, num_hidden_layers: 3 });
    fails(
      ["--model", dir, "--input", EXPECTED],
      /bad-model: tensor 'encoder\.layer\.2\.attention\.self\.query\.weight' is missing/,
    );
    write({ ...config, num_hidden_layers: 1 });
    fails(
      ["--model", dir, "--input", EXPECTED],
      /tensor 'encoder\.layer\.1\..*' belongs to layer 1, but config\.json says num_hidden_layers = 1/,
    );
  });
});

describe("the fixture's tokenizer.json in the tokenizers npm package", () => {
  it("gives transformers' ids and attention mask (truncation and padding as the retriever asks)", async () => {
    const tok = Tokenizer.fromFile(join(MODEL, "tokenizer.json"));
    tok.setTruncation(texts.max_length);
    tok.setPadding({ padId: 0, padToken: "[PAD]" });
    const enc = await tok.encodeBatch(texts.texts);
    expect(enc.map((e) => e.getIds())).toEqual(batchRows().map((r) => r.map(Number)));
    expect(enc.map((e) => e.getAttentionMask())).toEqual(batchMask().map((r) => r.map(Number)));
  });
});

const { gpu: cudaAvailable } = gpuStatus("retrieval/bert-encoder.test.ts");

// The encoder's attention is bidirectional: attention.cu's WMMA forward by default, and
// attention_mma.cu's with SEARCHR1_ATTENTION=mma (opt-in, not yet run on a GPU;
// docs/gpu-status.md), which the trainer's causal tests do not reach.
describe.skipIf(!cudaAvailable)("searchr1-index encode --device cuda", () => {
  it.each<[string, Record<string, string>]>([
    ["the default attention", {}],
    ["SEARCHR1_ATTENTION=mma", { SEARCHR1_ATTENTION: "mma" }],
  ])("gives the embeddings within bf16 tolerance (%s)", async (_name, env) => {
    for (const [pooling, ref] of [
      ["mean", "mean"],
      ["cls", "cls"],
    ] as const) {
      const args = ["--device", "cuda", "--pooling", pooling];
      const { emb } = await encode(EXPECTED, args, MODEL, env);
      const r = tensor(ref).data as Float32Array;
      // bf16 keeps 8 significant bits; a unit vector of 64 elements has entries near 0.12
      expect(maxAbsDiff(emb, r)).toBeLessThan(0.05);
      for (let b = 0; b < B; b++) {
        let dot = 0;
        for (let k = 0; k < DIM; k++)
          dot += (emb[b * DIM + k] as number) * (r[b * DIM + k] as number);
        expect(dot, `row ${b} cosine`).toBeGreaterThan(0.995);
      }
    }
  });
});
