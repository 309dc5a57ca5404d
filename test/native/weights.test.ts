// Hugging Face folders in and out of the native trainer: bit-exact save/load in every
// dtype, sharded files, and the errors for weights that do not fit the config.
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  f16ToF32,
  f32ToF16,
  readSafetensors,
  type Tensor,
  writeSafetensors,
} from "../../src/tensors/safetensors.js";
import {
  caseFile,
  copyModel,
  get,
  type ModelName,
  modelDir,
  readFloats,
  tempDir,
  trainer,
  trainerOk,
} from "./helpers.js";

/** All tensors of a model folder (single file or shards), by name. */
async function folderTensors(dir: string): Promise<Map<string, Tensor>> {
  const all = new Map<string, Tensor>();
  for (const f of readdirSync(dir).filter((n) => n.endsWith(".safetensors"))) {
    for (const [name, t] of await readSafetensors(join(dir, f))) all.set(name, t);
  }
  return all;
}

/** Loads and saves a model without changing it: one AdamW step at learning rate 0. */
function resave(model: string, out: string, extra: string[] = []) {
  return trainerOk([
    "sft",
    ...["--model", model, "--data", caseFile("untied"), "--out", out],
    ...["--steps", "1", "--lr", "0", "--weight-decay", "0", ...extra],
  ]);
}

function bytesOf(t: Tensor): Buffer {
  return Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

async function expectSameWeights(a: string, b: string) {
  const x = await folderTensors(a);
  const y = await folderTensors(b);
  expect([...x.keys()].sort()).toEqual([...y.keys()].sort());
  for (const [name, t] of x) {
    const u = get(y, name);
    expect(u.dtype, name).toBe(t.dtype);
    expect(u.shape, name).toEqual(t.shape);
    expect(bytesOf(u).equals(bytesOf(t)), name).toBe(true);
  }
}

describe("native weights", () => {
  it.each<[ModelName, string]>([
    ["untied", "F32"],
    ["tied", "BF16"],
  ])("saves the %s model bit-exactly in its own dtype (%s)", async (model, dtype) => {
    const out = join(tempDir(), "out");
    resave(modelDir(model), out);
    await expectSameWeights(modelDir(model), out);
    expect([...(await folderTensors(out)).values()].every((t) => t.dtype === dtype)).toBe(true);
    expect(readFileSync(join(out, "config.json"), "utf8")).toContain(
      dtype === "F32" ? '"float32"' : '"bfloat16"',
    );
    // Nothing is left beside the output.
    expect(readdirSync(join(out, "..")).filter((n) => n.includes("partial"))).toEqual([]);
  });

  it("writes and reads back sharded folders with an index", async () => {
    const out = join(tempDir(), "sharded");
    resave(modelDir("untied"), out, ["--max-shard-size", "150KB"]);
    const files = readdirSync(out)
      .filter((f) => f.endsWith(".safetensors"))
      .sort();
    expect(files.length).toBeGreaterThan(2);
    expect(files[0]).toBe(`model-00001-of-0000${files.length}.safetensors`);
    const index = JSON.parse(readFileSync(join(out, "model.safetensors.index.json"), "utf8")) as {
      metadata: { total_size: number };
      weight_map: Record<string, string>;
    };
    const tensors = await folderTensors(out);
    const total = [...tensors.values()].reduce((s, t) => s + t.data.byteLength, 0);
    expect(index.metadata.total_size).toBe(total);
    expect(Object.keys(index.weight_map).sort()).toEqual([...tensors.keys()].sort());
    await expectSameWeights(modelDir("untied"), out);
    // And the sharded folder loads: scoring it gives exactly the original's results.
    const score = async (dir: string) => {
      const file = join(tempDir(), "s.safetensors");
      trainerOk(["score", "--model", dir, "--batch", caseFile("untied"), "--out", file]);
      return get(await readFloats(file), "logprobs");
    };
    expect(await score(out)).toEqual(await score(modelDir("untied")));
  });

  it("loads float16 weights as the float32 values they hold", async () => {
    const src = await readSafetensors(join(modelDir("untied"), "model.safetensors"));
    const half = copyModel("untied");
    const rounded = copyModel("untied");
    const asHalf = [];
    const asFloat = [];
    for (const [name, t] of src) {
      const bits = Uint16Array.from(t.data as Float32Array, (v) => f32ToF16(v));
      asHalf.push({ name, dtype: "F16" as const, shape: t.shape, data: bits });
      asFloat.push({
        name,
        dtype: "F32" as const,
        shape: t.shape,
        data: Float32Array.from(bits, f16ToF32),
      });
    }
    await writeSafetensors(join(half, "model.safetensors"), asHalf);
    await writeSafetensors(join(rounded, "model.safetensors"), asFloat);
    const score = async (dir: string) => {
      const file = join(tempDir(), "s.safetensors");
      trainerOk(["score", "--model", dir, "--batch", caseFile("untied"), "--out", file]);
      return get(await readFloats(file), "logprobs");
    };
    expect(await score(half)).toEqual(await score(rounded));
    // Saving keeps float16 when asked to.
    const out = join(tempDir(), "out");
    resave(half, out, ["--save-dtype", "float16"]);
    await expectSameWeights(half, out);
  });

  describe("refuses weights that do not fit config.json", () => {
    const q = "model.layers.1.self_attn.q_proj.weight";

    async function editWeights(edit: (t: Map<string, Tensor>) => void): Promise<string> {
      const dir = copyModel("untied");
      const file = join(dir, "model.safetensors");
      const tensors = await readSafetensors(file);
      edit(tensors);
      await writeSafetensors(
        file,
        [...tensors].map(([name, t]) => ({ name, dtype: t.dtype, shape: t.shape, data: t.data })),
      );
      return dir;
    }

    function scoreFails(dir: string): string {
      const r = trainer([
        "score",
        "--model",
        dir,
        "--batch",
        caseFile("untied"),
        "--out",
        join(dir, "s"),
      ]);
      expect(r.code).toBe(1);
      expect(existsSync(join(dir, "s"))).toBe(false);
      return r.stderr;
    }

    it("a missing tensor", async () => {
      const dir = await editWeights((t) => t.delete(q));
      expect(scoreFails(dir)).toContain(`tensor '${q}' is missing`);
    });

    it("a shape mismatch", async () => {
      const dir = await editWeights((t) => {
        const w = get(t, q);
        t.set(q, { ...w, shape: [32, 128], data: w.data });
      });
      expect(scoreFails(dir)).toContain(`tensor '${q}' has shape [32, 128]; expected [64, 64]`);
    });

    it("an integer dtype", async () => {
      const dir = await editWeights((t) => {
        const w = get(t, q);
        t.set(q, { dtype: "I32", shape: w.shape, data: new Int32Array(w.data.length) });
      });
      expect(scoreFails(dir)).toMatch(
        new RegExp(`tensor '${q}' has dtype I32; expected a floating-point dtype`),
      );
    });

    it("a tensor the config has no place for", async () => {
      const dir = await editWeights((t) => {
        t.set("model.layers.7.mlp.up_proj.weight", get(t, "model.layers.0.mlp.up_proj.weight"));
      });
      expect(scoreFails(dir)).toContain(
        "'model.layers.7.mlp.up_proj.weight' is not part of the model",
      );
    });

    it("a missing shard", () => {
      const dir = copyModel("tied");
      rmSync(join(dir, "model-00002-of-00002.safetensors"));
      expect(scoreFails(dir)).toContain("model-00002-of-00002.safetensors");
    });

    it.each([
      ["hidden_size", undefined, "field 'hidden_size' is missing"],
      ["hidden_act", "gelu", "field 'hidden_act' 'gelu' is not supported"],
      [
        "rope_scaling",
        { rope_type: "yarn", factor: 4 },
        "field 'rope_scaling.rope_type' 'yarn' is not supported",
      ],
      ["model_type", "gpt2", "field 'model_type' 'gpt2' is not supported"],
      ["num_key_value_heads", 3, "must divide num_attention_heads"],
    ])("config.json with %s = %j", (field, value, message) => {
      const dir = copyModel("untied");
      const path = join(dir, "config.json");
      const config = JSON.parse(readFileSync(path, "utf8")) as Record<string, unknown>;
      if (value === undefined) delete config[field];
      else config[field] = value;
      writeFileSync(path, JSON.stringify(config));
      const stderr = scoreFails(dir);
      expect(stderr).toContain(path);
      expect(stderr).toContain(message);
    });
  });
});
