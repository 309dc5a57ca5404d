// A request's sampling parameters and its seeded generator, with SGLang's definitions:
// probabilities are softmax(logits / temperature); sorted by probability (ties by id), a
// token is dropped when the mass of the tokens before it exceeds top_p, when its rank is
// top_k or more, or when its probability is below min_p times the largest; the rest are
// renormalised and one is drawn. temperature 0 is greedy (the lowest id among the largest
// logits). The reported log-prob is log_softmax(logits / temperature) at the chosen token
// over the whole vocabulary, before any truncation (temperature 0: the raw log-softmax) —
// the quantity the trainer computes for the same token.
//
// The backend samples every row where the logits are (Backend::sample_tokens, the rule of
// backend/sample_row.h); a filtered row the GPU leaves undone is sample_row's on the host,
// from the same SampleRow (the same draw).
#pragma once
#include <cstdint>
#include <random>

#include "backend/backend.h"

namespace sr1 {

struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = -1;  // -1: off
  float min_p = 0.0f;
  bool greedy() const { return temperature < 1e-6f; }
};

// Each sequence owns its generator and draws once per sampled token, so its tokens do not
// depend on the rest of the batch.
class TokenRng {
 public:
  explicit TokenRng(uint64_t seed) : gen_(seed) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  std::mt19937_64 gen_;
};

// The backend's row for the next token: the parameters and the draw, taken now (none when
// greedy), so each sampled token takes one draw from the sequence's generator.
SampleRow backend_row(const SamplingParams& p, TokenRng& rng);

}  // namespace sr1
