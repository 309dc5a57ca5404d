// config.json as transformers 4.x and 5.x write it (rope_theta / rope_parameters,
// torch_dtype / dtype), what the native trainer refuses in them, and the dtype spellings
// --save-dtype accepts. The untied-tf5 fixture is saved in transformers 5's format
// (make_fixtures.py; check_transformers.py compares it with transformers itself).
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { readSafetensors } from "../../src/tensors/safetensors.js";
import {
  CPU,
  caseFile,
  copyModel,
  get,
  type ModelName,
  maxAbsDiff,
  readFloats,
  tempDir,
  trainer,
  trainerOk,
} from "./helpers.js";

type Config = Record<string, unknown>;

/** A copy of a fixture model whose config.json is `edit`'s result. */
function withConfig(m: ModelName, edit: (c: Config) => Config): { dir: string; path: string } {
  const dir = copyModel(m);
  const path = join(dir, "config.json");
  writeFileSync(path, JSON.stringify(edit(JSON.parse(readFileSync(path, "utf8")) as Config)));
  return { dir, path };
}

/** transformers 5's form of a 4.x config: rope_parameters, dtype, layer_types. */
function toTf5({ rope_theta, torch_dtype, ...rest }: Config): Config {
  return {
    ...rest,
    dtype: torch_dtype,
    rope_parameters: { rope_theta, rope_type: "default" },
    layer_types: Array(rest.num_hidden_layers).fill("full_attention"),
    sliding_window: null,
  };
}

async function logprobs(dir: string, m: ModelName): Promise<Float32Array> {
  const out = join(tempDir(), "score.safetensors");
  trainerOk(["score", "--model", dir, "--batch", caseFile(m), "--out", out, ...CPU]);
  return get(await readFloats(out), "logprobs");
}

describe("config.json in transformers 5's format", () => {
  it("reads rope_theta from rope_parameters (untied-tf5: 1e6) and matches PyTorch", async () => {
    const { dir } = withConfig("untied-tf5", (c) => c);
    const ref = get(await readFloats(caseFile("untied-tf5")), "ref.logprobs");
    expect(maxAbsDiff(await logprobs(dir, "untied-tf5"), ref)).toBeLessThan(1e-4);
  });

  it("scores the tied model (rope_theta 1e6) the same in either format", async () => {
    const { dir: v4 } = withConfig("tied", (c) => c);
    const { dir: v5 } = withConfig("tied", toTf5);
    expect(await logprobs(v5, "tied")).toEqual(await logprobs(v4, "tied"));
  });

  it("takes rope_parameters' theta over a top-level one, as transformers 5 does", async () => {
    const { dir } = withConfig("untied-tf5", (c) => ({ ...c, rope_theta: 10000.0 }));
    const ref = get(await readFloats(caseFile("untied-tf5")), "ref.logprobs");
    expect(maxAbsDiff(await logprobs(dir, "untied-tf5"), ref)).toBeLessThan(1e-4);
  });

  it('accepts rope_scaling {"type": "default"} (older transformers)', async () => {
    const { dir } = withConfig("tied", (c) => ({ ...c, rope_scaling: { type: "default" } }));
    const { dir: plain } = withConfig("tied", (c) => c);
    expect(await logprobs(dir, "tied")).toEqual(await logprobs(plain, "tied"));
  });

  const yarn = { rope_type: "yarn", factor: 4.0, original_max_position_embeddings: 32 };
  it.each<[string, ModelName, (c: Config) => Config, string]>([
    [
      "a yarn rope_parameters",
      "untied-tf5",
      (c) => ({ ...c, rope_parameters: { ...yarn, rope_theta: 1e6 } }),
      "field 'rope_parameters.rope_type' 'yarn' is not supported (only the default rotary embedding is)",
    ],
    [
      "a linear rope_parameters under the old key 'type'",
      "untied-tf5",
      (c) => ({ ...c, rope_parameters: { type: "linear", factor: 2.0, rope_theta: 1e6 } }),
      "field 'rope_parameters.type' 'linear' is not supported",
    ],
    [
      "per-layer-type rope_parameters with llama3",
      "untied-tf5",
      (c) => ({ ...c, rope_parameters: { full_attention: { rope_type: "llama3", factor: 8 } } }),
      "field 'rope_parameters.full_attention.rope_type' 'llama3' is not supported",
    ],
    [
      "a rope_parameters that is not an object",
      "untied-tf5",
      (c) => ({ ...c, rope_parameters: "yarn" }),
      "field 'rope_parameters' must be an object",
    ],
    [
      "a dynamic rope_scaling beside rope_parameters (transformers 5 reads rope_scaling first)",
      "untied-tf5",
      (c) => ({ ...c, rope_scaling: { type: "dynamic", factor: 2.0 } }),
      "field 'rope_scaling.type' 'dynamic' is not supported",
    ],
    [
      "a sliding-attention layer in layer_types",
      "untied-tf5",
      (c) => ({ ...c, layer_types: ["full_attention", "sliding_attention"], sliding_window: 4 }),
      `field 'layer_types' [1] "sliding_attention" is not supported (full_attention only)`,
    ],
    [
      "an unknown dtype",
      "untied-tf5",
      (c) => ({ ...c, dtype: "int8" }),
      "field 'dtype' 'int8' is not supported (float32, bfloat16, float16)",
    ],
  ])("refuses %s, naming config.json and the field", (_what, m, edit, message) => {
    const { dir, path } = withConfig(m, edit);
    const out = join(tempDir(), "s.safetensors");
    const r = trainer(["score", "--model", dir, "--batch", caseFile(m), "--out", out, ...CPU]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`${path}: ${message}`);
    expect(r.stderr).not.toContain("\n    at "); // one line, no trace
  });
});

/** One AdamW step at learning rate 0: the model saved unchanged, in `dtype`. */
function resave(dir: string, dtype: string): string {
  const out = join(tempDir(), "out");
  trainerOk([
    "sft",
    ...["--model", dir, "--data", caseFile("untied"), "--out", out, ...CPU],
    ...["--steps", "1", "--lr", "0", "--weight-decay", "0", "--save-dtype", dtype],
  ]);
  return out;
}

async function savedDtypes(dir: string): Promise<string[]> {
  const dtypes = new Set<string>();
  for (const f of readdirSync(dir).filter((n) => n.endsWith(".safetensors"))) {
    for (const t of (await readSafetensors(join(dir, f))).values()) dtypes.add(t.dtype);
  }
  return [...dtypes];
}

const readConfig = (dir: string) =>
  JSON.parse(readFileSync(join(dir, "config.json"), "utf8")) as Config;

describe("searchr1-trainer sft --save-dtype", () => {
  it.each([
    ["bf16", "BF16", "bfloat16"],
    ["bfloat16", "BF16", "bfloat16"],
    ["BF16", "BF16", "bfloat16"],
    ["fp16", "F16", "float16"],
    ["float16", "F16", "float16"],
    ["fp32", "F32", "float32"],
    ["float32", "F32", "float32"],
  ])("accepts %s: writes %s and torch_dtype %s", async (option, dtype, name) => {
    const { dir } = withConfig("untied", (c) => ({ ...c, torch_dtype: "float32" }));
    const out = resave(dir, option);
    expect(await savedDtypes(out)).toEqual([dtype]);
    expect(readConfig(out).torch_dtype).toBe(name);
  });

  it("updates transformers 5's dtype key, adding no torch_dtype beside it", async () => {
    const { dir } = withConfig("untied-tf5", (c) => c);
    const out = resave(dir, "bf16");
    const config = readConfig(out);
    expect(config.dtype).toBe("bfloat16");
    expect(config).not.toHaveProperty("torch_dtype");
    expect(await savedDtypes(out)).toEqual(["BF16"]);
    // keep then keeps what that key says.
    const again = resave(out, "keep");
    expect(await savedDtypes(again)).toEqual(["BF16"]);
  });

  it("prints one spelling in the help and the error", () => {
    expect(trainer(["sft", "--help"]).stdout).toContain("keep | bf16 | fp16 | fp32");
    const { dir } = withConfig("untied", (c) => c);
    const r = trainer([
      ...["sft", "--model", dir, "--data", caseFile("untied"), "--out", join(dir, "o")],
      ...["--save-dtype", "int8"],
    ]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("--save-dtype: unknown dtype 'int8' (keep, bf16, fp16, fp32)");
  });
});
