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

}  // namespace sr1
