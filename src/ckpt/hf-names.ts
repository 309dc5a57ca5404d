/** Hugging Face parameter names: the order `save_pretrained` writes them in. */

/** Per decoder layer, in module registration order (attention, MLP, then the two norms). */
const LAYER_ORDER = [
  "self_attn.q_proj.weight",
  "self_attn.q_proj.bias",
  "self_attn.k_proj.weight",
  "self_attn.k_proj.bias",
  "self_attn.v_proj.weight",
  "self_attn.v_proj.bias",
  "self_attn.o_proj.weight",
  "self_attn.o_proj.bias",
  "self_attn.q_norm.weight",
  "self_attn.k_norm.weight",
  "mlp.gate_proj.weight",
  "mlp.gate_proj.bias",
  "mlp.up_proj.weight",
  "mlp.up_proj.bias",
  "mlp.down_proj.weight",
  "mlp.down_proj.bias",
  "input_layernorm.weight",
  "post_attention_layernorm.weight",
];

const LAYER = /^model\.layers\.(\d+)\.(.+)$/;

function sortKey(name: string): [number, number, number, string] {
  if (name === "model.embed_tokens.weight") return [0, 0, 0, name];
  const m = LAYER.exec(name);
  if (m) {
    const i = LAYER_ORDER.indexOf(m[2] as string);
    return [1, Number(m[1]), i < 0 ? LAYER_ORDER.length : i, name];
  }
  if (name === "model.norm.weight") return [2, 0, 0, name];
  if (name === "lm_head.weight") return [3, 0, 0, name];
  return [4, 0, 0, name];
}

/** Comparator: embeddings, layers in order, final norm, lm_head, then anything else by name. */
export function hfOrder(a: string, b: string): number {
  const x = sortKey(a);
  const y = sortKey(b);
  for (let i = 0; i < 3; i++) {
    const d = (x[i] as number) - (y[i] as number);
    if (d !== 0) return d;
  }
  return x[3] < y[3] ? -1 : x[3] > y[3] ? 1 : 0;
}
