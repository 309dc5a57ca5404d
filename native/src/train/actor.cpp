#include "train/actor.h"

#include <algorithm>

namespace sr1 {

ActorMetrics update_actor(Learner& actor, const Batch& batch, const RolloutTokens& tokens,
                          const ActorUpdateOptions& opt) {
  ActorMetrics m;
  const int T = batch.T;
  Qwen2Model& model = actor.model();
  for_each_mini_batch(batch.B, opt.batching, actor.rng(), [&](const std::vector<int>& rows) {
    const Batch part = select_rows(batch, rows);
    PpoObjective objective(part, select_rows(tokens.response_mask, rows, T),
                           select_rows(tokens.old_log_probs, rows, T),
                           tokens.ref_log_probs.empty()
                               ? std::vector<float>{}
                               : select_rows(tokens.ref_log_probs, rows, T),
                           select_rows(tokens.advantages, rows, T), opt.ppo);
    model.zero_grad();
    const MiniBatching& mb = opt.batching;
    for (const MicroBatch& micro : micro_batches(part, mb.max_token_len, mb.remove_padding)) {
      objective.use_source(micro.source.data());
      model.backward(micro.batch, objective, opt.run);
      m.micro_batches++;
    }
    m.grad_norm += actor.step(&m.lr);
    m.pg_loss += objective.pg_loss();
    m.pg_clipfrac += objective.pg_clipfrac();
    m.ppo_kl += objective.ppo_kl();
    m.entropy += objective.entropy();
    m.kl_loss += objective.kl_loss();
    m.tokens += objective.tokens();
    m.steps++;
  });
  for (double* x : {&m.pg_loss, &m.pg_clipfrac, &m.ppo_kl, &m.entropy, &m.kl_loss, &m.grad_norm}) {
    *x /= std::max(1, m.steps);
  }
  return m;
}

}  // namespace sr1
