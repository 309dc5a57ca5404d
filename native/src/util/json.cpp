#include "util/json.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "util/error.h"

namespace sr1::json {

namespace {

const char* type_name(Value::Type t) {
  switch (t) {
    case Value::Type::Null: return "null";
    case Value::Type::Bool: return "a boolean";
    case Value::Type::Number: return "a number";
    case Value::Type::String: return "a string";
    case Value::Type::Array: return "an array";
    case Value::Type::Object: return "an object";
  }
  return "?";
}

[[noreturn]] void type_error(const char* wanted, Value::Type got) {
  throw Error(std::string("JSON value is ") + type_name(got) + "; expected " + wanted);
}

// --- parsing ---------------------------------------------------------------------------

constexpr int kMaxDepth = 512;

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected data after the JSON value");
    return v;
  }

 private:
  const std::string& s_;
  size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& what) const { fail_at(what, pos_); }
  [[noreturn]] void fail_at(const std::string& what, size_t at) const {
    throw Error("invalid JSON: " + what + " at byte " + std::to_string(at));
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void skip_ws() {
    while (!at_end()) {
      char c = s_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  void expect_literal(const char* word) {
    size_t n = std::strlen(word);
    if (s_.compare(pos_, n, word) != 0) fail("unexpected character");
    pos_ += n;
  }

  Value value(int depth) {
    if (at_end()) fail("unexpected end of input");
    switch (s_[pos_]) {
      case '{': return object(depth + 1);
      case '[': return array(depth + 1);
      case '"': return Value(string());
      case 't': expect_literal("true"); return Value(true);
      case 'f': expect_literal("false"); return Value(false);
      case 'n': expect_literal("null"); return Value();
      default: return number();
    }
  }

  void check_depth(int depth) const {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
  }

  Value object(int depth) {
    check_depth(depth);
    ++pos_;  // '{'
    Value::Object members;
    std::unordered_set<std::string> seen;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return Value::object(std::move(members));
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      size_t key_at = pos_;
      std::string key = string();
      // Duplicate keys would make find() ambiguous, so they are rejected outright.
      if (!seen.insert(key).second) fail_at("duplicate key \"" + key + "\"", key_at);
      skip_ws();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      skip_ws();
      Value v = value(depth);
      members.emplace_back(std::move(key), std::move(v));
      skip_ws();
      char c = peek();
      ++pos_;
      if (c == '}') return Value::object(std::move(members));
      if (c != ',') fail_at("expected ',' or '}'", pos_ - 1);
    }
  }

  Value array(int depth) {
    check_depth(depth);
    ++pos_;  // '['
    Value::Array items;
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return Value::array(std::move(items));
    }
    for (;;) {
      skip_ws();
      items.push_back(value(depth));
      skip_ws();
      char c = peek();
      ++pos_;
      if (c == ']') return Value::array(std::move(items));
      if (c != ',') fail_at("expected ',' or ']'", pos_ - 1);
    }
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else fail_at("bad hex digit in \\u escape", pos_ - 1);
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // After a backslash-u: one code point, combining a surrogate pair when there is one.
  unsigned unicode_escape() {
    size_t at = pos_ - 2;
    unsigned cp = hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at("unpaired surrogate in \\u escape", at);
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (s_.compare(pos_, 2, "\\u") != 0) fail_at("unpaired surrogate in \\u escape", at);
      pos_ += 2;
      unsigned lo = hex4();
      if (lo < 0xDC00 || lo > 0xDFFF) fail_at("unpaired surrogate in \\u escape", at);
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    return cp;
  }

  // Length of the valid UTF-8 sequence starting at pos_ (lead byte >= 0x80), or 0.
  size_t utf8_length() const {
    auto byte = [&](size_t i) -> unsigned {
      return pos_ + i < s_.size() ? static_cast<unsigned char>(s_[pos_ + i]) : 0;
    };
    auto cont = [&](size_t i) { return (byte(i) & 0xC0) == 0x80; };
    unsigned b0 = byte(0), b1 = byte(1);
    if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 2 : 0;
    if (b0 >= 0xE0 && b0 <= 0xEF) {
      bool ok = cont(1) && cont(2) && !(b0 == 0xE0 && b1 < 0xA0) && !(b0 == 0xED && b1 >= 0xA0);
      return ok ? 3 : 0;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
      bool ok = cont(1) && cont(2) && cont(3) && !(b0 == 0xF0 && b1 < 0x90) &&
                !(b0 == 0xF4 && b1 >= 0x90);
      return ok ? 4 : 0;
    }
    return 0;
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("control character in string");
      if (c == '\\') {
        out += escape();
      } else if (c < 0x80) {
        out += static_cast<char>(c);
        ++pos_;
      } else {
        size_t n = utf8_length();
        if (n == 0) fail("invalid UTF-8 in string");
        out.append(s_, pos_, n);
        pos_ += n;
      }
    }
  }

  std::string escape() {
    ++pos_;  // backslash
    if (at_end()) fail("unterminated string");
    char c = s_[pos_++];
    switch (c) {
      case '"': return "\"";
      case '\\': return "\\";
      case '/': return "/";
      case 'b': return "\b";
      case 'f': return "\f";
      case 'n': return "\n";
      case 'r': return "\r";
      case 't': return "\t";
      case 'u': {
        std::string out;
        append_utf8(out, unicode_escape());
        return out;
      }
      default: fail_at("bad escape in string", pos_ - 2);
    }
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  // Strict RFC 8259 grammar; integers that fit in int64 stay integral.
  Value number() {
    size_t start = pos_;
    bool integral = true;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (is_digit(peek())) {
      while (is_digit(peek())) ++pos_;
    } else {
      fail_at(pos_ == start ? "unexpected character" : "expected a digit", pos_);
    }
    if (peek() == '.') {
      integral = false;
      ++pos_;
      if (!is_digit(peek())) fail("expected a digit after '.'");
      while (is_digit(peek())) ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      integral = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!is_digit(peek())) fail("expected a digit in the exponent");
      while (is_digit(peek())) ++pos_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (integral) {
      int64_t i = 0;
      auto r = std::from_chars(first, last, i);
      if (r.ec == std::errc() && r.ptr == last) return Value(i);
    }
    double d = 0;
    auto r = std::from_chars(first, last, d);
    if (r.ec == std::errc::result_out_of_range) fail_at("number out of range", start);
    return Value(d);
  }
};

// --- writing ---------------------------------------------------------------------------

void write_string(std::string& out, const std::string& s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 0xF];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// Shortest round-trip digits, laid out as Python's repr(float) does (so configs written
// here read like those written by transformers): fixed for 1e-4 <= |x| < 1e16, else
// scientific; a fixed value always keeps a fraction ("2.0") to stay a float.
void write_double(std::string& out, double d) {
  if (!std::isfinite(d)) {
    out += "null";  // JSON has no NaN or infinity; JSON.stringify writes null too
    return;
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  size_t e = sci.find('e');
  int exp = std::stoi(sci.substr(e + 1));
  if (exp < -4 || exp >= 16) {
    out += sci;
    return;
  }
  std::string mant = sci.substr(0, e);
  bool neg = mant[0] == '-';
  std::string digits;
  for (char c : mant)
    if (c >= '0' && c <= '9') digits += c;
  if (neg) out += '-';
  if (exp < 0) {
    out += "0.";
    out.append(static_cast<size_t>(-exp - 1), '0');
    out += digits;
    return;
  }
  size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) {
    out += digits;
    out.append(int_len - digits.size(), '0');
    out += ".0";
  } else {
    out += digits.substr(0, int_len);
    out += '.';
    out += digits.substr(int_len);
  }
}

}  // namespace

// --- Value -----------------------------------------------------------------------------

Value::Value(bool b) : type_(Type::Bool), b_(b) {}
Value::Value(double n) : type_(Type::Number), n_(n) {}
Value::Value(int64_t n) : type_(Type::Number), n_(static_cast<double>(n)), integral_(true), i_(n) {}
Value::Value(const char* s) : type_(Type::String), s_(s) {}
Value::Value(std::string s) : type_(Type::String), s_(std::move(s)) {}

Value Value::array(Array items) {
  Value v;
  v.type_ = Type::Array;
  v.a_ = std::make_shared<Array>(std::move(items));
  return v;
}

Value Value::object(Object members) {
  Value v;
  v.type_ = Type::Object;
  v.o_ = std::make_shared<Object>(std::move(members));
  return v;
}

bool Value::as_bool() const {
  if (type_ != Type::Bool) type_error("a boolean", type_);
  return b_;
}

double Value::as_number() const {
  if (type_ != Type::Number) type_error("a number", type_);
  return n_;
}

int64_t Value::as_int() const {
  if (type_ != Type::Number) type_error("an integer", type_);
  if (integral_) return i_;
  // 2^63 itself is representable as a double but not as int64, hence the strict bound.
  if (std::trunc(n_) != n_ || n_ < -9223372036854775808.0 || n_ >= 9223372036854775808.0) {
    std::string text;
    write_double(text, n_);
    throw Error("JSON number " + text + " is not an integer in the int64 range");
  }
  return static_cast<int64_t>(n_);
}

const std::string& Value::as_string() const {
  if (type_ != Type::String) type_error("a string", type_);
  return s_;
}

const Value::Array& Value::as_array() const {
  if (type_ != Type::Array) type_error("an array", type_);
  return *a_;
}

const Value::Object& Value::as_object() const {
  if (type_ != Type::Object) type_error("an object", type_);
  return *o_;
}

// Copies share their container; the first write through a copy clones it, so Values keep
// plain value semantics.
Value::Array& Value::as_array() {
  if (type_ != Type::Array) type_error("an array", type_);
  if (a_.use_count() > 1) a_ = std::make_shared<Array>(*a_);
  return *a_;
}

Value::Object& Value::as_object() {
  if (type_ != Type::Object) type_error("an object", type_);
  if (o_.use_count() > 1) o_ = std::make_shared<Object>(*o_);
  return *o_;
}

const Value* Value::find(const std::string& key) const {
  if (type_ != Type::Object) return nullptr;
  for (const auto& [k, v] : *o_)
    if (k == key) return &v;
  return nullptr;
}

void Value::set(const std::string& key, Value v) {
  Object& members = as_object();
  for (auto& [k, old] : members) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  members.emplace_back(key, std::move(v));
}

void Value::push(Value v) { as_array().push_back(std::move(v)); }

namespace {

void write_value(std::string& out, const Value& v, int indent, int level);

void newline(std::string& out, int indent, int level) {
  if (indent == 0) return;
  out += '\n';
  out.append(static_cast<size_t>(indent * level), ' ');
}

void write_array(std::string& out, const Value::Array& items, int indent, int level) {
  if (items.empty()) {
    out += "[]";
    return;
  }
  out += '[';
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ',';
    newline(out, indent, level + 1);
    write_value(out, items[i], indent, level + 1);
  }
  newline(out, indent, level);
  out += ']';
}

void write_object(std::string& out, const Value::Object& members, int indent, int level) {
  if (members.empty()) {
    out += "{}";
    return;
  }
  out += '{';
  for (size_t i = 0; i < members.size(); ++i) {
    if (i > 0) out += ',';
    newline(out, indent, level + 1);
    write_string(out, members[i].first);
    out += indent > 0 ? ": " : ":";
    write_value(out, members[i].second, indent, level + 1);
  }
  newline(out, indent, level);
  out += '}';
}

void write_number(std::string& out, const Value& v) {
  if (v.is_integer()) {
    out += std::to_string(v.as_int());
  } else {
    write_double(out, v.as_number());
  }
}

void write_value(std::string& out, const Value& v, int indent, int level) {
  switch (v.type()) {
    case Value::Type::Null: out += "null"; break;
    case Value::Type::Bool: out += v.as_bool() ? "true" : "false"; break;
    case Value::Type::Number: write_number(out, v); break;
    case Value::Type::String: write_string(out, v.as_string()); break;
    case Value::Type::Array: write_array(out, v.as_array(), indent, level); break;
    case Value::Type::Object: write_object(out, v.as_object(), indent, level); break;
  }
}

}  // namespace

std::string Value::dump() const {
  std::string out;
  write_value(out, *this, 0, 0);
  return out;
}

std::string Value::dump_pretty() const {
  std::string out;
  write_value(out, *this, 2, 0);
  return out;
}

Value parse(const std::string& text) { return Parser(text).document(); }

Value parse_file(const std::string& path) {
  std::string text;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot read: " + std::strerror(errno));
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      throw Error(path + ": cannot read: " + std::strerror(err));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  try {
    return parse(text);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

}  // namespace sr1::json
