#include "engine/server.h"

#include "backend/profiled_backend.h"
#include "engine/protocol.h"
#include "util/error.h"
#include "util/json_fields.h"

namespace sr1 {
namespace {

json::Value id_of(const json::Value& cmd) {
  const json::Value* id = cmd.find("id");
  return id == nullptr ? json::Value() : *id;
}

}  // namespace

bool EngineServer::handle(const std::string& line) {
  json::Value cmd;
  std::string op;
  try {
    cmd = json::parse(line);
    const json::Value* o = cmd.find("op");
    if (o == nullptr || !o->is_string()) throw Error("'op' is missing");
    op = o->as_string();
  } catch (const Error& e) {
    emit_(error_event("", std::string("bad command line: ") + e.what()));
    return true;
  }
  if (op == "generate") {
    const json::Value* rid = cmd.find("rid");
    try {
      engine_.submit(parse_generate(cmd));
    } catch (const Error& e) {
      emit_(error_event(rid != nullptr && rid->is_string() ? rid->as_string() : "", e.what()));
    }
  } else if (op == "abort") {
    const json::Value* rid = cmd.find("rid");
    Finished f;
    if (rid != nullptr && rid->is_string() && engine_.abort(rid->as_string(), &f)) {
      emit_(done_event(f, version()));
    }
  } else if (op == "update_weights") {
    start_update(cmd);
  } else if (op == "load_lora") {
    load_lora(cmd);
  } else if (op == "unload_lora") {
    start_unload(cmd);
  } else if (op == "flush_cache") {
    const bool ok = engine_.live() == 0 && engine_.flush_cache();
    reply(cmd, ok, ok ? "prefix cache flushed" : "requests are running or queued; not flushed");
  } else if (op == "release_memory" || op == "resume_memory") {
    std::string why;
    const bool release = op == "release_memory";
    const bool ok = release ? engine_.release_memory(&why) : engine_.resume_memory(&why);
    reply(cmd, ok, ok ? (release ? "KV cache released" : "KV cache resumed") : why);
  } else if (op == "token_bytes") {
    try {
      const std::vector<std::string> tokens = parse_token_bytes(cmd);
      engine_.set_token_bytes(tokens);
      reply(cmd, true, "token bytes of " + std::to_string(tokens.size()) + " tokens set");
    } catch (const Error& e) {
      reply(cmd, false, e.what());
    }
  } else if (op == "stats") {
    json::Value r = stats_object(engine_.stats());
    r.set("weight_version", version());
    reply_with(cmd, r);
  } else if (op == "profile") {
    auto* profiled = dynamic_cast<ProfiledBackend*>(&model_.be());
    if (profiled == nullptr) {
      reply(cmd, false, "this engine was started without --profile");
    } else {
      reply_with(cmd, profiled->take_times());
    }
  } else if (op == "shutdown") {
    abort_all();
    return false;
  } else {
    emit_(error_event("", "unknown op '" + op + "'"));
  }
  return true;
}

bool EngineServer::step() {
  maybe_finish_update();
  finish_unloads();
  const StepResult res = engine_.step();
  if (!res.tokens.empty()) emit_(tokens_event(res.tokens));
  for (const Finished& f : res.finished) emit_(done_event(f, version()));
  for (const auto& [rid, why] : res.failed) emit_(error_event(rid, why));
  finish_unloads();
  return res.ran || !res.finished.empty() || !res.failed.empty();
}

void EngineServer::lora_reply(const json::Value& id, bool ok, const std::string& message) {
  json::Value loaded = json::Value::object();
  for (const auto& [name, path] : engine_.adapters()) loaded.set(name, path);
  emit_(json::Value::object({{"ev", "reply"},
                             {"id", id},
                             {"ok", ok},
                             {"message", message},
                             {"adapters", loaded}})
            .dump());
}

void EngineServer::load_lora(const json::Value& cmd) {
  const JsonFields f(cmd);
  try {
    f.only({"op", "id", "name", "path"});
    const std::string name = f.text("name"), path = f.text("path");
    engine_.load_adapter(name, path);
    lora_reply(id_of(cmd), true, "loaded LoRA adapter '" + name + "' from " + path);
  } catch (const Error& e) {
    lora_reply(id_of(cmd), false, e.what());
  }
}

void EngineServer::start_unload(const json::Value& cmd) {
  const JsonFields f(cmd);
  std::string name, why;
  try {
    f.only({"op", "id", "name"});
    name = f.text("name");
  } catch (const Error& e) {
    return lora_reply(id_of(cmd), false, e.what());
  }
  if (!engine_.begin_unload(name, &why)) return lora_reply(id_of(cmd), false, why);
  unloads_.push_back(PendingUnload{id_of(cmd), name});
  finish_unloads();
}

void EngineServer::finish_unloads() {
  for (size_t i = 0; i < unloads_.size();) {
    const PendingUnload u = unloads_[i];
    if (engine_.adapter_users(u.name) > 0) {
      i++;
      continue;
    }
    unloads_.erase(unloads_.begin() + static_cast<long>(i));
    engine_.forget_adapter(u.name);
    lora_reply(u.id, true, "unloaded LoRA adapter '" + u.name + "'");
  }
}

void EngineServer::abort_all() {
  for (const Finished& f : engine_.abort_all()) emit_(done_event(f, version()));
}

// Loads the pending weights once no started sequence is left.
void EngineServer::maybe_finish_update() {
  if (!update_.active || engine_.has_started_work()) return;
  bool ok = true;
  std::string message;
  try {
    model_.reload_weights(update_.path);
    engine_.reset_prefix_cache();
    weight_version_++;
    message = "loaded " + update_.path;
  } catch (const Error& e) {
    ok = false;
    message = e.what();
  }
  engine_.set_paused(false);
  update_.active = false;
  json::Value r = json::Value::object({{"ev", "reply"},
                                       {"id", update_.id},
                                       {"ok", ok},
                                       {"weight_version", version()},
                                       {"num_paused_requests", engine_.not_started()},
                                       {"message", message}});
  emit_(r.dump());
}

void EngineServer::reply(const json::Value& cmd, bool ok, const std::string& message) {
  emit_(json::Value::object({{"ev", "reply"}, {"id", id_of(cmd)}, {"ok", ok}, {"message", message}})
            .dump());
}

void EngineServer::reply_with(const json::Value& cmd, json::Value fields) {
  fields.set("ev", "reply");
  fields.set("id", id_of(cmd));
  fields.set("ok", true);
  emit_(fields.dump());
}

void EngineServer::start_update(const json::Value& cmd) {
  const json::Value* path = cmd.find("model_path");
  if (update_.active) return reply(cmd, false, "a weight update is already in progress");
  if (path == nullptr || !path->is_string() || path->as_string().empty()) {
    return reply(cmd, false, "'model_path' must be a non-empty string");
  }
  const json::Value* abort_all = cmd.find("abort_all");
  if (abort_all != nullptr && abort_all->is_bool() && abort_all->as_bool()) this->abort_all();
  update_ = PendingUpdate{true, id_of(cmd), path->as_string()};
  engine_.set_paused(true);
}

}  // namespace sr1
