import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { expectedTensors, verifyTensors } from "../../src/ckpt/expected-tensors.js";
import { InputError } from "../../src/runtime/errors.js";
import { table } from "../../src/runtime/table.js";
import { readSafetensorsHeader, type TensorInfo } from "../../src/tensors/safetensors.js";

const HF = path.join(import.meta.dirname, "fixtures", "hf");

function fixtureConfig(model: string): Record<string, unknown> {
  return JSON.parse(readFileSync(path.join(HF, model, "config.json"), "utf8"));
}

/** The tensors transformers saved for a fixture model, across its shards. */
async function fixtureTensors(model: string): Promise<TensorInfo[]> {
  const files = readdirSync(path.join(HF, model)).filter((f) => f.endsWith(".safetensors"));
  const headers = await Promise.all(
    files.sort().map((f) => readSafetensorsHeader(path.join(HF, model, f))),
  );
  return headers.flatMap((h) => h.tensors);
}

const sorted = (list: { name: string; shape: number[] }[]) =>
  list.map((t) => `${t.name} [${t.shape}]`).sort();

const BASE = {
  vocab_size: 100,
  hidden_size: 16,
  intermediate_size: 24,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
};

function byName(config: Record<string, unknown>): Map<string, number[]> {
  return new Map(expectedTensors(config, "c.json").map((t) => [t.name, t.shape]));
}

function thrown(config: Record<string, unknown>): Error {
  try {
    expectedTensors(config, "m/config.json");
  } catch (e) {
    expect(e).toBeInstanceOf(InputError);
    return e as Error;
  }
  throw new Error("expected an error");
}

describe("expectedTensors", () => {
  it.each([
    ["untied", 51],
    ["tied", 50],
    ["llama", 39],
  ])("matches what transformers saved for hf/%s (%i tensors)", async (model, n) => {
    const want = await fixtureTensors(model);
    const got = expectedTensors(fixtureConfig(model), "config.json");
    expect(got).toHaveLength(n);
    expect(sorted(got)).toEqual(sorted(want));
  });

  it("lists qwen2 in state-dict order with q/k/v biases and no o_proj bias", () => {
    const got = expectedTensors({ ...BASE, model_type: "qwen2" }, "c.json");
    expect(got.slice(0, 14)).toEqual([
      { name: "model.embed_tokens.weight", shape: [100, 16] },
      { name: "model.layers.0.self_attn.q_proj.weight", shape: [16, 16] },
      { name: "model.layers.0.self_attn.q_proj.bias", shape: [16] },
      { name: "model.layers.0.self_attn.k_proj.weight", shape: [8, 16] },
      { name: "model.layers.0.self_attn.k_proj.bias", shape: [8] },
      { name: "model.layers.0.self_attn.v_proj.weight", shape: [8, 16] },
      { name: "model.layers.0.self_attn.v_proj.bias", shape: [8] },
      { name: "model.layers.0.self_attn.o_proj.weight", shape: [16, 16] },
      { name: "model.layers.0.mlp.gate_proj.weight", shape: [24, 16] },
      { name: "model.layers.0.mlp.up_proj.weight", shape: [24, 16] },
      { name: "model.layers.0.mlp.down_proj.weight", shape: [16, 24] },
      { name: "model.layers.0.input_layernorm.weight", shape: [16] },
      { name: "model.layers.0.post_attention_layernorm.weight", shape: [16] },
      { name: "model.layers.1.self_attn.q_proj.weight", shape: [16, 16] },
    ]);
    expect(got.slice(-2)).toEqual([
      { name: "model.norm.weight", shape: [16] },
      { name: "lm_head.weight", shape: [100, 16] },
    ]);
    expect(got).toHaveLength(1 + 2 * 12 + 2);
    const tied = expectedTensors({ ...BASE, model_type: "qwen2", tie_word_embeddings: true }, "c");
    expect(tied.map((t) => t.name)).not.toContain("lm_head.weight");
  });

  it("gives llama and mistral biases only when the config asks", () => {
    for (const model_type of ["llama", "mistral"]) {
      const plain = byName({ ...BASE, model_type });
      expect([...plain.keys()].filter((n) => n.endsWith(".bias"))).toEqual([]);
      const biased = byName({ ...BASE, model_type, attention_bias: true, mlp_bias: true });
      for (const [name, shape] of [
        ["q_proj", [16]],
        ["k_proj", [8]],
        ["v_proj", [8]],
        ["o_proj", [16]],
      ] as const) {
        expect(biased.get(`model.layers.1.self_attn.${name}.bias`)).toEqual(shape);
      }
      expect(biased.get("model.layers.0.mlp.gate_proj.bias")).toEqual([24]);
      expect(biased.get("model.layers.0.mlp.down_proj.bias")).toEqual([16]);
    }
  });

  it("uses head_dim when given, for projections that differ from the hidden size", () => {
    const got = byName({ ...BASE, model_type: "llama", head_dim: 8 });
    expect(got.get("model.layers.0.self_attn.q_proj.weight")).toEqual([32, 16]);
    expect(got.get("model.layers.0.self_attn.k_proj.weight")).toEqual([16, 16]);
    expect(got.get("model.layers.0.self_attn.o_proj.weight")).toEqual([16, 32]);
  });

  it("adds qwen3's q/k norms, has no biases by default, and defaults head_dim to 128", () => {
    const got = byName({ ...BASE, model_type: "qwen3", head_dim: 8 });
    expect(got.get("model.layers.1.self_attn.q_norm.weight")).toEqual([8]);
    expect(got.get("model.layers.1.self_attn.k_norm.weight")).toEqual([8]);
    expect([...got.keys()].filter((n) => n.endsWith(".bias"))).toEqual([]);
    expect(got.size).toBe(1 + 2 * 11 + 2);
    const biased = byName({ ...BASE, model_type: "qwen3", attention_bias: true });
    expect(biased.get("model.layers.0.self_attn.q_proj.bias")).toEqual([512]);
    expect(biased.get("model.layers.0.self_attn.o_proj.bias")).toEqual([16]);
    expect(biased.get("model.layers.0.self_attn.q_norm.weight")).toEqual([128]);
  });

  it("names the config file and the field in its errors", () => {
    expect(thrown({ ...BASE, model_type: "gpt2" }).message).toBe(
      'm/config.json: "model_type" "gpt2" is not supported (supported: llama, mistral, qwen2, qwen3)',
    );
    expect(thrown({ ...BASE }).message).toContain('"model_type" undefined is not supported');
    expect(thrown({ ...BASE, model_type: "qwen2", hidden_size: undefined }).message).toBe(
      'm/config.json: field "hidden_size" must be a positive integer (got undefined)',
    );
    expect(thrown({ ...BASE, model_type: "llama", num_hidden_layers: 2.5 }).message).toContain(
      '"num_hidden_layers" must be a positive integer (got 2.5)',
    );
    expect(thrown({ ...BASE, model_type: "llama", attention_bias: "yes" }).message).toBe(
      'm/config.json: "attention_bias" must be true or false (got "yes")',
    );
    expect(thrown({ ...BASE, model_type: "qwen2", tie_word_embeddings: 1 }).message).toBe(
      'm/config.json: "tie_word_embeddings" must be true or false (got 1)',
    );
  });
});

describe("verifyTensors", () => {
  const expected = [
    { name: "a", shape: [2, 3] },
    { name: "b", shape: [4] },
    { name: "c", shape: [5] },
  ];

  it("reports ok, missing, shape mismatches and unexpected tensors", () => {
    const { rows, problems } = verifyTensors(expected, [
      { name: "z", dtype: "F32", shape: [1] },
      { name: "b", dtype: "BF16", shape: [4, 1] },
      { name: "a", dtype: "BF16", shape: [2, 3] },
    ]);
    expect(rows).toEqual([
      ["tensor", "shape", "dtype", "status"],
      ["a", "[2, 3]", "BF16", "ok"],
      ["b", "[4, 1]", "BF16", "shape [4, 1] ≠ expected [4]"],
      ["c", "[5]", "", "missing"],
      ["z", "[1]", "F32", "unexpected"],
    ]);
    expect(problems).toBe(3);
    expect(table(rows, new Set())[1]).toBe("a       [2, 3]  BF16   ok");
  });

  it("finds no problems in a fixture model checked against its config", async () => {
    const { rows, problems } = verifyTensors(
      expectedTensors(fixtureConfig("tied"), "config.json"),
      await fixtureTensors("tied"),
    );
    expect(problems).toBe(0);
    expect(rows).toHaveLength(51);
  });
});
