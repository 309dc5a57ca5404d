// A random LoRA adapter in PEFT's format (adapter_config.json, adapter_model.safetensors with
// PEFT's tensor names: peft/utils/save_and_load.py) for a Qwen2/Llama model folder's shapes,
// for tests that need an adapter of a fixture model that has none.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Rng } from "../../src/runtime/rng.js";
import { writeSafetensors } from "../../src/tensors/safetensors.js";

/**
 * Writes into `to` an adapter of rank `rank` on every linear layer of the model in `model`:
 * A [r, in], B [out, r], both drawn from N(0, std²) (B too, unlike PEFT's zeros, so that the
 * adapter changes the outputs), lora_alpha 2r.
 */
export async function writeRandomAdapter(
  model: string,
  to: string,
  options: { rank: number; seed: number; std: number },
): Promise<void> {
  const config = JSON.parse(readFileSync(join(model, "config.json"), "utf8"));
  const hidden: number = config.hidden_size;
  const headDim: number = config.head_dim ?? hidden / config.num_attention_heads;
  const [q, kv] = [config.num_attention_heads * headDim, config.num_key_value_heads * headDim];
  const shapes: Record<string, [string, number, number]> = {
    q_proj: ["self_attn", hidden, q],
    k_proj: ["self_attn", hidden, kv],
    v_proj: ["self_attn", hidden, kv],
    o_proj: ["self_attn", q, hidden],
    gate_proj: ["mlp", hidden, config.intermediate_size],
    up_proj: ["mlp", hidden, config.intermediate_size],
    down_proj: ["mlp", config.intermediate_size, hidden],
  };
  const { rank } = options;
  const rng = new Rng(options.seed);
  const random = (n: number) => Float32Array.from({ length: n }, () => rng.normal() * options.std);
  const tensors = [];
  for (let layer = 0; layer < config.num_hidden_layers; layer++) {
    for (const [module, [block, inDim, outDim]] of Object.entries(shapes)) {
      const name = `base_model.model.model.layers.${layer}.${block}.${module}`;
      for (const [ab, shape] of [
        ["lora_A", [rank, inDim]],
        ["lora_B", [outDim, rank]],
      ] as const) {
        tensors.push({
          name: `${name}.${ab}.weight`,
          dtype: "F32" as const,
          shape: [...shape],
          data: random(shape[0] * shape[1]),
        });
      }
    }
  }
  mkdirSync(to, { recursive: true });
  await writeSafetensors(join(to, "adapter_model.safetensors"), tensors);
  writeFileSync(
    join(to, "adapter_config.json"),
    JSON.stringify({
      base_model_name_or_path: model,
      peft_type: "LORA",
      task_type: "CAUSAL_LM",
      r: rank,
      lora_alpha: 2 * rank,
      target_modules: Object.keys(shapes),
      bias: "none",
      use_rslora: false,
    }),
  );
}
