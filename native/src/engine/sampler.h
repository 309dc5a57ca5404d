// Next-token sampling with SGLang's definitions, on the host from one row of logits.
//
// Probabilities are softmax(logits / temperature). Sorted by probability (ties by id),
// a token is dropped when the mass of the tokens before it exceeds top_p, when its rank is
// top_k or more, or when its probability is below min_p times the largest; the rest are
// renormalised and one is drawn. temperature 0 is greedy (the lowest id among the
// largest logits). The reported log-prob is log_softmax(logits / temperature) at the
// chosen token over the whole vocabulary, before any truncation (temperature 0: the raw
// log-softmax) — the quantity the trainer computes for the same token.
//
// A row without top-k, top-p or min-p is sampled by the backend (Backend::sample_tokens, on
// the GPU where the logits are); a row with them here, on the host.
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
  // top-k, top-p or min-p cut the vocabulary
  bool filtered(int vocab) const {
    return !greedy() && ((top_k > 0 && top_k < vocab) || top_p < 1.0f || min_p > 0.0f);
  }
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

// The backend's row for an unfiltered token (drawing its uniform now), or a skipped row
// (temperature -1) when `p` filters: that token is sample_token's.
SampleRow backend_row(const SamplingParams& p, int vocab, TokenRng& rng);

TokenDraw sample_token(const float* logits, int vocab, const SamplingParams& p, TokenRng& rng);

}  // namespace sr1
