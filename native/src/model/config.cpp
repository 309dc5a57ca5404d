#include "model/config.h"

#include <cmath>

#include "util/error.h"
#include "util/json.h"

namespace sr1 {
namespace {

struct Fields {
  const json::Value& root;
  std::string path;

  const json::Value* get(const char* key) const {
    const json::Value* v = root.find(key);
    return v != nullptr && !v->is_null() ? v : nullptr;
  }
  Error bad(const char* key, const std::string& what) const {
    return Error(path + ": field '" + key + "' " + what);
  }
  int positive_int(const char* key) const {
    const json::Value* v = get(key);
    if (v == nullptr) throw bad(key, "is missing");
    if (!v->is_number() || v->as_number() != std::floor(v->as_number()) || v->as_number() < 1 ||
        v->as_number() > 1e9) {
      throw bad(key, "must be a positive integer, got " + v->dump());
    }
    return static_cast<int>(v->as_number());
  }
  int positive_int_or(const char* key, int fallback) const {
    return get(key) == nullptr ? fallback : positive_int(key);
  }
  float positive_number_or(const char* key, float fallback) const {
    const json::Value* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !(v->as_number() > 0)) {
      throw bad(key, "must be a positive number, got " + v->dump());
    }
    return static_cast<float>(v->as_number());
  }
  bool bool_or(const char* key, bool fallback) const {
    const json::Value* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_bool()) throw bad(key, "must be true or false, got " + v->dump());
    return v->as_bool();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    const json::Value* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) throw bad(key, "must be a string, got " + v->dump());
    return v->as_string();
  }
};

}  // namespace

ModelConfig load_model_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const json::Value root = json::parse_file(path);
  if (!root.is_object()) throw Error(path + ": expected a JSON object");
  const Fields f{root, path};

  ModelConfig c;
  c.model_type = f.string_or("model_type", "");
  if (c.model_type != "qwen2" && c.model_type != "llama") {
    throw f.bad("model_type", c.model_type.empty()
                                  ? "is missing (expected \"qwen2\" or \"llama\")"
                                  : "'" + c.model_type + "' is not supported (qwen2, llama)");
  }
  c.vocab_size = f.positive_int("vocab_size");
  c.hidden_size = f.positive_int("hidden_size");
  c.intermediate_size = f.positive_int("intermediate_size");
  c.num_layers = f.positive_int("num_hidden_layers");
  c.num_heads = f.positive_int("num_attention_heads");
  c.num_kv_heads = f.positive_int_or("num_key_value_heads", c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0) {
    throw f.bad("num_key_value_heads", "(" + std::to_string(c.num_kv_heads) +
                                           ") must divide num_attention_heads (" +
                                           std::to_string(c.num_heads) + ")");
  }
  if (f.get("head_dim") == nullptr && c.hidden_size % c.num_heads != 0) {
    throw f.bad("num_attention_heads", "must divide hidden_size when head_dim is not given");
  }
  c.head_dim = f.positive_int_or("head_dim", c.hidden_size / c.num_heads);
  if (c.head_dim % 2 != 0) throw f.bad("head_dim", "must be even for rotary embeddings");
  c.rms_norm_eps = f.positive_number_or("rms_norm_eps", 1e-6f);
  c.rope_theta = f.positive_number_or("rope_theta", 10000.0f);
  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
  c.attention_bias = c.model_type == "qwen2" ? true : f.bool_or("attention_bias", false);
  c.torch_dtype = f.string_or("torch_dtype", f.string_or("dtype", "float32"));
  if (c.torch_dtype != "float32" && c.torch_dtype != "bfloat16" && c.torch_dtype != "float16") {
    throw f.bad("torch_dtype", "'" + c.torch_dtype + "' is not supported (float32, bfloat16, float16)");
  }

  const std::string act = f.string_or("hidden_act", "silu");
  if (act != "silu") throw f.bad("hidden_act", "'" + act + "' is not supported (silu)");
  if (f.get("rope_scaling") != nullptr) {
    const json::Value* type = f.get("rope_scaling")->find("rope_type");
    if (type == nullptr || !type->is_string() || type->as_string() != "default") {
      throw f.bad("rope_scaling", "is not supported (only the default rotary embedding is)");
    }
  }
  if (f.bool_or("use_sliding_window", false)) {
    throw f.bad("use_sliding_window", "is not supported (full causal attention only)");
  }
  return c;
}

}  // namespace sr1
