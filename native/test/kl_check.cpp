// searchr1-kl-check: the trainer's KL estimators (kl_penalty, train/ppo_loss.h) on the inputs
// a test gives it, so that test/native/kl.test.ts can hold them against src/rl/kl.ts.
// Reads lines "<kl_loss_type> <logp> <ref_logp>" from stdin (the names --kl-loss-type takes;
// numbers as strtod reads them, inf and nan included) and writes "<value> <dlogp>" for each,
// in %.17g, which a double survives exactly. Exits 1 with the line on unreadable input.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "train/ppo_loss.h"
#include "util/error.h"

namespace {

bool parse_number(const std::string& text, double* out) {
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return !text.empty() && *end == '\0';
}

}  // namespace

int main() {
  std::string line;
  for (long n = 1; std::getline(std::cin, line); n++) {
    std::istringstream fields(line);
    std::string name, logp_text, ref_text, extra;
    double logp = 0, ref = 0;
    if (!(fields >> name >> logp_text >> ref_text) || (fields >> extra) ||
        !parse_number(logp_text, &logp) || !parse_number(ref_text, &ref)) {
      std::fprintf(stderr, "searchr1-kl-check: line %ld: expected <type> <logp> <ref>: %s\n", n,
                   line.c_str());
      return 1;
    }
    try {
      const sr1::TokenTerm t =
          sr1::kl_penalty(sr1::parse_kl_type(name, sr1::OptionStyle::Flag), logp, ref);
      std::printf("%.17g %.17g\n", t.value, t.dlogp);
    } catch (const sr1::UsageError& e) {
      std::fprintf(stderr, "searchr1-kl-check: line %ld: %s\n", n, e.what());
      return 1;
    }
  }
  return 0;
}
