#include "train/actor.h"

#include <algorithm>

#include "train/data_parallel.h"

namespace sr1 {

ActorMetrics update_actor(Learner& actor, const Batch& batch, const RolloutTokens& tokens,
                          const ActorUpdateOptions& opt) {
  ActorMetrics m;
  const int T = batch.T;
  // Checked on the whole batch first, so that an error names the batch's row.
  if (!tokens.rollout_is_weights.empty()) {
    check_is_weights(batch, tokens.response_mask, tokens.rollout_is_weights);
  }
  Qwen2Model& model = actor.model();
  for_each_mini_batch(batch.B, opt.batching, actor.rng(), [&](const std::vector<int>& rows) {
    const Batch part = select_rows(batch, rows);
    PpoObjective objective(part, select_rows(tokens.response_mask, rows, T),
                           select_rows(tokens.old_log_probs, rows, T),
                           tokens.ref_log_probs.empty()
                               ? std::vector<float>{}
                               : select_rows(tokens.ref_log_probs, rows, T),
                           select_rows(tokens.advantages, rows, T), opt.ppo,
                           tokens.rollout_is_weights.empty()
                               ? std::vector<float>{}
                               : select_rows(tokens.rollout_is_weights, rows, T));
    actor.zero_grad("update_actor");
    const MiniBatching& mb = opt.batching;
    // This rank's rows; the objective's weights span the whole mini-batch (data_parallel.h).
    const std::vector<MicroBatch> micros = rank_micro_batches(part, mb, actor.comm());
    actor.for_each_pass(static_cast<int>(micros.size()), "update_actor", [&](int i) {
      const MicroBatch& micro = micros[static_cast<size_t>(i)];
      objective.use_source(micro.source.data());
      model.backward(micro.batch, objective, opt.run);
      m.micro_batches++;
    });
    if (!actor.comm().local()) {
      objective.reduce_sums([&](double* x, size_t n) {
        actor.comm().all_reduce_sum_host(x, n, "update_actor's loss sums");
      });
    }
    m.grad_norm += actor.step(&m.lr, "update_actor");
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
  actor.end_update();  // ZeRO stage 2: no gradient memory between updates
  if (!actor.comm().local()) {  // all the ranks' forward-backward passes
    m.micro_batches = static_cast<int>(
        all_reduce_sum(actor.comm(), m.micro_batches, "update_actor's micro-batch count"));
  }
  return m;
}

}  // namespace sr1
