// The model's shape and hyper-parameters, read from a Hugging Face config.json.
#pragma once
#include <cstdint>
#include <string>

namespace sr1 {

struct ModelConfig {
  std::string model_type;  // "qwen2" or "llama": the same network, llama without qkv biases
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  bool tie_word_embeddings = false;
  bool attention_bias = true;
  std::string torch_dtype = "float32";  // config's dtype (or torch_dtype): the default save dtype

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

// Reads `<dir>/config.json` as written by transformers 4.x (top-level rope_theta, torch_dtype)
// or 5.x (rope_parameters, dtype). Throws sr1::Error naming the file and field for a missing or
// malformed field, and for features this implementation does not have (a rope_type other than
// "default" in rope_parameters or rope_scaling, sliding-window attention, activations other
// than SiLU).
ModelConfig load_model_config(const std::string& dir);

// `<dir>/config.json`'s max_position_embeddings: the engine's context length by default.
// Throws UsageError, telling to pass --context-length, when it has none.
int read_max_positions(const std::string& dir);

}  // namespace sr1
