// A model being trained by an RL run (the actor, or the critic): its AdamW state, learning
// rate schedule and the generator that shuffles its mini-batches, which a checkpoint saves
// and restores so that a resumed run continues bit-exactly; and the communicator of its
// data-parallel ranks (dist/comm.h), over which each step first sums the ranks' gradients,
// so that every rank takes the same step (the generator, seeded alike, shuffles alike).
#pragma once
#include <cstdint>
#include <random>
#include <string>

#include "dist/comm.h"
#include "model/qwen2.h"
#include "train/adamw.h"
#include "train/schedule.h"

namespace sr1 {

class Learner {
 public:
  Learner(Qwen2Model& model, AdamWConfig adamw, LrSchedule schedule, uint64_t seed, Comm& comm);

  Qwen2Model& model() { return model_; }
  Comm& comm() { return comm_; }
  std::mt19937_64& rng() { return rng_; }
  int steps() const { return optimizer_.steps(); }
  // One optimizer step on the accumulated gradients, summed over the ranks, at the
  // schedule's rate; returns the gradient norm before clipping and sets *lr. `what` names the
  // update in a failed collective's message ("update_actor").
  double step(float* lr, const std::string& what);

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
  Comm& comm_;
  AdamW optimizer_;
  LrSchedule schedule_;
  std::mt19937_64 rng_;
};

}  // namespace sr1
