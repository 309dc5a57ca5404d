#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

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

Sampled sample_token(const float* logits, int vocab, const SamplingParams& p, TokenRng& rng) {
  const float inv_t = p.greedy() ? 1.0f : 1.0f / p.temperature;
  int argmax = 0;
  for (int v = 1; v < vocab; v++) {
    if (logits[v] > logits[argmax]) argmax = v;
  }
  const double mx = static_cast<double>(logits[argmax]) * inv_t;
  double sum = 0;
  for (int v = 0; v < vocab; v++) sum += std::exp(static_cast<double>(logits[v]) * inv_t - mx);
  const double log_sum = std::log(sum);
  const auto logprob = [&](int32_t t) {
    return static_cast<float>(static_cast<double>(logits[t]) * inv_t - mx - log_sum);
  };
  if (p.greedy()) return Sampled{argmax, logprob(argmax)};
  std::vector<double> prob(vocab);
  for (int v = 0; v < vocab; v++) {
    prob[v] = std::exp(static_cast<double>(logits[v]) * inv_t - mx - log_sum);
  }

  const bool filter = (p.top_k > 0 && p.top_k < vocab) || p.top_p < 1.0f || p.min_p > 0.0f;
  if (!filter) {  // inverse CDF over the whole vocabulary, in id order
    const double u = rng.uniform();
    double acc = 0;
    int32_t last = 0;
    for (int v = 0; v < vocab; v++) {
      if (prob[v] <= 0) continue;
      last = v;
      acc += prob[v];
      if (u < acc) return Sampled{v, logprob(v)};
    }
    return Sampled{last, logprob(last)};  // u landed in the rounding gap below 1
  }

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
    if (u < acc) return Sampled{order[r], logprob(order[r])};
  }
  return Sampled{order[keep - 1], logprob(order[keep - 1])};
}

}  // namespace sr1
