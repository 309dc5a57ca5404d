// cos/sin of the rotary angles for every position a batch uses, computed the way
// Hugging Face and vLLM do: inv_freq and the angle pos * inv_freq rounded to float32, so
// log-probs agree with the engines that sampled the tokens even at long positions.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace sr1 {

class RopeTable {
 public:
  RopeTable(const int32_t* pos, int n, int head_dim, float theta) : half_(head_dim / 2) {
    int max_pos = 0;
    for (int i = 0; i < n; i++) max_pos = std::max(max_pos, pos[i]);
    cos_.resize(static_cast<size_t>(max_pos + 1) * half_);
    sin_.resize(cos_.size());
    for (int j = 0; j < half_; j++) {
      const float inv_freq =
          1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(head_dim));
      for (int p = 0; p <= max_pos; p++) {
        const float angle = static_cast<float>(p) * inv_freq;
        cos_[static_cast<size_t>(p) * half_ + j] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin_[static_cast<size_t>(p) * half_ + j] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
    }
  }
  const float* cos(int p) const { return cos_.data() + static_cast<size_t>(p) * half_; }
  const float* sin(int p) const { return sin_.data() + static_cast<size_t>(p) * half_; }

 private:
  int half_;
  std::vector<float> cos_, sin_;
};

}  // namespace sr1
