#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace sr1 {

void LrSchedule::validate(OptionStyle style) const {
  const auto name = [&](const char* flag) { return option_name(flag, style); };
  if (kind != "constant" && kind != "linear-warmup" && kind != "cosine") {
    throw UsageError(name("lr-schedule") + ": unknown schedule '" + kind +
                     "' (expected constant, linear-warmup or cosine)");
  }
  if (kind == "constant" && warmup_steps > 0) {
    throw UsageError(name("warmup-steps") +
                     ": the constant schedule has no warmup (use linear-warmup)");
  }
  if (warmup_steps < 0) throw UsageError(name("warmup-steps") + " must be 0 or more");
  if (min_lr_ratio < 0 || min_lr_ratio > 1) {
    throw UsageError(name("min-lr-ratio") + " must be between 0 and 1");
  }
}

float LrSchedule::at(int step) const {
  if (kind == "constant") return peak;
  if (step < warmup_steps) return peak * static_cast<float>(step) / warmup_steps;
  if (kind == "linear-warmup") return peak;
  const double progress =
      static_cast<double>(step - warmup_steps) / std::max(1, total_steps - warmup_steps);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return peak * static_cast<float>(std::max(0.0, min_lr_ratio + (1.0 - min_lr_ratio) * cosine));
}

}  // namespace sr1
