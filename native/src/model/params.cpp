#include "model/params.h"

namespace sr1 {

size_t ParamLayout::add(const std::string& name, std::vector<int64_t> shape, bool aligned) {
  if (aligned) total_ = (total_ + kAlign - 1) / kAlign * kAlign;
  size_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<size_t>(d);
  tensors_.push_back(ParamTensor{name, std::move(shape), total_, numel});
  const size_t offset = total_;
  total_ += numel;
  return offset;
}

ParamLayout::ParamLayout(const ModelConfig& c, Head head) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), KV = c.kv_dim();
  embed_ = add("model.embed_tokens.weight", {c.vocab_size, H});
  for (int l = 0; l < c.num_layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerParams lp{};
    lp.ln1 = add(p + "input_layernorm.weight", {H});
    lp.qkv_w = add(p + "self_attn.q_proj.weight", {Q, H});
    add(p + "self_attn.k_proj.weight", {KV, H}, false);
    add(p + "self_attn.v_proj.weight", {KV, H}, false);
    if (c.attention_bias) {
      lp.qkv_b = add(p + "self_attn.q_proj.bias", {Q});
      add(p + "self_attn.k_proj.bias", {KV}, false);
      add(p + "self_attn.v_proj.bias", {KV}, false);
    }
    lp.o_w = add(p + "self_attn.o_proj.weight", {H, Q});
    lp.ln2 = add(p + "post_attention_layernorm.weight", {H});
    lp.gu_w = add(p + "mlp.gate_proj.weight", {I, H});
    add(p + "mlp.up_proj.weight", {I, H}, false);
    lp.down_w = add(p + "mlp.down_proj.weight", {H, I});
    layers_.push_back(lp);
  }
  norm_ = add("model.norm.weight", {H});
  if (head == Head::Value) {
    value_w_ = add("score.weight", {1, H});
    value_b_offset_ = add("score.bias", {1}, false) - value_w_;
    return;
  }
  lm_head_ = c.tie_word_embeddings ? embed_ : add("lm_head.weight", {c.vocab_size, H});
}

}  // namespace sr1
