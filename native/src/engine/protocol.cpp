#include "engine/protocol.h"

#include <algorithm>
#include <random>

#include "util/error.h"
#include "util/json_fields.h"

namespace sr1 {

GenerateRequest parse_generate(const json::Value& cmd) {
  const JsonFields f(cmd);
  GenerateRequest r;
  r.rid = f.text("rid");
  r.input_ids = f.int_list("input_ids");
  const int64_t max_new = f.integer("max_new_tokens");
  if (max_new < 0 || max_new > INT32_MAX) throw Error("'max_new_tokens' must be >= 0");
  r.max_new_tokens = static_cast<int>(max_new);
  r.sampling.temperature = static_cast<float>(f.number("temperature"));
  r.sampling.top_p = static_cast<float>(f.number("top_p"));
  const int64_t top_k = f.integer("top_k");
  r.sampling.top_k = top_k > INT32_MAX ? INT32_MAX : static_cast<int>(top_k);
  r.sampling.min_p = static_cast<float>(f.number("min_p"));
  f.required("seed");
  if (f.has("seed")) {
    r.seed = static_cast<uint64_t>(f.integer("seed"));
  } else {  // null: a seed from the system
    r.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  r.stop_token_ids = f.int_list("stop_token_ids");
  r.ignore_eos = f.boolean("ignore_eos");
  const int64_t top = f.integer("top_logprobs", 0);
  r.top_logprobs = static_cast<int>(std::clamp<int64_t>(top, -1, INT32_MAX));  // submit checks
  r.lora = f.text("lora", "");  // absent or null: the base model
  Penalties& p = r.penalties;  // optional, at their neutral values when absent
  p.repetition = static_cast<float>(f.number("repetition_penalty", 1.0));
  p.frequency = static_cast<float>(f.number("frequency_penalty", 0.0));
  p.presence = static_cast<float>(f.number("presence_penalty", 0.0));
  p.min_new_tokens = static_cast<int>(
      std::clamp<int64_t>(f.integer("min_new_tokens", 0), -1, INT32_MAX));  // submit checks
  if (f.has("logit_bias")) {
    const json::Value& list = f.required("logit_bias");
    const auto bad = [] { return Error("'logit_bias' must be a list of [token_id, bias] pairs"); };
    if (!list.is_array()) throw bad();
    for (const json::Value& pair : list.as_array()) {
      if (!pair.is_array() || pair.as_array().size() != 2 || !pair.as_array()[0].is_integer() ||
          !pair.as_array()[1].is_number()) {
        throw bad();
      }
      const int64_t id = pair.as_array()[0].as_int();
      p.logit_bias.emplace_back(static_cast<int32_t>(std::clamp<int64_t>(id, -1, INT32_MAX)),
                                static_cast<float>(pair.as_array()[1].as_number()));
    }
  }
  if (f.has("grammar")) {
    r.grammar = std::make_shared<const Grammar>(parse_grammar(f.required("grammar")));
  }
  return r;
}

std::vector<std::string> parse_token_bytes(const json::Value& cmd) {
  const json::Value* tokens = cmd.find("tokens");
  if (tokens == nullptr || !tokens->is_array()) {
    throw Error("'tokens' must be a list of hex strings, one per token id");
  }
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::vector<std::string> out;
  for (const json::Value& t : tokens->as_array()) {
    const std::string& hex = t.is_string() ? t.as_string() : std::string("?");
    std::string bytes;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
      if (hi < 0 || lo < 0) break;
      bytes.push_back(static_cast<char>(hi * 16 + lo));
    }
    if (bytes.size() * 2 != hex.size()) {
      throw Error("'tokens'[" + std::to_string(out.size()) +
                  "] must be a string of lower-case hex digit pairs");
    }
    out.push_back(std::move(bytes));
  }
  return out;
}

std::string tokens_event(const std::vector<TokenOut>& tokens) {
  json::Value out = json::Value::array();
  const auto id = [](int32_t token) { return json::Value(static_cast<int64_t>(token)); };
  const auto lp = [](float logprob) { return json::Value(static_cast<double>(logprob)); };
  for (const TokenOut& t : tokens) {
    json::Value item = json::Value::array({json::Value(t.rid), id(t.token), lp(t.logprob)});
    if (!t.top.empty()) {  // [[id, logprob], ...], only for a request that asked for them
      json::Value top = json::Value::array();
      for (const TokenDraw& d : t.top) top.push(json::Value::array({id(d.token), lp(d.logprob)}));
      item.push(top);
    }
    out.push(item);
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
                              {"decode_steps", u(s.decode_steps)},
                              {"kv_full_steps", u(s.kv_full_steps)},
                              {"preemptions", u(s.preemptions)},
                              {"kv_released", s.kv_released}});
}

}  // namespace sr1
