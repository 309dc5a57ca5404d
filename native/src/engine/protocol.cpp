#include "engine/protocol.h"

#include <random>

#include "util/error.h"

namespace sr1 {
namespace {

const json::Value& field(const json::Value& cmd, const char* key) {
  const json::Value* v = cmd.find(key);
  if (v == nullptr) throw Error(std::string("'") + key + "' is missing");
  return *v;
}

double number(const json::Value& cmd, const char* key) {
  const json::Value& v = field(cmd, key);
  if (!v.is_number()) throw Error(std::string("'") + key + "' must be a number");
  return v.as_number();
}

int64_t integer(const json::Value& cmd, const char* key) {
  const json::Value& v = field(cmd, key);
  if (!v.is_integer()) throw Error(std::string("'") + key + "' must be an integer");
  return v.as_int();
}

std::vector<int32_t> int_list(const json::Value& cmd, const char* key) {
  const json::Value& v = field(cmd, key);
  if (!v.is_array()) throw Error(std::string("'") + key + "' must be a list of integers");
  std::vector<int32_t> out;
  out.reserve(v.as_array().size());
  for (const json::Value& x : v.as_array()) {
    if (!x.is_integer() || x.as_int() < INT32_MIN || x.as_int() > INT32_MAX) {
      throw Error(std::string("'") + key + "' must be a list of integers");
    }
    out.push_back(static_cast<int32_t>(x.as_int()));
  }
  return out;
}

}  // namespace

GenerateRequest parse_generate(const json::Value& cmd) {
  GenerateRequest r;
  const json::Value& rid = field(cmd, "rid");
  if (!rid.is_string()) throw Error("'rid' must be a string");
  r.rid = rid.as_string();
  r.input_ids = int_list(cmd, "input_ids");
  const int64_t max_new = integer(cmd, "max_new_tokens");
  if (max_new < 0 || max_new > INT32_MAX) throw Error("'max_new_tokens' must be >= 0");
  r.max_new_tokens = static_cast<int>(max_new);
  r.sampling.temperature = static_cast<float>(number(cmd, "temperature"));
  r.sampling.top_p = static_cast<float>(number(cmd, "top_p"));
  const int64_t top_k = integer(cmd, "top_k");
  r.sampling.top_k = top_k > INT32_MAX ? INT32_MAX : static_cast<int>(top_k);
  r.sampling.min_p = static_cast<float>(number(cmd, "min_p"));
  const json::Value& seed = field(cmd, "seed");
  if (seed.is_null()) {
    r.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  } else if (seed.is_integer()) {
    r.seed = static_cast<uint64_t>(seed.as_int());
  } else {
    throw Error("'seed' must be an integer or null");
  }
  r.stop_token_ids = int_list(cmd, "stop_token_ids");
  const json::Value& ignore = field(cmd, "ignore_eos");
  if (!ignore.is_bool()) throw Error("'ignore_eos' must be true or false");
  r.ignore_eos = ignore.as_bool();
  return r;
}

std::string tokens_event(const std::vector<TokenOut>& tokens) {
  json::Value out = json::Value::array();
  for (const TokenOut& t : tokens) {
    out.push(json::Value::array({json::Value(t.rid), json::Value(static_cast<int64_t>(t.token)),
                                 json::Value(static_cast<double>(t.logprob))}));
  }
  return json::Value::object({{"ev", "tokens"}, {"out", out}}).dump();
}

std::string done_event(const Finished& f, const std::string& weight_version) {
  return json::Value::object(
             {{"ev", "done"},
              {"rid", f.rid},
              {"reason", f.reason},
              {"matched", f.matched >= 0 ? json::Value(static_cast<int64_t>(f.matched))
                                         : json::Value()},
              {"prompt_tokens", f.prompt_tokens},
              {"cached_tokens", f.cached_tokens},
              {"completion_tokens", f.completion_tokens},
              {"weight_version", weight_version}})
      .dump();
}

std::string error_event(const std::string& rid, const std::string& message) {
  return json::Value::object({{"ev", "error"},
                              {"rid", rid.empty() ? json::Value() : json::Value(rid)},
                              {"message", message}})
      .dump();
}

json::Value stats_object(const EngineStats& s) {
  const auto u = [](uint64_t x) { return json::Value(static_cast<int64_t>(x)); };
  return json::Value::object({{"running", s.running},
                              {"queued", s.queued},
                              {"kv_blocks_total", s.kv_blocks_total},
                              {"kv_blocks_used", s.kv_blocks_used},
                              {"kv_blocks_cached", s.kv_blocks_cached},
                              {"prompt_tokens", u(s.prompt_tokens)},
                              {"prefix_hit_tokens", u(s.prefix_hit_tokens)},
                              {"generated_tokens", u(s.generated_tokens)},
                              {"decode_steps", u(s.decode_steps)}});
}

}  // namespace sr1
