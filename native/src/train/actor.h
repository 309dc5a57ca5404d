// The actor's update of one RL step (verl's dp_actor): the PPO objective (ppo_loss.h) over
// the mini-batches of the rollout batch, one optimizer step each. The objective's
// aggregation spans the whole mini-batch, so the micro-batch cut does not change the update.
#pragma once
#include <vector>

#include "model/batch.h"
#include "train/learner.h"
#include "train/minibatch.h"
#include "train/ppo_loss.h"

namespace sr1 {

// The per-token tensors of a rollout batch, [B*T] each, aligned as the batch.
// ref_log_probs may be empty (no KL term); rollout_is_weights may be empty (all 1).
struct RolloutTokens {
  std::vector<float> response_mask, old_log_probs, ref_log_probs, advantages;
  std::vector<float> rollout_is_weights;
};

struct ActorUpdateOptions {
  PpoConfig ppo;
  MiniBatching batching;
  RunOptions run;
};

struct ActorMetrics {
  // Means over the update's optimizer steps.
  double pg_loss = 0, pg_clipfrac = 0, ppo_kl = 0, entropy = 0, kl_loss = 0, grad_norm = 0;
  float lr = 0;      // the last step's learning rate
  long tokens = 0;   // loss tokens over all steps
  int steps = 0;     // optimizer steps taken
  int micro_batches = 0;
};

ActorMetrics update_actor(Learner& actor, const Batch& batch, const RolloutTokens& tokens,
                          const ActorUpdateOptions& opt);

}  // namespace sr1
