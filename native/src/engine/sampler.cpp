#include "engine/sampler.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/sample_row.h"

namespace sr1 {
namespace {

// The `k` most probable token ids, most probable first (ties: lower id first).
std::vector<int32_t> top_ids(const std::vector<double>& prob, int k) {
  std::vector<int32_t> ids(prob.size());
  std::iota(ids.begin(), ids.end(), 0);
  const auto before = [&](int32_t a, int32_t b) {
    return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
  };
  k = std::min<int>(k, static_cast<int>(ids.size()));
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  ids.resize(k);
  return ids;
}

}  // namespace

SampleRow backend_row(const SamplingParams& p, int vocab, TokenRng& rng) {
  if (p.greedy()) return SampleRow{0.0f, 0.0};
  if (p.filtered(vocab)) return SampleRow{-1.0f, 0.0};
  return SampleRow{p.temperature, rng.uniform()};
}

TokenDraw sample_token(const float* logits, int vocab, const SamplingParams& p, TokenRng& rng) {
  if (!p.filtered(vocab)) return sample_row(logits, vocab, backend_row(p, vocab, rng));
  const SoftmaxStats s = softmax_stats(logits, vocab, 1.0f / p.temperature);
  std::vector<double> prob(vocab);
  for (int v = 0; v < vocab; v++) prob[v] = s.prob(logits, v);

  // Candidates in probability order. Only the head of the sorted list can survive top-k
  // and top-p, so sort a growing prefix until the cut falls inside it.
  const int k_cap = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  int want = std::min(k_cap, 64);
  std::vector<int32_t> order;
  int keep = 0;
  for (;;) {
    order = top_ids(prob, want);
    const double floor = p.min_p * prob[order[0]];
    double before = 0;
    keep = 0;
    bool cut = false;
    for (int r = 0; r < static_cast<int>(order.size()); r++) {
      const double q = prob[order[r]];
      if (before > p.top_p || q < floor) {
        cut = true;
        break;
      }
      before += q;
      keep = r + 1;
    }
    if (cut || want >= k_cap) break;
    want = std::min(k_cap, want * 8);
  }
  double kept = 0;
  for (int r = 0; r < keep; r++) kept += prob[order[r]];
  const double u = rng.uniform() * kept;
  double acc = 0;
  for (int r = 0; r < keep; r++) {
    acc += prob[order[r]];
    if (u < acc) return {order[r], s.logprob(logits, order[r])};
  }
  return {order[keep - 1], s.logprob(logits, order[keep - 1])};
}

}  // namespace sr1
