// A model being trained by an RL run (the actor, or the critic): its AdamW state, learning
// rate schedule and the generator that shuffles its mini-batches, which a checkpoint saves
// and restores so that a resumed run continues bit-exactly.
#pragma once
#include <cstdint>
#include <random>
#include <string>

#include "model/qwen2.h"
#include "train/adamw.h"
#include "train/schedule.h"

namespace sr1 {

class Learner {
 public:
  Learner(Qwen2Model& model, AdamWConfig adamw, LrSchedule schedule, uint64_t seed);

  Qwen2Model& model() { return model_; }
  std::mt19937_64& rng() { return rng_; }
  int steps() const { return optimizer_.steps(); }
  // One optimizer step on the accumulated gradients at the schedule's rate; returns the
  // gradient norm before clipping and sets *lr.
  double step(float* lr);

  // `<dir>/<name>.optimizer.safetensors` and `<dir>/<name>.rng.txt`
  void save_state(const std::string& dir, const std::string& name) const;
  // Loading reads and checks everything first (read_state), so that a checkpoint can be
  // restored all or nothing; restore_state then cannot fail.
  struct State {
    AdamW::State optimizer;
    std::mt19937_64 rng;
  };
  State read_state(const std::string& dir, const std::string& name) const;
  void restore_state(const State& state);

 private:
  Qwen2Model& model_;
  AdamW optimizer_;
  LrSchedule schedule_;
  std::mt19937_64 rng_;
};

}  // namespace sr1
