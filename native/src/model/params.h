// Where each parameter lives in the model's one flat float buffer, and its Hugging Face
// name. q/k/v weights (and biases) are adjacent, as are gate/up, so each group is one
// matrix and one matmul; the HF tensors are slices of it. Each group starts at a multiple
// of kAlign elements (the gaps hold zeros), so matmul operands are 256-byte aligned in
// bf16 as well as fp32, which cuBLASLt's fastest kernels require.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace sr1 {

struct LayerParams {
  size_t ln1, qkv_w, qkv_b, o_w, ln2, gu_w, down_w;  // offsets in floats
};

struct ParamTensor {
  std::string name;  // Hugging Face name, e.g. model.layers.0.self_attn.q_proj.weight
  std::vector<int64_t> shape;
  size_t offset;  // in floats
  size_t numel;
};

// What sits on top of the final norm: the language-model head (a causal LM), or a value
// head with one output (a critic: Hugging Face's token-classification model with one
// label, `score.weight` [1, H] and `score.bias` [1], and no lm_head).
enum class Head { LanguageModel, Value };

class ParamLayout {
 public:
  ParamLayout(const ModelConfig& c, Head head);

  static constexpr size_t kAlign = 128;
  size_t total() const { return total_; }  // elements, gaps included
  size_t embed() const { return embed_; }
  size_t norm() const { return norm_; }
  size_t lm_head() const { return lm_head_; }  // == embed() when tied
  size_t value_w() const { return value_w_; }  // the value head's weight [1, H], then bias
  size_t value_b() const { return value_w_ + value_b_offset_; }
  const LayerParams& layer(int l) const { return layers_[l]; }
  size_t layers() const { return layers_.size(); }
  // Every stored tensor, in checkpoint order (no lm_head when tied).
  const std::vector<ParamTensor>& tensors() const { return tensors_; }

 private:
  // Places a tensor at the end; `aligned` starts it at the next multiple of kAlign.
  size_t add(const std::string& name, std::vector<int64_t> shape, bool aligned = true);
  size_t total_ = 0, embed_ = 0, norm_ = 0, lm_head_ = 0, value_w_ = 0, value_b_offset_ = 0;
  std::vector<LayerParams> layers_;
  std::vector<ParamTensor> tensors_;
};

}  // namespace sr1
