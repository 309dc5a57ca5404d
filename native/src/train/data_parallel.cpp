#include "train/data_parallel.h"

#include <algorithm>
#include <numeric>

namespace sr1 {

std::vector<int> rank_of_rows(const std::vector<long>& tokens, int ranks) {
  std::vector<int> order(tokens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return tokens[a] > tokens[b]; });
  std::vector<long> load(ranks, 0);
  std::vector<int> rank(tokens.size(), 0);
  for (int row : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    rank[row] = r;
    load[r] += tokens[row];
  }
  return rank;
}

std::vector<int> rows_of_rank(const Batch& batch, int rank, int ranks) {
  std::vector<long> tokens(batch.B, 0);
  for (int b = 0; b < batch.B; b++) {
    const int32_t* m = batch.mask.data() + static_cast<size_t>(b) * batch.T;
    for (int t = 0; t < batch.T; t++) tokens[b] += m[t] != 0;
  }
  const std::vector<int> owner = rank_of_rows(tokens, ranks);
  std::vector<int> mine;
  for (int b = 0; b < batch.B; b++) {
    if (owner[b] == rank) mine.push_back(b);
  }
  return mine;
}

namespace {

// Micro-batches of the rows `mine` of `batch`, their sources mapped back to `batch`.
std::vector<MicroBatch> remapped(std::vector<MicroBatch> parts, const std::vector<int>& mine,
                                 int T) {
  for (MicroBatch& p : parts) {
    for (int32_t& s : p.source) {
      if (s >= 0) s = mine[s / T] * T + s % T;
    }
  }
  return parts;
}

}  // namespace

std::vector<MicroBatch> rank_micro_batches(const Batch& part, const MiniBatching& m,
                                           const Comm& comm) {
  if (comm.size() == 1) return micro_batches(part, m.max_token_len, m.remove_padding);
  const std::vector<int> mine = rows_of_rank(part, comm.rank(), comm.size());
  if (mine.empty()) return {};
  return remapped(micro_batches(select_rows(part, mine), m.max_token_len, m.remove_padding), mine,
                  part.T);
}

std::vector<MicroBatch> rank_packed_groups(const Batch& batch, int rows, const Comm& comm) {
  if (comm.size() == 1) return packed_groups(batch, rows);
  const std::vector<int> mine = rows_of_rank(batch, comm.rank(), comm.size());
  if (mine.empty()) return {};
  return remapped(packed_groups(select_rows(batch, mine), rows), mine, batch.T);
}

}  // namespace sr1
