#include "backend/sample_row.h"

#include <cmath>

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

TokenDraw sample_row(const float* logits, int V, const SampleRow& row) {
  const bool greedy = row.temperature == 0;
  const SoftmaxStats s = softmax_stats(logits, V, greedy ? 1.0f : 1.0f / row.temperature);
  if (greedy) return {s.argmax, s.logprob(logits, s.argmax)};
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

}  // namespace sr1
