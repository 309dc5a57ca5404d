// The actor's update of one RL step, as verl's dp_actor does it: the rollout batch is
// shuffled (with the run's seed) into mini-batches of ppo_mini_batch_size sequences, one
// optimizer step each, for ppo_epochs passes; each mini-batch's gradient is accumulated
// over micro-batches cut by a token budget. The objective's aggregation spans the whole
// mini-batch (PpoObjective), so the cut does not change the update.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model/batch.h"
#include "model/qwen2.h"
#include "train/adamw.h"
#include "train/ppo_loss.h"
#include "train/schedule.h"

namespace sr1 {

// The per-token tensors of a rollout batch, [B*T] each, aligned as the batch.
struct RolloutTokens {
  std::vector<float> response_mask, old_log_probs, ref_log_probs, advantages;
};

struct ActorUpdateOptions {
  PpoConfig ppo;
  int mini_batch_size = 0;  // sequences per optimizer step; 0 = the whole batch
  int epochs = 1;
  long max_token_len = 0;   // real tokens per micro-batch; 0 = the whole mini-batch
  bool shuffle = true;
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

// Consecutive rows [first, last) of each micro-batch: as many rows as fit in `budget` real
// tokens (at least one row); budget 0 = all rows in one.
std::vector<std::pair<int, int>> micro_batches(const Batch& batch, long budget);

class Actor {
 public:
  Actor(Qwen2Model& model, AdamWConfig adamw, LrSchedule schedule, uint64_t seed);

  ActorMetrics update(const Batch& batch, const RolloutTokens& tokens,
                      const ActorUpdateOptions& opt);

  int steps() const { return optimizer_.steps(); }
  // Optimizer moments, step count and the shuffling generator's state, in `dir`.
  void save_state(const std::string& dir) const;
  void load_state(const std::string& dir);

 private:
  Qwen2Model& model_;
  AdamW optimizer_;
  LrSchedule schedule_;
  std::mt19937_64 rng_;
};

}  // namespace sr1
