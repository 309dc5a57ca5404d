#include "train/adamw.h"

#include <cmath>

namespace sr1 {

AdamW::AdamW(Backend& backend, size_t n, AdamWConfig config)
    : be_(backend), n_(n), config_(config), m_(backend.alloc(n)), v_(backend.alloc(n)) {
  be_.zero(m_, n_);
  be_.zero(v_, n_);
}

AdamW::~AdamW() {
  be_.release(m_);
  be_.release(v_);
}

double AdamW::step(float* params, const float* grads, float lr) {
  const double norm = std::sqrt(be_.sum_squares(grads, n_));
  AdamWParams a;
  a.lr = lr;
  a.beta1 = config_.beta1;
  a.beta2 = config_.beta2;
  a.eps = config_.eps;
  a.weight_decay = config_.weight_decay;
  a.step = ++steps_;
  if (config_.max_grad_norm > 0) {
    const double clip = config_.max_grad_norm / (norm + 1e-6);
    if (clip < 1.0) a.grad_scale = static_cast<float>(clip);
  }
  be_.adamw_update(params, grads, m_, v_, n_, a);
  return norm;
}

}  // namespace sr1
