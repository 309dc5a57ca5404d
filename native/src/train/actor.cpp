#include "train/actor.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>

#include "util/error.h"

namespace sr1 {
namespace {

std::vector<float> select_rows(const std::vector<float>& x, const std::vector<int>& rows, int T) {
  std::vector<float> out;
  out.reserve(rows.size() * T);
  for (int r : rows) {
    out.insert(out.end(), x.begin() + static_cast<long>(r) * T,
               x.begin() + static_cast<long>(r + 1) * T);
  }
  return out;
}

Batch select_rows(const Batch& data, const std::vector<int>& rows) {
  Batch out;
  out.B = static_cast<int>(rows.size());
  out.T = data.T;
  for (int r : rows) {
    const Batch one = data.rows(r, r + 1);
    out.ids.insert(out.ids.end(), one.ids.begin(), one.ids.end());
    out.mask.insert(out.mask.end(), one.mask.begin(), one.mask.end());
    out.positions.insert(out.positions.end(), one.positions.begin(), one.positions.end());
  }
  return out;
}

}  // namespace

std::vector<std::pair<int, int>> micro_batches(const Batch& batch, long budget) {
  std::vector<std::pair<int, int>> out;
  int first = 0;
  long tokens = 0;
  for (int b = 0; b < batch.B; b++) {
    long real = 0;
    for (int t = 0; t < batch.T; t++) real += batch.mask[static_cast<size_t>(b) * batch.T + t];
    if (budget > 0 && b > first && tokens + real > budget) {
      out.emplace_back(first, b);
      first = b;
      tokens = 0;
    }
    tokens += real;
  }
  if (batch.B > first) out.emplace_back(first, batch.B);
  return out;
}

Actor::Actor(Qwen2Model& model, AdamWConfig adamw, LrSchedule schedule, uint64_t seed)
    : model_(model),
      optimizer_(model.be(), model.param_buffer_size(), adamw),
      schedule_(schedule),
      rng_(seed) {
  schedule_.validate();
}

ActorMetrics Actor::update(const Batch& batch, const RolloutTokens& tokens,
                           const ActorUpdateOptions& opt) {
  const int B = batch.B, T = batch.T;
  const int mini = opt.mini_batch_size > 0 ? std::min(opt.mini_batch_size, B) : B;
  if (B % mini != 0) {
    throw UsageError("ppo_mini_batch_size " + std::to_string(mini) +
                     " must divide the batch's " + std::to_string(B) + " sequences");
  }
  ActorMetrics m;
  std::vector<int> order(B);
  for (int e = 0; e < opt.epochs; e++) {
    std::iota(order.begin(), order.end(), 0);
    if (opt.shuffle) std::shuffle(order.begin(), order.end(), rng_);
    for (int m0 = 0; m0 < B; m0 += mini) {
      const std::vector<int> rows(order.begin() + m0, order.begin() + m0 + mini);
      const Batch part = select_rows(batch, rows);
      PpoObjective objective(part, select_rows(tokens.response_mask, rows, T),
                             select_rows(tokens.old_log_probs, rows, T),
                             select_rows(tokens.ref_log_probs, rows, T),
                             select_rows(tokens.advantages, rows, T), opt.ppo);
      model_.zero_grad();
      for (const auto& [first, last] : micro_batches(part, opt.max_token_len)) {
        objective.start_rows_at(first);
        model_.backward(part.rows(first, last), objective, opt.run);
        m.micro_batches++;
      }
      const float lr = schedule_.at(optimizer_.steps());
      m.grad_norm += optimizer_.step(model_.params(), model_.grads(), lr);
      model_.params_changed();
      m.lr = lr;
      m.pg_loss += objective.pg_loss();
      m.pg_clipfrac += objective.pg_clipfrac();
      m.ppo_kl += objective.ppo_kl();
      m.entropy += objective.entropy();
      m.kl_loss += objective.kl_loss();
      m.tokens += objective.tokens();
      m.steps++;
    }
  }
  for (double* x : {&m.pg_loss, &m.pg_clipfrac, &m.ppo_kl, &m.entropy, &m.kl_loss, &m.grad_norm}) {
    *x /= std::max(1, m.steps);
  }
  return m;
}

void Actor::save_state(const std::string& dir) const {
  optimizer_.save(dir + "/optimizer.safetensors");
  std::ofstream rng(dir + "/rng.txt");
  rng << rng_;
  if (!rng) throw Error(dir + "/rng.txt: cannot write");
}

void Actor::load_state(const std::string& dir) {
  optimizer_.load(dir + "/optimizer.safetensors");
  std::ifstream in(dir + "/rng.txt");
  std::mt19937_64 rng;
  if (!(in >> rng)) throw Error(dir + "/rng.txt: missing or not a generator state");
  rng_ = rng;
}

}  // namespace sr1
