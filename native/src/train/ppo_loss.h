// The actor's RL objective (PPO's clipped surrogate with a KL loss against the reference
// policy and an entropy bonus), as verl defines it, per token and aggregated:
//
//   ratio      = exp(logp - old_logp)
//   pg         = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))
//                and, for A < 0, min(that, -A * clip_c)                  (dual clip)
//   kl         = k1 logp - ref | abs |logp - ref| | k2 (logp - ref)^2 / 2
//                | k3 exp(k) - k - 1 with k = clamp(ref - logp, -20, 20), clamped to [-10, 10]
//   pg         *= w_is                                     (rollout correction, when given)
//   L          = agg(pg) - entropy_coeff * agg(entropy) + kl_coef * agg(kl)
//
// over the loss tokens (predicted and in the response mask). w_is is the controller's
// truncated importance weight pi_old/pi_rollout of the token (src/rl/rollout-correction.ts),
// a constant (detached) that multiplies the token's policy loss and its gradient, as verl's
// compute_policy_loss_vanilla does with `rollout_is_weights` (verl/trainer/ppo/core_algos.py,
// volcengine/verl main, 2026-01; docs/algo/rollout_corr.md); the KL and entropy terms and
// pg_clipfrac do not see it. agg is a weighted sum whose
// weights depend only on the mask (PpoWeights), so L's derivative per token is the
// per-token derivative times its weight: that is what the head back-propagates.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/objective.h"
#include "util/error.h"

namespace sr1 {

enum class KlType { K1, Abs, K2, K3 };  // verl: kl, abs, mse, low_var_kl
enum class LossAgg { TokenMean, SeqMeanTokenSum, SeqMeanTokenMean };

// Throw UsageError naming the option (--kl-loss-type / --loss-agg-mode) and the choices.
KlType parse_kl_type(const std::string& name, OptionStyle style);
LossAgg parse_loss_agg(const std::string& name, OptionStyle style);

struct PpoConfig {
  float clip_low = 0.2f, clip_high = 0.2f;  // eps_low, eps_high
  float clip_c = 3.0f;                      // dual-clip bound for negative advantages
  KlType kl_type = KlType::K3;
  float kl_coef = 0.0f;
  float entropy_coeff = 0.0f;
  LossAgg agg = LossAgg::TokenMean;
};

// A per-token quantity and its derivative with respect to the token's log-prob (or, for
// the critic's loss, its value).
struct TokenTerm {
  double value, dlogp;
};

// The clipped surrogate of one token; `clipped` is verl's pg_clipfrac indicator
// (the clipped branch is larger than the unclipped one).
TokenTerm ppo_clipped_surrogate(double logp, double old_logp, double advantage,
                                const PpoConfig& c, bool* clipped);

// The KL estimate of one token against the reference policy's log-prob: J. Schulman's
// estimators ("Approximating KL divergence", 2020), by verl's one rule, kl_penalty_forward
// in verl/trainer/ppo/core_algos.py (volcengine/verl main, 2026-01; the [-20, 20] clamp
// since #1779, 2025-06):
//   kl (k1)          logp - ref
//   abs              |logp - ref|
//   mse (k2)         (logp - ref)^2 / 2
//   low_var_kl (k3)  k = clamp(ref - logp, -20, 20); clamp(exp(k) - k - 1, -10, 10)
// src/rl/kl.ts computes the same rule for the in-reward KL; test/native/kl.test.ts holds the
// two together through searchr1-kl-check. dlogp is the derivative autograd takes: none beyond
// a clamp's bounds (k3 is 10 and flat where ref - logp > 2.61 or < -11.0, an infinite
// log-prob included), sign(logp - ref) for abs (0 at 0). verl's straight-through "k1+"/"k3+"
// (k2's gradient under k1's or k3's value) is not offered.
TokenTerm kl_k1(double logp, double ref_logp);
TokenTerm kl_abs(double logp, double ref_logp);
TokenTerm kl_k2(double logp, double ref_logp);
TokenTerm kl_k3(double logp, double ref_logp);
TokenTerm kl_penalty(KlType type, double logp, double ref_logp);

// The aggregation weight of every position ([B*T]; 0 off the loss tokens).
std::vector<double> aggregation_weights(LossAgg agg, const std::vector<uint8_t>& loss_token,
                                        int B, int T);

// Throws an Error naming the row and position of the first loss token (predicted, response
// mask non-zero) whose rollout_is_weights value is negative or not finite.
void check_is_weights(const Batch& batch, const std::vector<float>& response_mask,
                      const std::vector<float>& is_weights);

// The objective over one batch, with the sums the trainer reports. The per-token inputs are
// [B*T] arrays aligned as the batch (position t holds token t's values).
class PpoObjective final : public TokenObjective {
 public:
  // ref_logp may be empty when config.kl_coef is 0 (no KL term, kl_loss unknown).
  // is_weights ([B*T], rollout_is_weights) may be empty: every weight 1. On the loss tokens
  // each must be finite and >= 0 (an Error names the tensor otherwise).
  PpoObjective(const Batch& batch, const std::vector<float>& response_mask,
               std::vector<float> old_logp, std::vector<float> ref_logp,
               std::vector<float> advantages, PpoConfig config,
               std::vector<float> is_weights = {});

  // The backward passes that follow run on a micro-batch whose position i is position
  // source[i] of this batch (MicroBatch::source); null: this batch itself.
  void use_source(const int32_t* source) { source_ = source; }

  bool uses_entropy() const override { return config_.entropy_coeff != 0.0f; }
  bool wants(int32_t index) const override {
    return weight_[source_ != nullptr ? source_[index] : index] != 0.0;
  }
  void coefficients(const int32_t* index, int n, const float* logprob, const float* entropy,
                    float* coef, float* ent_coef) override;

  // Whether kl_loss is known (ref_logp was given; without it there is no KL term).
  bool has_kl() const { return !ref_.empty(); }
  // Valid after the backward pass has visited every loss token.
  double pg_loss() const { return pg_; }
  double kl_loss() const { return kl_; }
  double entropy() const { return entropy_; }
  double loss() const { return pg_ - config_.entropy_coeff * entropy_ + config_.kl_coef * kl_; }
  double pg_clipfrac() const { return tokens_ > 0 ? static_cast<double>(clipped_) / tokens_ : 0; }
  // verl's ppo_kl: the token mean of old_logp - logp
  double ppo_kl() const { return tokens_ > 0 ? ppo_kl_sum_ / tokens_ : 0; }
  long tokens() const { return tokens_; }
  // The sums behind the values above, handed to `sum` (which replaces each by its sum over
  // the data-parallel ranks, each of which visited its own rows) and read back.
  void reduce_sums(const std::function<void(double* sums, size_t n)>& sum);

 private:
  PpoConfig config_;
  const int32_t* source_ = nullptr;
  std::vector<float> old_, ref_, adv_, is_;
  std::vector<double> weight_;
  double pg_ = 0, kl_ = 0, entropy_ = 0, ppo_kl_sum_ = 0;
  long clipped_ = 0, tokens_ = 0;
};

}  // namespace sr1
