// The JSON lines of the engine's stdio protocol (PROTOCOL.md beside this file): commands
// parsed from stdin, events written to stdout.
#pragma once
#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "util/json.h"

namespace sr1 {

// A `generate` command as a request. Throws sr1::Error naming the field when a key is
// missing or has the wrong type. A null seed draws one from the system.
GenerateRequest parse_generate(const json::Value& cmd);
// A `token_bytes` command's `tokens`: each token id's bytes (hex in the command).
std::vector<std::string> parse_token_bytes(const json::Value& cmd);

std::string tokens_event(const std::vector<TokenOut>& tokens);
std::string done_event(const Finished& f, const std::string& weight_version);
// rid null (an unparseable line) when empty
std::string error_event(const std::string& rid, const std::string& message);
json::Value stats_object(const EngineStats& s);

}  // namespace sr1
