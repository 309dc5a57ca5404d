#include "backend/sample_row.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace sr1 {

double SoftmaxStats::prob(const float* logits, int32_t token) const {
  return std::exp(static_cast<double>(logits[token]) * inv_t - max - log_sum);
}

SoftmaxStats softmax_stats(const float* logits, int V, float inv_t) {
  SoftmaxStats s;
  s.inv_t = inv_t;
  for (int v = 1; v < V; v++) {
    if (logits[v] > logits[s.argmax]) s.argmax = v;
  }
  s.max = static_cast<double>(logits[s.argmax]) * inv_t;
  double sum = 0;
  for (int v = 0; v < V; v++) sum += std::exp(static_cast<double>(logits[v]) * inv_t - s.max);
  s.log_sum = std::log(sum);
  return s;
}

void LogitsAdjust::apply(float* logits, int V) const {
  for (const auto& [id, b] : bias) logits[id] += b;
  for (int32_t id : barred) logits[id] = -INFINITY;
  if (repetition != 1) {
    for (int32_t id : seen) {
      float& z = logits[id];
      z = z > 0 ? z / repetition : z * repetition;
    }
  }
  for (const auto& [id, n] : counts) logits[id] -= frequency * static_cast<float>(n) + presence;
  if (!allowed.empty()) {
    for (int v = 0; v < V; v++) {
      if (((allowed[v / 64] >> (v % 64)) & 1) == 0) logits[v] = -INFINITY;
    }
  }
}

namespace {

// The ids of the `k` largest of score[0..n), largest first (ties: lower id first).
template <typename T>
std::vector<int32_t> top_ids(const T* score, int n, int k) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  const auto before = [&](int32_t a, int32_t b) {
    return score[a] > score[b] || (score[a] == score[b] && a < b);
  };
  k = std::min(k, n);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  ids.resize(k);
  return ids;
}

TokenDraw filtered_row(const float* logits, int V, const SampleRow& row,
                       const SoftmaxStats& s) {
  std::vector<double> prob(V);
  for (int v = 0; v < V; v++) prob[v] = s.prob(logits, v);
  // Candidates in probability order. Only the head of the sorted list can survive top-k
  // and top-p, so sort a growing prefix until the cut falls inside it.
  const int k_cap = row.top_k > 0 ? std::min(row.top_k, V) : V;
  int want = std::min(k_cap, 64);
  std::vector<int32_t> order;
  int keep = 0;
  for (;;) {
    order = top_ids(prob.data(), V, want);
    const double floor = row.min_p * prob[order[0]];
    double before = 0;
    keep = 0;
    bool cut = false;
    for (int r = 0; r < static_cast<int>(order.size()); r++) {
      const double q = prob[order[r]];
      if (before > row.top_p || q < floor) {
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
  const double u = row.uniform * kept;
  double acc = 0;
  int last = 0;
  for (int r = 0; r < keep; r++) {
    if (prob[order[r]] <= 0) break;  // a token a grammar masked out (logit -inf), and all after
    last = r;
    acc += prob[order[r]];
    if (u < acc) return {order[r], s.logprob(logits, order[r])};
  }
  return {order[last], s.logprob(logits, order[last])};  // the rounding gap below `kept`
}

float inv_temperature(const SampleRow& row) {
  return row.temperature == 0 ? 1.0f : 1.0f / row.temperature;
}

}  // namespace

TokenDraw sample_row(const float* logits, int V, const SampleRow& row) {
  const bool greedy = row.temperature == 0;
  const SoftmaxStats s = softmax_stats(logits, V, inv_temperature(row));
  if (greedy) return {s.argmax, s.logprob(logits, s.argmax)};
  if (row.filtered(V)) return filtered_row(logits, V, row, s);
  // Inverse CDF over the whole vocabulary, in id order.
  double acc = 0;
  int32_t last = 0;
  for (int v = 0; v < V; v++) {
    const double p = s.prob(logits, v);
    if (p <= 0) continue;
    last = v;
    acc += p;
    if (row.uniform < acc) return {v, s.logprob(logits, v)};
  }
  return {last, s.logprob(logits, last)};  // the draw landed in the rounding gap below 1
}

std::vector<TokenDraw> top_logprobs(const float* logits, int V, const SampleRow& row, int k) {
  const SoftmaxStats s = softmax_stats(logits, V, inv_temperature(row));
  std::vector<TokenDraw> out;
  // A positive temperature keeps the order of the logits, so rank them directly. Tokens a
  // grammar masked out (logit -inf) cannot come and are not listed.
  for (int32_t id : top_ids(logits, V, k)) {
    if (logits[id] != -INFINITY) out.push_back({id, s.logprob(logits, id)});
  }
  return out;
}

}  // namespace sr1
