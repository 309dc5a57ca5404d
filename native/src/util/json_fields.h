// Typed reads of a JSON command's fields (the engine's and the trainer's stdio protocols):
// each throws sr1::Error naming the field and what it must be.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "util/json.h"

namespace sr1 {

class JsonFields {
 public:
  explicit JsonFields(const json::Value& object) : o_(object) {}

  bool has(const char* key) const {
    const json::Value* v = o_.find(key);
    return v != nullptr && !v->is_null();
  }
  const json::Value& required(const char* key) const;
  double number(const char* key) const;
  double number(const char* key, double fallback) const;
  int64_t integer(const char* key) const;
  int64_t integer(const char* key, int64_t fallback) const;
  std::string text(const char* key) const;
  std::string text(const char* key, const std::string& fallback) const;
  bool boolean(const char* key) const;
  bool boolean(const char* key, bool fallback) const;
  std::vector<int32_t> int_list(const char* key) const;
  std::vector<std::string> text_list(const char* key) const;
  // Throws naming the first key of the object that is not in `known` (a misspelt field
  // must not fall back to its default silently).
  void only(const std::vector<std::string>& known) const;
  // A nested object's fields (an empty object when the key is absent or null).
  JsonFields object(const char* key) const;

 private:
  const json::Value& o_;
};

}  // namespace sr1
