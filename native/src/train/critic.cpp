#include "train/critic.h"

#include <algorithm>

#include "train/data_parallel.h"

namespace sr1 {

TokenTerm clipped_value_loss(double v, double v_old, double ret, double cliprange,
                             bool* clipped) {
  const double v_clip = std::clamp(v, v_old - cliprange, v_old + cliprange);
  const double l1 = (v - ret) * (v - ret), l2 = (v_clip - ret) * (v_clip - ret);
  *clipped = l2 > l1;
  // The clipped branch only wins when the clamp holds, where it is constant in v.
  return *clipped ? TokenTerm{0.5 * l2, 0.0} : TokenTerm{0.5 * l1, v - ret};
}

CriticMetrics update_critic(Learner& critic, const Batch& batch, const CriticTokens& tokens,
                            const CriticUpdateOptions& opt) {
  CriticMetrics m;
  const int T = batch.T;
  Qwen2Model& model = critic.model();
  for_each_mini_batch(batch.B, opt.batching, critic.rng(), [&](const std::vector<int>& rows) {
    const Batch part = select_rows(batch, rows);
    const std::vector<float> mask = select_rows(tokens.response_mask, rows, T);
    const std::vector<float> v_old = select_rows(tokens.values, rows, T);
    const std::vector<float> ret = select_rows(tokens.returns, rows, T);
    std::vector<uint8_t> loss_token(mask.size());
    for (int b = 0; b < part.B; b++) {
      for (int t = 0; t < T; t++) {
        const size_t i = static_cast<size_t>(b) * T + t;
        loss_token[i] = part.predicted(b, t) && mask[i] != 0.0f;
      }
    }
    const std::vector<double> w = aggregation_weights(opt.agg, loss_token, part.B, T);
    double vf = 0, vsum = 0;
    long clipped = 0, n = 0;
    critic.zero_grad("update_critic");
    const MiniBatching& mb = opt.batching;
    // This rank's rows; the weights span the whole mini-batch (data_parallel.h).
    const std::vector<MicroBatch> micros = rank_micro_batches(part, mb, critic.comm());
    critic.for_each_pass(static_cast<int>(micros.size()), "update_critic", [&](int k) {
      const MicroBatch& micro = micros[static_cast<size_t>(k)];
      model.backward_values(micro.batch, opt.run, [&](const float* v, float* d) {
        for (size_t i = 0; i < micro.source.size(); i++) {
          if (micro.source[i] < 0) continue;
          const size_t g = static_cast<size_t>(micro.source[i]);
          if (w[g] == 0.0) continue;
          bool c = false;
          const TokenTerm term = clipped_value_loss(v[i], v_old[g], ret[g], opt.cliprange_value, &c);
          vf += w[g] * term.value;
          d[i] = static_cast<float>(w[g] * term.dlogp);
          vsum += v[i];
          clipped += c;
          n++;
        }
      });
      m.micro_batches++;
    });
    if (!critic.comm().local()) {
      double sums[] = {vf, vsum, static_cast<double>(clipped), static_cast<double>(n)};
      critic.comm().all_reduce_sum_host(sums, 4, "update_critic's loss sums");
      vf = sums[0];
      vsum = sums[1];
      clipped = static_cast<long>(sums[2]);
      n = static_cast<long>(sums[3]);
    }
    m.grad_norm += critic.step(&m.lr, "update_critic");
    m.vf_loss += vf;
    m.vf_clipfrac += n > 0 ? static_cast<double>(clipped) / n : 0.0;
    m.vpred_mean += n > 0 ? vsum / n : 0.0;
    m.steps++;
  });
  for (double* x : {&m.vf_loss, &m.vf_clipfrac, &m.vpred_mean, &m.grad_norm}) {
    *x /= std::max(1, m.steps);
  }
  critic.end_update();  // ZeRO stage 2: no gradient memory between updates
  if (!critic.comm().local()) {  // all the ranks' forward-backward passes
    m.micro_batches = static_cast<int>(
        all_reduce_sum(critic.comm(), m.micro_batches, "update_critic's micro-batch count"));
  }
  return m;
}

}  // namespace sr1
