// cos/sin of the rotary angles, computed the way Hugging Face and vLLM do: inv_freq and the
// angle pos * inv_freq rounded to float32, so log-probs agree with the engines that sampled
// the tokens even at long positions. The table is kept between calls and grows to the
// largest position seen: the engine's decode steps would otherwise recompute thousands of
// cos/sin per layer for one new token.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace sr1 {

class RopeTable {
 public:
  // Makes positions 0..max of `pos[0..n)` available for this head_dim and theta.
  void ensure(const int32_t* pos, int n, int head_dim, float theta) {
    int max_pos = 0;
    for (int i = 0; i < n; i++) max_pos = std::max(max_pos, pos[i]);
    if (head_dim != head_dim_ || theta != theta_) {
      head_dim_ = head_dim;
      theta_ = theta;
      rows_ = 0;
      cos_.clear();
      sin_.clear();
    }
    if (max_pos < rows_) return;
    const int half = head_dim / 2;
    const int rows = std::max(max_pos + 1, 2 * rows_);  // doubling: amortised growth
    cos_.resize(static_cast<size_t>(rows) * half);
    sin_.resize(cos_.size());
    for (int j = 0; j < half; j++) {
      const float inv_freq =
          1.0f / std::pow(theta, static_cast<float>(2 * j) / static_cast<float>(head_dim));
      for (int p = rows_; p < rows; p++) {
        const float angle = static_cast<float>(p) * inv_freq;
        cos_[static_cast<size_t>(p) * half + j] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin_[static_cast<size_t>(p) * half + j] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
    }
    rows_ = rows;
  }
  const float* cos(int p) const { return cos_.data() + static_cast<size_t>(p) * (head_dim_ / 2); }
  const float* sin(int p) const { return sin_.data() + static_cast<size_t>(p) * (head_dim_ / 2); }

 private:
  int head_dim_ = 0, rows_ = 0;
  float theta_ = 0;
  std::vector<float> cos_, sin_;
};

}  // namespace sr1
