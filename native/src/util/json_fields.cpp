#include "util/json_fields.h"

#include <algorithm>

#include "util/error.h"

namespace sr1 {
namespace {

Error bad(const char* key, const char* what) {
  return Error(std::string("'") + key + "' must be " + what);
}

}  // namespace

const json::Value& JsonFields::required(const char* key) const {
  const json::Value* v = o_.find(key);
  if (v == nullptr) throw Error(std::string("'") + key + "' is missing");
  return *v;
}

double JsonFields::number(const char* key) const {
  const json::Value& v = required(key);
  if (!v.is_number()) throw bad(key, "a number");
  return v.as_number();
}

double JsonFields::number(const char* key, double fallback) const {
  return has(key) ? number(key) : fallback;
}

int64_t JsonFields::integer(const char* key) const {
  const json::Value& v = required(key);
  if (!v.is_integer()) throw bad(key, "an integer");
  return v.as_int();
}

int64_t JsonFields::integer(const char* key, int64_t fallback) const {
  return has(key) ? integer(key) : fallback;
}

std::string JsonFields::text(const char* key) const {
  const json::Value& v = required(key);
  if (!v.is_string()) throw bad(key, "a string");
  return v.as_string();
}

std::string JsonFields::text(const char* key, const std::string& fallback) const {
  return has(key) ? text(key) : fallback;
}

bool JsonFields::boolean(const char* key) const {
  const json::Value& v = required(key);
  if (!v.is_bool()) throw bad(key, "true or false");
  return v.as_bool();
}

bool JsonFields::boolean(const char* key, bool fallback) const {
  return has(key) ? boolean(key) : fallback;
}

void JsonFields::only(const std::vector<std::string>& known) const {
  for (const auto& [key, value] : o_.as_object()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      throw Error("unknown field '" + key + "' (known: " + list + ")");
    }
  }
}

JsonFields JsonFields::object(const char* key) const {
  static const json::Value empty = json::Value::object();
  if (!has(key)) return JsonFields(empty);
  const json::Value& v = required(key);
  if (!v.is_object()) throw bad(key, "an object");
  return JsonFields(v);
}

std::vector<std::string> JsonFields::text_list(const char* key) const {
  const json::Value& v = required(key);
  if (!v.is_array()) throw bad(key, "a list of strings");
  std::vector<std::string> out;
  for (const json::Value& x : v.as_array()) {
    if (!x.is_string()) throw bad(key, "a list of strings");
    out.push_back(x.as_string());
  }
  return out;
}

std::vector<int32_t> JsonFields::int_list(const char* key) const {
  const json::Value& v = required(key);
  if (!v.is_array()) throw bad(key, "a list of integers");
  std::vector<int32_t> out;
  out.reserve(v.as_array().size());
  for (const json::Value& x : v.as_array()) {
    if (!x.is_integer() || x.as_int() < INT32_MIN || x.as_int() > INT32_MAX) {
      throw bad(key, "a list of integers");
    }
    out.push_back(static_cast<int32_t>(x.as_int()));
  }
  return out;
}

}  // namespace sr1
