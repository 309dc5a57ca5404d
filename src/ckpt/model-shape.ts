/**
 * The shape of a small Qwen2 (or, without attention biases, Llama) model and the config.json
 * and parameter list it implies, for code that writes freshly initialised models: the
 * native tests' random models (test/native/random-model.ts) and the tiny world's model
 * (src/world/model.ts).
 */

export interface ModelShape {
  vocab: number;
  hidden: number;
  intermediate: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  tied: boolean;
  /** q/k/v biases: Qwen2 always has them; without them the folder is a Llama model. */
  attentionBias: boolean;
}

/** What a parameter is, which decides how it is initialised. */
export type ParamKind = "matrix" | "bias" | "norm";

/** (name, shape, kind) of every parameter in Hugging Face checkpoint order (param_specs). */
export function paramSpecs(s: ModelShape): [string, number[], ParamKind][] {
  const q = s.heads * s.headDim;
  const kv = s.kvHeads * s.headDim;
  const specs: [string, number[], ParamKind][] = [
    ["model.embed_tokens.weight", [s.vocab, s.hidden], "matrix"],
  ];
  for (let i = 0; i < s.layers; i++) {
    const p = `model.layers.${i}.`;
    specs.push([`${p}input_layernorm.weight`, [s.hidden], "norm"]);
    for (const [proj, rows] of [
      ["q", q],
      ["k", kv],
      ["v", kv],
    ] as const) {
      specs.push([`${p}self_attn.${proj}_proj.weight`, [rows, s.hidden], "matrix"]);
      if (s.attentionBias) specs.push([`${p}self_attn.${proj}_proj.bias`, [rows], "bias"]);
    }
    specs.push(
      [`${p}self_attn.o_proj.weight`, [s.hidden, q], "matrix"],
      [`${p}post_attention_layernorm.weight`, [s.hidden], "norm"],
      [`${p}mlp.gate_proj.weight`, [s.intermediate, s.hidden], "matrix"],
      [`${p}mlp.up_proj.weight`, [s.intermediate, s.hidden], "matrix"],
      [`${p}mlp.down_proj.weight`, [s.hidden, s.intermediate], "matrix"],
    );
  }
  specs.push(["model.norm.weight", [s.hidden], "norm"]);
  if (!s.tied) specs.push(["lm_head.weight", [s.vocab, s.hidden], "matrix"]);
  return specs;
}

/**
 * config.json of the model. `overrides` replace or add keys (token ids, context length);
 * without them the token ids and context are the native test fixtures' (bos 1, eos 2, 4096).
 */
export function modelConfig(
  s: ModelShape,
  overrides: Record<string, unknown> = {},
): Record<string, unknown> {
  if (s.hidden !== s.heads * s.headDim) {
    throw new Error(`hidden ${s.hidden} != heads ${s.heads} × head_dim ${s.headDim}`);
  }
  return {
    architectures: [s.attentionBias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"],
    // Qwen2 always has q/k/v biases; a Llama config says whether it has them.
    ...(s.attentionBias ? {} : { attention_bias: false }),
    attention_dropout: 0.0,
    bos_token_id: 1,
    eos_token_id: 2,
    head_dim: s.headDim,
    hidden_act: "silu",
    hidden_size: s.hidden,
    intermediate_size: s.intermediate,
    max_position_embeddings: 4096,
    model_type: s.attentionBias ? "qwen2" : "llama",
    num_attention_heads: s.heads,
    num_hidden_layers: s.layers,
    num_key_value_heads: s.kvHeads,
    rms_norm_eps: 1e-6,
    rope_theta: 10000.0,
    tie_word_embeddings: s.tied,
    torch_dtype: "float32",
    use_sliding_window: false,
    vocab_size: s.vocab,
    ...overrides,
  };
}
