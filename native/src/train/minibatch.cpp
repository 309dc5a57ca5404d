#include "train/minibatch.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "util/error.h"

namespace sr1 {

void for_each_mini_batch(int B, const MiniBatching& m, std::mt19937_64& rng,
                         const std::function<void(const std::vector<int>& rows)>& step) {
  const int mini = m.mini_batch_size > 0 ? std::min(m.mini_batch_size, B) : B;
  if (B % mini != 0) {
    throw UsageError("ppo_mini_batch_size " + std::to_string(mini) +
                     " must divide the batch's " + std::to_string(B) + " sequences");
  }
  std::vector<int> order(B);
  for (int e = 0; e < m.epochs; e++) {
    std::iota(order.begin(), order.end(), 0);
    if (m.shuffle) std::shuffle(order.begin(), order.end(), rng);
    for (int m0 = 0; m0 < B; m0 += mini) {
      step(std::vector<int>(order.begin() + m0, order.begin() + m0 + mini));
    }
  }
}

std::vector<std::pair<int, int>> micro_batches(const Batch& batch, long budget) {
  std::vector<std::pair<int, int>> out;
  int first = 0;
  long tokens = 0;
  for (int b = 0; b < batch.B; b++) {
    long real = 0;
    for (int t = 0; t < batch.T; t++) real += batch.mask[static_cast<size_t>(b) * batch.T + t];
    if (budget > 0 && b > first && tokens + real > budget) {
      out.emplace_back(first, b);
      first = b;
      tokens = 0;
    }
    tokens += real;
  }
  if (batch.B > first) out.emplace_back(first, batch.B);
  return out;
}

Batch select_rows(const Batch& data, const std::vector<int>& rows) {
  Batch out;
  out.B = static_cast<int>(rows.size());
  out.T = data.T;
  for (int r : rows) {
    const Batch one = data.rows(r, r + 1);
    out.ids.insert(out.ids.end(), one.ids.begin(), one.ids.end());
    out.mask.insert(out.mask.end(), one.mask.begin(), one.mask.end());
    out.positions.insert(out.positions.end(), one.positions.begin(), one.positions.end());
  }
  return out;
}

std::vector<float> select_rows(const std::vector<float>& x, const std::vector<int>& rows, int T) {
  std::vector<float> out;
  out.reserve(rows.size() * T);
  for (int r : rows) {
    out.insert(out.end(), x.begin() + static_cast<long>(r) * T,
               x.begin() + static_cast<long>(r + 1) * T);
  }
  return out;
}

}  // namespace sr1
