#include "train/minibatch.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

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

// Real tokens of row b, and the range [first, last + 1) they lie in.
int row_length(const Batch& batch, int b, int* begin, int* end) {
  const int32_t* m = batch.mask.data() + static_cast<size_t>(b) * batch.T;
  int n = 0;
  *begin = batch.T;
  *end = 0;
  for (int t = 0; t < batch.T; t++) {
    if (m[t] == 0) continue;
    n++;
    *begin = std::min(*begin, t);
    *end = t + 1;
  }
  return n;
}

MicroBatch as_is(const Batch& batch, const std::vector<int>& rows) {
  MicroBatch mb{select_rows(batch, rows), {}};
  for (int r : rows) {
    for (int t = 0; t < batch.T; t++) mb.source.push_back(r * batch.T + t);
  }
  return mb;
}

// One row: each given row's range [begin, end), with sequence id k + 1 for the k-th.
MicroBatch packed(const Batch& batch, const std::vector<int>& rows, const std::vector<int>& begin,
                  const std::vector<int>& end) {
  MicroBatch mb;
  Batch& out = mb.batch;
  out.B = 1;
  for (size_t k = 0; k < rows.size(); k++) {
    const int r = rows[k];
    for (int t = begin[r]; t < end[r]; t++) {
      const size_t i = static_cast<size_t>(r) * batch.T + t;
      const bool real = batch.mask[i] != 0;
      out.ids.push_back(batch.ids[i]);
      out.mask.push_back(real ? static_cast<int32_t>(k + 1) : 0);
      out.positions.push_back(batch.positions[i]);
      mb.source.push_back(static_cast<int32_t>(i));
    }
  }
  if (out.ids.empty()) {  // rows of padding only: one position of padding, nothing predicted
    out.ids.push_back(0);
    out.mask.push_back(0);
    out.positions.push_back(0);
    mb.source.push_back(-1);
  }
  out.T = static_cast<int>(out.ids.size());
  return mb;
}

}  // namespace

std::vector<MicroBatch> micro_batches(const Batch& batch, long budget, bool remove_padding) {
  std::vector<int> length(batch.B), begin(batch.B), end(batch.B);
  for (int b = 0; b < batch.B; b++) length[b] = row_length(batch, b, &begin[b], &end[b]);
  std::vector<MicroBatch> out;
  std::vector<int> rows;
  long tokens = 0;
  const auto close = [&]() {
    if (rows.empty()) return;
    out.push_back(remove_padding ? packed(batch, rows, begin, end) : as_is(batch, rows));
    rows.clear();
    tokens = 0;
  };
  for (int b = 0; b < batch.B; b++) {
    if (budget > 0 && !rows.empty() && tokens + length[b] > budget) close();
    rows.push_back(b);
    tokens += length[b];
  }
  close();
  return out;
}

std::vector<MicroBatch> packed_groups(const Batch& batch, int rows) {
  if (rows < 0) throw UsageError("rows per packed group must be >= 0");
  std::vector<int> begin(batch.B), end(batch.B);
  for (int b = 0; b < batch.B; b++) row_length(batch, b, &begin[b], &end[b]);
  const int step = rows == 0 ? std::max(batch.B, 1) : rows;
  std::vector<MicroBatch> out;
  for (int first = 0; first < batch.B || out.empty(); first += step) {
    std::vector<int> group;
    for (int b = first; b < std::min(first + step, batch.B); b++) group.push_back(b);
    out.push_back(packed(batch, group, begin, end));
  }
  return out;
}

MicroBatch packed_batch(const Batch& batch) { return std::move(packed_groups(batch, 0).front()); }

void unpack(const MicroBatch& mb, const float* x, float* out) {
  for (size_t i = 0; i < mb.source.size(); i++) {
    if (mb.source[i] >= 0) out[mb.source[i]] = x[i];
  }
}

std::vector<float> pack(const MicroBatch& mb, const float* x) {
  std::vector<float> out(mb.source.size(), 0.0f);
  for (size_t i = 0; i < mb.source.size(); i++) {
    if (mb.source[i] >= 0) out[i] = x[mb.source[i]];
  }
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
