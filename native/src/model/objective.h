// The per-token part of a training objective L, as the language-model head's backward pass
// needs it. Given the current log-probs (and entropies) of some of a batch's predicted
// tokens, an objective says how L depends on them: dL/dlogprob = -coef and
// dL/dentropy = ent_coef, token by token. The head turns these into the gradient of the
// logits, and the rest of the backward pass is the same for every objective.
#pragma once
#include <cstdint>

namespace sr1 {

class TokenObjective {
 public:
  virtual ~TokenObjective() = default;
  // Whether L depends on the entropies (then ent_coef is filled and back-propagated).
  virtual bool uses_entropy() const { return false; }
  // Whether L depends on the token at position `index` at all. The head skips the others
  // (an RL loss reads only response tokens: the prompt's rows cost the vocabulary-sized
  // matmuls for nothing); when the caller asks for every log-prob, the others get theirs
  // after, with no backward pass.
  virtual bool wants(int32_t index) const { return true; }
  // For n predicted tokens at positions index[r] (b * T + t of the batch) with their current
  // logprob[r] and entropy[r], fills coef[r] and, when uses_entropy(), ent_coef[r].
  virtual void coefficients(const int32_t* index, int n, const float* logprob,
                            const float* entropy, float* coef, float* ent_coef) = 0;
};

// L = -sum_i weights[i] * logprob[i] over the batch's positions (SFT, `grad --loss weights`).
class WeightedLogprobs final : public TokenObjective {
 public:
  explicit WeightedLogprobs(const float* weights) : w_(weights) {}
  bool wants(int32_t index) const override { return w_[index] != 0.0f; }
  void coefficients(const int32_t* index, int n, const float*, const float*, float* coef,
                    float*) override {
    for (int r = 0; r < n; r++) coef[r] = w_[index[r]];
  }

 private:
  const float* w_;
};

}  // namespace sr1
