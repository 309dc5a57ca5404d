#include "train/ppo_loss.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace sr1 {

KlType parse_kl_type(const std::string& name, OptionStyle style) {
  if (name == "kl" || name == "k1") return KlType::K1;
  if (name == "abs") return KlType::Abs;
  if (name == "mse" || name == "k2") return KlType::K2;
  if (name == "low_var_kl" || name == "k3") return KlType::K3;
  throw UsageError(option_name("kl-loss-type", style) + ": '" + name +
                   "' is not one of low_var_kl, kl, mse, abs");
}

LossAgg parse_loss_agg(const std::string& name, OptionStyle style) {
  if (name == "token-mean") return LossAgg::TokenMean;
  if (name == "seq-mean-token-sum") return LossAgg::SeqMeanTokenSum;
  if (name == "seq-mean-token-mean") return LossAgg::SeqMeanTokenMean;
  throw UsageError(option_name("loss-agg-mode", style) + ": '" + name +
                   "' is not one of token-mean, seq-mean-token-sum, seq-mean-token-mean");
}

TokenTerm ppo_clipped_surrogate(double logp, double old_logp, double advantage,
                                const PpoConfig& c, bool* clipped) {
  // verl clamps log(ratio) to [-20, 20] before the exp (no gradient beyond).
  const double log_ratio = logp - old_logp;
  const double ratio = std::exp(std::clamp(log_ratio, -20.0, 20.0));
  const double dratio = std::abs(log_ratio) < 20.0 ? ratio : 0.0;
  const double lo = 1.0 - c.clip_low, hi = 1.0 + c.clip_high;
  const double unclipped = -advantage * ratio;
  const double clipped_loss = -advantage * std::clamp(ratio, lo, hi);
  *clipped = clipped_loss > unclipped;
  // d(-A * ratio)/dlogp = -A * ratio; the clipped branch is constant outside [lo, hi].
  TokenTerm t = *clipped ? TokenTerm{clipped_loss, 0.0} : TokenTerm{unclipped, -advantage * dratio};
  if (advantage < 0) {
    const double bound = -advantage * c.clip_c;  // dual clip: a cap on the loss
    if (bound < t.value) t = TokenTerm{bound, 0.0};
  }
  return t;
}

// Schulman's estimators as verl's kl_penalty_forward computes them (see ppo_loss.h for the rule
// and its source); the derivatives are those autograd takes through it, torch.clamp passing the
// gradient at its bounds and none beyond.
TokenTerm kl_k1(double logp, double ref_logp) { return {logp - ref_logp, 1.0}; }

TokenTerm kl_abs(double logp, double ref_logp) {
  const double d = logp - ref_logp;
  return {std::abs(d), d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0)};
}

TokenTerm kl_k2(double logp, double ref_logp) {
  const double d = logp - ref_logp;
  return {0.5 * d * d, d};
}

TokenTerm kl_k3(double logp, double ref_logp) {
  const double raw = ref_logp - logp;
  const double kl = std::clamp(raw, -20.0, 20.0);  // keeps an infinite log-prob from NaN
  const double kld = std::exp(kl) - kl - 1.0;
  const double value = std::clamp(kld, -10.0, 10.0);
  const bool passes = std::abs(raw) <= 20.0 && std::abs(kld) <= 10.0;  // false for NaN
  return {value, passes ? 1.0 - std::exp(kl) : 0.0};
}

TokenTerm kl_penalty(KlType type, double logp, double ref_logp) {
  switch (type) {
    case KlType::K1: return kl_k1(logp, ref_logp);
    case KlType::Abs: return kl_abs(logp, ref_logp);
    case KlType::K2: return kl_k2(logp, ref_logp);
    case KlType::K3: return kl_k3(logp, ref_logp);
  }
  return {0, 0};
}

std::vector<double> aggregation_weights(LossAgg agg, const std::vector<uint8_t>& loss_token,
                                        int B, int T) {
  std::vector<double> w(static_cast<size_t>(B) * T, 0.0);
  std::vector<int> per_seq(B, 0);
  long total = 0;
  int seqs = 0;  // sequences with at least one loss token
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) per_seq[b] += loss_token[static_cast<size_t>(b) * T + t];
    total += per_seq[b];
    seqs += per_seq[b] > 0;
  }
  for (int b = 0; b < B; b++) {
    if (per_seq[b] == 0) continue;
    double wb = 0;
    switch (agg) {
      case LossAgg::TokenMean: wb = 1.0 / total; break;
      case LossAgg::SeqMeanTokenSum: wb = 1.0 / seqs; break;
      case LossAgg::SeqMeanTokenMean: wb = 1.0 / (static_cast<double>(seqs) * per_seq[b]); break;
    }
    for (int t = 0; t < T; t++) {
      const size_t i = static_cast<size_t>(b) * T + t;
      if (loss_token[i]) w[i] = wb;
    }
  }
  return w;
}

PpoObjective::PpoObjective(const Batch& batch, const std::vector<float>& response_mask,
                           std::vector<float> old_logp, std::vector<float> ref_logp,
                           std::vector<float> advantages, PpoConfig config,
                           std::vector<float> is_weights)
    : config_(config),
      old_(std::move(old_logp)),
      ref_(std::move(ref_logp)),
      adv_(std::move(advantages)),
      is_(std::move(is_weights)) {
  std::vector<uint8_t> loss_token(static_cast<size_t>(batch.B) * batch.T, 0);
  for (int b = 0; b < batch.B; b++) {
    for (int t = 0; t < batch.T; t++) {
      const size_t i = static_cast<size_t>(b) * batch.T + t;
      loss_token[i] = batch.predicted(b, t) && response_mask[i] != 0.0f;
    }
  }
  weight_ = aggregation_weights(config_.agg, loss_token, batch.B, batch.T);
  if (config_.kl_coef != 0.0f && ref_.empty()) {
    throw Error("a KL loss (kl_loss_coef > 0) needs the reference log-probs");
  }
  if (!is_.empty()) check_is_weights(batch, response_mask, is_);
}

void check_is_weights(const Batch& batch, const std::vector<float>& response_mask,
                      const std::vector<float>& is_weights) {
  const size_t n = static_cast<size_t>(batch.B) * batch.T;
  if (is_weights.size() != n || response_mask.size() != n) {
    throw Error("rollout_is_weights: not one value per token");
  }
  for (int b = 0; b < batch.B; b++) {
    for (int t = 0; t < batch.T; t++) {
      const size_t i = static_cast<size_t>(b) * batch.T + t;
      const float w = is_weights[i];
      if (batch.predicted(b, t) && response_mask[i] != 0.0f && !(std::isfinite(w) && w >= 0.0f)) {
        throw Error("rollout_is_weights must be finite and >= 0 on the loss tokens (row " +
                    std::to_string(b) + ", position " + std::to_string(t) + ": " +
                    std::to_string(w) + ")");
      }
    }
  }
}

void PpoObjective::coefficients(const int32_t* index, int n, const float* logprob,
                                const float* entropy, float* coef, float* ent_coef) {
  for (int r = 0; r < n; r++) {
    const size_t i = source_ != nullptr ? source_[index[r]] : index[r];
    const double w = weight_[i];
    coef[r] = 0.0f;
    ent_coef[r] = 0.0f;
    if (w == 0.0) continue;  // not a loss token: its old/ref/advantage values are ignored
    bool clipped = false;
    const TokenTerm pg = ppo_clipped_surrogate(logprob[r], old_[i], adv_[i], config_, &clipped);
    const double w_is = is_.empty() ? 1.0 : static_cast<double>(is_[i]);  // detached
    double dlogp = w_is * pg.dlogp;
    pg_ += w * w_is * pg.value;
    if (has_kl()) {  // reported whenever the reference is known, whatever its weight
      const TokenTerm kl = kl_penalty(config_.kl_type, logprob[r], ref_[i]);
      kl_ += w * kl.value;
      dlogp += config_.kl_coef * kl.dlogp;
    }
    entropy_ += w * entropy[r];
    ppo_kl_sum_ += static_cast<double>(old_[i]) - logprob[r];
    clipped_ += clipped;
    tokens_++;
    coef[r] = static_cast<float>(-w * dlogp);  // the head's convention: dL/dlogp = -coef
    ent_coef[r] = static_cast<float>(-w * config_.entropy_coeff);
  }
}

void PpoObjective::reduce_sums(const std::function<void(double* sums, size_t n)>& sum) {
  // The counts are far below 2^53: exact as doubles.
  double x[] = {pg_, kl_, entropy_, ppo_kl_sum_, static_cast<double>(clipped_),
                static_cast<double>(tokens_)};
  sum(x, 6);
  pg_ = x[0];
  kl_ = x[1];
  entropy_ = x[2];
  ppo_kl_sum_ = x[3];
  clipped_ = static_cast<long>(x[4]);
  tokens_ = static_cast<long>(x[5]);
}

}  // namespace sr1
