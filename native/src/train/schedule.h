// Learning-rate schedules, with verl's (and transformers') step conventions: step s is
// 0-based, warmup multiplies by s / warmup (so the first step's rate is 0), cosine decays
// from the peak to min_lr_ratio * peak at total_steps.
#pragma once
#include <string>

#include "util/error.h"

namespace sr1 {

struct LrSchedule {
  std::string kind = "constant";  // constant | linear-warmup | cosine
  float peak = 1e-5f;
  int warmup_steps = 0;
  int total_steps = 1;
  float min_lr_ratio = 0.0f;

  // Throws sr1::UsageError naming the option for an unknown kind or inconsistent values.
  void validate(OptionStyle style = OptionStyle::Flag) const;
  float at(int step) const;
};

}  // namespace sr1
