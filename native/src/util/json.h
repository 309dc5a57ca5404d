// A small JSON reader/writer for config.json, safetensors headers and index files.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace sr1::json {

class Value {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;  // keeps document order

  Value() = default;  // null
  Value(bool b);
  Value(double n);
  Value(int64_t n);
  Value(int n) : Value(static_cast<int64_t>(n)) {}
  Value(const char* s);
  Value(std::string s);
  static Value array(Array items = {});
  static Value object(Object members = {});

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_number() const { return type_ == Type::Number; }
  // A number parsed without fraction or exponent (or built from an int) that fits int64.
  bool is_integer() const { return type_ == Type::Number && integral_; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }

  // Accessors throw sr1::Error when the type does not match.
  bool as_bool() const;
  double as_number() const;
  // The number as an integer; throws if it has a fraction or does not fit.
  int64_t as_int() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;
  Array& as_array();
  Object& as_object();

  // Object member lookup; nullptr when absent or when this is not an object.
  const Value* find(const std::string& key) const;
  // Sets (or replaces) an object member.
  void set(const std::string& key, Value v);
  void push(Value v);

  // Compact serialisation; integers that fit in int64 print without a fraction.
  std::string dump() const;
  // Two-space indented serialisation, as Hugging Face writes config.json.
  std::string dump_pretty() const;

 private:
  Type type_ = Type::Null;
  bool b_ = false;
  double n_ = 0;
  bool integral_ = false;
  int64_t i_ = 0;
  std::string s_;
  std::shared_ptr<Array> a_;
  std::shared_ptr<Object> o_;
};

// Parses a complete JSON document. Throws sr1::Error("<what> at byte N") on bad input,
// including duplicate object keys and invalid UTF-8. dump() writes NaN/inf as null.
Value parse(const std::string& text);

// Reads and parses a file; errors name the path.
Value parse_file(const std::string& path);

}  // namespace sr1::json
