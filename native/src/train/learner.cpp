#include "train/learner.h"

#include <fstream>

#include "util/error.h"

namespace sr1 {

Learner::Learner(Qwen2Model& model, AdamWConfig adamw, LrSchedule schedule, uint64_t seed,
                 Comm& comm)
    : model_(model),
      comm_(comm),
      optimizer_(model.be(), model.param_buffer_size(), adamw),
      schedule_(schedule),
      rng_(seed) {
  schedule_.validate(OptionStyle::Field);
}

double Learner::step(float* lr, const std::string& what) {
  if (!comm_.local()) {
    model_.be().synchronize();  // the backward passes have written the gradients
    comm_.all_reduce_sum(model_.grads(), model_.param_buffer_size(), what + "'s gradients");
  }
  *lr = schedule_.at(optimizer_.steps());
  const double norm = optimizer_.step(model_.params(), model_.grads(), *lr);
  model_.params_changed();
  return norm;
}

void Learner::save_state(const std::string& dir, const std::string& name) const {
  optimizer_.save(dir + "/" + name + ".optimizer.safetensors");
  const std::string path = dir + "/" + name + ".rng.txt";
  std::ofstream rng(path);
  rng << rng_;
  if (!rng) throw Error(path + ": cannot write");
}

Learner::State Learner::read_state(const std::string& dir, const std::string& name) const {
  State state{optimizer_.read(dir + "/" + name + ".optimizer.safetensors"), {}};
  const std::string path = dir + "/" + name + ".rng.txt";
  std::ifstream in(path);
  if (!(in >> state.rng)) throw Error(path + ": missing or not a generator state");
  return state;
}

void Learner::restore_state(const State& state) {
  optimizer_.restore(state.optimizer);
  rng_ = state.rng;
}

}  // namespace sr1
