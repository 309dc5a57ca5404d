#include "model/config.h"

#include <cmath>

#include "util/error.h"
#include "util/json.h"

namespace sr1 {
namespace {

struct Fields {
  const json::Value& root;
  std::string path;
  std::string prefix;  // "rope_parameters." when `root` is that nested object

  const json::Value* get(const char* key) const {
    const json::Value* v = root.find(key);
    return v != nullptr && !v->is_null() ? v : nullptr;
  }
  Error bad(const char* key, const std::string& what) const {
    return Error(path + ": field '" + prefix + key + "' " + what);
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

// The rotary embedding's base and kind, from either format:
//   transformers 4.x: top-level "rope_theta", optional "rope_scaling" {"rope_type"/"type", ...};
//   transformers 5:   "rope_parameters" {"rope_theta", "rope_type"}, for Qwen2 possibly per
//                     layer type ({"full_attention": {...}, ...}).
// As transformers 5 reads them: a non-empty rope_scaling stands for rope_parameters; the theta
// inside the object wins over the top-level one, which wins over 10000. Every rope_type other
// than "default" (linear, dynamic, yarn, longrope, llama3, ...) changes the frequencies or
// scales attention, which this implementation does not do: it is refused, never ignored.
void read_rope(const Fields& f, ModelConfig& c) {
  c.rope_theta = f.positive_number_or("rope_theta", 10000.0f);
  const json::Value* scaling = f.get("rope_scaling");
  const bool use_scaling =
      scaling != nullptr && !(scaling->is_object() && scaling->as_object().empty());
  const char* key = use_scaling ? "rope_scaling" : "rope_parameters";
  const json::Value* rope = f.get(key);
  if (rope == nullptr) return;
  if (!rope->is_object()) throw f.bad(key, "must be an object, got " + rope->dump());
  std::string prefix = std::string(key) + ".";
  const json::Value* full = rope->find("full_attention");
  if (c.model_type == "qwen2" && full != nullptr && full->is_object()) {
    rope = full;  // per layer type; layer_types is checked to be all full_attention
    prefix += "full_attention.";
  }
  const Fields r{*rope, f.path, prefix};
  const char* type_key = r.get("rope_type") != nullptr || r.get("type") == nullptr ? "rope_type"
                                                                                    : "type";
  const std::string type = r.string_or(type_key, "default");
  if (type != "default") {
    throw r.bad(type_key, "'" + type +
                              "' is not supported (only the default rotary embedding is)");
  }
  c.rope_theta = r.positive_number_or("rope_theta", c.rope_theta);
}

}  // namespace

ModelConfig load_model_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const json::Value root = json::parse_file(path);
  if (!root.is_object()) throw Error(path + ": expected a JSON object");
  const Fields f{root, path, ""};

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
  read_rope(f, c);
  c.tie_word_embeddings = f.bool_or("tie_word_embeddings", false);
  c.attention_bias = c.model_type == "qwen2" ? true : f.bool_or("attention_bias", false);
  // transformers 5 writes `dtype` and, when a config has both, keeps `dtype`; 4.x wrote
  // `torch_dtype`.
  const char* dtype_key = f.get("dtype") != nullptr ? "dtype" : "torch_dtype";
  c.torch_dtype = f.string_or(dtype_key, "float32");
  if (c.torch_dtype != "float32" && c.torch_dtype != "bfloat16" && c.torch_dtype != "float16") {
    throw f.bad(dtype_key, "'" + c.torch_dtype + "' is not supported (float32, bfloat16, float16)");
  }

  const std::string act = f.string_or("hidden_act", "silu");
  if (act != "silu") throw f.bad("hidden_act", "'" + act + "' is not supported (silu)");
  if (f.bool_or("use_sliding_window", false)) {
    throw f.bad("use_sliding_window", "is not supported (full causal attention only)");
  }
  // transformers 5 (Qwen2) decides per layer: "sliding_attention" layers use a window.
  if (const json::Value* types = f.get("layer_types")) {
    if (!types->is_array()) throw f.bad("layer_types", "must be a list, got " + types->dump());
    for (size_t i = 0; i < types->as_array().size(); ++i) {
      const json::Value& t = types->as_array()[i];
      if (!t.is_string() || t.as_string() != "full_attention") {
        throw f.bad("layer_types", "[" + std::to_string(i) + "] " + t.dump() +
                                       " is not supported (full_attention only)");
      }
    }
  }
  return c;
}

int read_max_positions(const std::string& dir) {
  const json::Value root = json::parse_file(dir + "/config.json");
  const json::Value* v = root.find("max_position_embeddings");
  if (v == nullptr || !v->is_integer() || v->as_int() < 2) {
    throw UsageError(dir + "/config.json has no max_position_embeddings: pass --context-length");
  }
  return static_cast<int>(v->as_int());
}

}  // namespace sr1
