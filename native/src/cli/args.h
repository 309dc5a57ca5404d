// Command-line options of the native executables: `--name value`, `--name=value` and
// value-less switches. Errors are sr1::UsageError naming the option.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace sr1 {

struct OptionSpec {
  std::string name;  // without the dashes
  std::string value;  // placeholder shown in help ("DIR", "N"); empty for a switch
  std::string help;
};

class Args {
 public:
  // `command` is what the user types before the options ("searchr1-trainer sft").
  // `examples` are whole command lines shown under "Examples:" in the usage (a test runs
  // every one of them).
  Args(std::string command, std::string summary, std::vector<OptionSpec> specs,
       const std::vector<std::string>& argv, std::vector<std::string> examples = {});

  bool help_requested() const { return help_; }
  std::string usage() const;

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  bool flag(const std::string& name) const { return has(name); }
  std::string required(const std::string& name) const;
  std::string text(const std::string& name, const std::string& fallback) const;
  long integer(const std::string& name, long fallback, long min) const;
  double number(const std::string& name, double fallback) const;
  // Sizes such as 5GB, 500MB, 1048576.
  unsigned long long bytes(const std::string& name, unsigned long long fallback) const;

 private:
  const OptionSpec& spec(const std::string& name) const;
  std::string command_, summary_;
  std::vector<OptionSpec> specs_;
  std::vector<std::string> examples_;
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

// A default as help texts show it: the shortest decimal that reads back as the same float
// ("1e-5", "0.999", "3"), so that the text is read off the struct that holds the default;
// a whole number gets `decimals` zeros after a point ("1.0").
std::string number_text(double v, int decimals = 0);

}  // namespace sr1
