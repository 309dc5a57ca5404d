// The critic's update of one PPO step (verl's dp_critic): the clipped value loss over the
// mini-batches of the rollout batch, one optimizer step each.
//
//   v_clip = clamp(v, v_old - cliprange_value, v_old + cliprange_value)
//   vf     = 0.5 * agg(max((v - R)^2, (v_clip - R)^2))
//
// over the response tokens — all of them: Search-R1 masks retrieved tokens out of the
// actor's losses only, and its critic loss uses the plain response mask. vf_clipfrac is the
// token share where the clipped branch is larger.
#pragma once
#include <vector>

#include "model/batch.h"
#include "train/learner.h"
#include "train/minibatch.h"
#include "train/ppo_loss.h"

namespace sr1 {

// The clipped value loss of one token and its derivative with respect to v.
TokenTerm clipped_value_loss(double v, double v_old, double ret, double cliprange,
                             bool* clipped);

// Per-token tensors of the batch, [B*T] each, aligned as values() (position t: the state
// before token t).
struct CriticTokens {
  std::vector<float> response_mask, values, returns;
};

struct CriticUpdateOptions {
  float cliprange_value = 0.5f;
  LossAgg agg = LossAgg::TokenMean;
  MiniBatching batching;
  RunOptions run;
};

struct CriticMetrics {
  double vf_loss = 0, vf_clipfrac = 0, vpred_mean = 0, grad_norm = 0;  // means over steps
  float lr = 0;
  int steps = 0, micro_batches = 0;
};

CriticMetrics update_critic(Learner& critic, const Batch& batch, const CriticTokens& tokens,
                            const CriticUpdateOptions& opt);

}  // namespace sr1
