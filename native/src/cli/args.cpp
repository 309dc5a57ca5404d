#include "cli/args.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "util/error.h"

namespace sr1 {

Args::Args(std::string command, std::string summary, std::vector<OptionSpec> specs,
           const std::vector<std::string>& argv, std::vector<std::string> examples)
    : command_(std::move(command)),
      summary_(std::move(summary)),
      specs_(std::move(specs)),
      examples_(std::move(examples)) {
  for (size_t i = 0; i < argv.size(); i++) {
    const std::string& arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      throw UsageError("unexpected argument '" + arg + "' (see " + command_ + " --help)");
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const OptionSpec& s = spec(name);
    if (s.value.empty()) {
      if (eq != std::string::npos) throw UsageError("--" + name + " takes no value");
      values_[name] = "";
    } else if (eq != std::string::npos) {
      values_[name] = arg.substr(eq + 1);
    } else if (i + 1 < argv.size()) {
      values_[name] = argv[++i];
    } else {
      throw UsageError("--" + name + " needs a value (" + s.value + ")");
    }
  }
}

const OptionSpec& Args::spec(const std::string& name) const {
  for (const OptionSpec& s : specs_) {
    if (s.name == name) return s;
  }
  throw UsageError("unknown option --" + name + " (see " + command_ + " --help)");
}

std::string Args::usage() const {
  std::string out = "Usage: " + command_ + " [options]\n\n" + summary_ +
                    "\n\nOptions:\n";
  for (const OptionSpec& s : specs_) {
    std::string left = "  --" + s.name + (s.value.empty() ? "" : " " + s.value);
    if (left.size() < 28) left.resize(28, ' ');
    else left += "  ";
    out += left + s.help + "\n";
  }
  if (!examples_.empty()) {
    out += "\nExamples:\n";
    for (const std::string& e : examples_) out += "  $ " + e + "\n";
  }
  return out;
}

std::string Args::required(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end() || it->second.empty()) {
    throw UsageError("--" + name + " is required (see " + command_ + " --help)");
  }
  return it->second;
}

std::string Args::text(const std::string& name, const std::string& fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

long Args::integer(const std::string& name, long fallback, long min) const {
  if (!has(name)) return fallback;
  const std::string v = values_.at(name);
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < min) {
    throw UsageError("--" + name + " must be an integer >= " + std::to_string(min) + ", got '" +
                     v + "'");
  }
  return n;
}

double Args::number(const std::string& name, double fallback) const {
  if (!has(name)) return fallback;
  const std::string v = values_.at(name);
  char* end = nullptr;
  const double n = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(n)) {
    throw UsageError("--" + name + " must be a number, got '" + v + "'");
  }
  return n;
}

unsigned long long Args::bytes(const std::string& name, unsigned long long fallback) const {
  if (!has(name)) return fallback;
  const std::string v = values_.at(name);
  char* end = nullptr;
  const double n = std::strtod(v.c_str(), &end);
  std::string unit(end);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::map<std::string, double> units = {{"", 1},      {"B", 1},      {"KB", 1e3},
                                               {"MB", 1e6},  {"GB", 1e9},   {"KIB", 1024.0},
                                               {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  const auto it = units.find(unit);
  if (end == v.c_str() || it == units.end() || !(n > 0)) {
    throw UsageError("--" + name + " must be a size such as 5GB or 500MB, got '" + v + "'");
  }
  return static_cast<unsigned long long>(n * it->second);
}

std::string number_text(double v, int decimals) {
  char buf[32];
  for (int digits = 1; digits <= 9; digits++) {  // 9 digits tell every float apart
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (static_cast<float>(std::strtod(buf, nullptr)) == static_cast<float>(v)) break;
  }
  std::string s = buf;
  const size_t e = s.find('e');
  if (e != std::string::npos) {
    // C writes at least two exponent digits (1e-05); people write 1e-5.
    const size_t first = e + (s[e + 1] == '-' || s[e + 1] == '+' ? 2 : 1);
    while (first + 1 < s.size() && s[first] == '0') s.erase(first, 1);
  } else if (decimals > 0 && s.find('.') == std::string::npos) {
    s += "." + std::string(decimals, '0');
  }
  return s;
}

}  // namespace sr1
