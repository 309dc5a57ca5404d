// The engine's side of its stdio protocol (PROTOCOL.md beside this file): it takes command
// lines, runs engine steps and hands every event line to `emit`. A weight update pauses the
// queue and waits until no started sequence is left; then the weights are reloaded, the
// prefix cache is dropped and weight_version goes up. An adapter's unload waits in the same
// way for the sequences that use it. The caller owns the input (stdin in
// searchr1-engine) and decides when to wait for it.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "model/qwen2.h"
#include "util/json.h"

namespace sr1 {

class EngineServer {
 public:
  using Emit = std::function<void(const std::string& line)>;
  EngineServer(Qwen2Model& model, Engine& engine, Emit emit)
      : model_(model), engine_(engine), emit_(std::move(emit)) {}

  // One command line; returns false on shutdown.
  bool handle(const std::string& line);
  // Finishes a pending weight update when it can, then runs one engine step and emits its
  // tokens and finished sequences. Returns false when the step could make no progress
  // (nothing runnable): the caller may then block on its input.
  bool step();
  // Ends every live sequence (reason abort), as at the end of the input.
  void abort_all();
  std::string version() const { return std::to_string(weight_version_); }

 private:
  void maybe_finish_update();
  void reply(const json::Value& cmd, bool ok, const std::string& message);
  // A successful reply to `cmd` carrying `fields` (stats, profile).
  void reply_with(const json::Value& cmd, json::Value fields);
  void start_update(const json::Value& cmd);
  void load_lora(const json::Value& cmd);
  void start_unload(const json::Value& cmd);
  // Finishes the unloads whose adapters no sequence uses any more.
  void finish_unloads();
  // A reply to a LoRA command, with the adapters loaded after it.
  void lora_reply(const json::Value& id, bool ok, const std::string& message);

  Qwen2Model& model_;
  Engine& engine_;
  Emit emit_;
  struct PendingUpdate {
    bool active = false;
    json::Value id;
    std::string path;
  } update_;
  struct PendingUnload {
    json::Value id;
    std::string name;
  };
  std::vector<PendingUnload> unloads_;
  int weight_version_ = 0;
};

}  // namespace sr1
