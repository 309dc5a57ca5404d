// Error type shared by the native library: every failure carries a one-line message that
// names the file, tensor, field or option at fault. Executables print it and exit non-zero.
#pragma once
#include <stdexcept>
#include <string>

namespace sr1 {

struct Error : std::runtime_error {
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A bad command line (exit code 2), as opposed to bad input data (exit code 1).
struct UsageError : Error {
  explicit UsageError(const std::string& message) : Error(message) {}
};

// How a message names an option: as a command-line flag (--warmup-steps) or as a JSON field
// of a stdio protocol ('warmup_steps'). Options are spelt as flags in the code.
enum class OptionStyle { Flag, Field };
inline std::string option_name(const std::string& flag, OptionStyle style) {
  if (style == OptionStyle::Flag) return "--" + flag;
  std::string field = flag;
  for (char& c : field) c = c == '-' ? '_' : c;
  return "'" + field + "'";
}

}  // namespace sr1
