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

namespace {

// Real tokens of row b, and whether they form one contiguous run.
int row_length(const Batch& batch, int b, bool* contiguous) {
  const int32_t* m = batch.mask.data() + static_cast<size_t>(b) * batch.T;
  int n = 0, runs = 0;
  for (int t = 0; t < batch.T; t++) {
    n += m[t] != 0;
    runs += m[t] != 0 && (t == 0 || m[t - 1] == 0);
  }
  *contiguous = runs <= 1;
  return n;
}

MicroBatch as_is(const Batch& batch, const std::vector<int>& rows) {
  MicroBatch mb{select_rows(batch, rows), {}};
  for (int r : rows) {
    for (int t = 0; t < batch.T; t++) mb.source.push_back(r * batch.T + t);
  }
  return mb;
}

MicroBatch compacted(const Batch& batch, const std::vector<int>& rows, int width) {
  MicroBatch mb;
  Batch& out = mb.batch;
  out.B = static_cast<int>(rows.size());
  out.T = width;
  for (int r : rows) {
    int t_out = 0;
    for (int t = 0; t < batch.T; t++) {
      const size_t i = static_cast<size_t>(r) * batch.T + t;
      if (batch.mask[i] == 0) continue;
      out.ids.push_back(batch.ids[i]);
      out.mask.push_back(1);
      out.positions.push_back(batch.positions[i]);
      mb.source.push_back(static_cast<int32_t>(i));
      t_out++;
    }
    for (; t_out < width; t_out++) {
      out.ids.push_back(0);
      out.mask.push_back(0);
      out.positions.push_back(0);
      mb.source.push_back(-1);
    }
  }
  return mb;
}

}  // namespace

std::vector<MicroBatch> micro_batches(const Batch& batch, long budget, bool remove_padding) {
  std::vector<int> length(batch.B), order(batch.B);
  std::vector<bool> contiguous(batch.B);
  for (int b = 0; b < batch.B; b++) {
    bool c = false;
    length[b] = row_length(batch, b, &c);
    contiguous[b] = c;
  }
  std::iota(order.begin(), order.end(), 0);
  if (remove_padding) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return length[a] > length[b]; });
  }
  std::vector<MicroBatch> out;
  std::vector<int> rows;
  long tokens = 0;
  const auto close = [&]() {
    if (rows.empty()) return;
    bool compact = remove_padding;
    int width = 1;
    for (int r : rows) {
      compact = compact && contiguous[r];
      width = std::max(width, length[r]);
    }
    out.push_back(compact ? compacted(batch, rows, width) : as_is(batch, rows));
    rows.clear();
    tokens = 0;
  };
  for (int b : order) {
    if (budget > 0 && !rows.empty() && tokens + length[b] > budget) close();
    rows.push_back(b);
    tokens += length[b];
  }
  close();
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
