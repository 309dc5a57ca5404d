// The config.json of the models the plan's tests size: Qwen2.5-3B's and 7B's (the values of
// /work/shared/reference/native.md §2.2, whose parameter counts §2.3 checks), and a small
// model whose buffers are worked out by hand in memory-plan.test.ts.
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

export const QWEN_CONFIGS = {
  "Qwen/Qwen2.5-7B": {
    model_type: "qwen2",
    hidden_size: 3584,
    intermediate_size: 18944,
    num_attention_heads: 28,
    num_key_value_heads: 4,
    num_hidden_layers: 28,
    vocab_size: 152064,
    max_position_embeddings: 32768,
    tie_word_embeddings: false,
  },
  "Qwen/Qwen2.5-3B": {
    model_type: "qwen2",
    hidden_size: 2048,
    intermediate_size: 11008,
    num_attention_heads: 16,
    num_key_value_heads: 2,
    num_hidden_layers: 36,
    vocab_size: 151936,
    max_position_embeddings: 32768,
    tie_word_embeddings: true,
  },
};

// H 8, I 16, 2 layers, 2 heads of 4 (Q 8), 1 KV head (KV 4), V 32, untied, q/k/v biases; the
// engine's context 32,768 as Qwen2.5's.
export const SMALL_CONFIG = {
  model_type: "qwen2",
  hidden_size: 8,
  intermediate_size: 16,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  num_hidden_layers: 2,
  vocab_size: 32,
  max_position_embeddings: 32768,
  tie_word_embeddings: false,
};

/** Writes `config` as `<dir>/config.json` (the folder made) and returns `dir`. */
export function writeModelConfig(dir: string, config: object): string {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "config.json"), JSON.stringify(config));
  return dir;
}
