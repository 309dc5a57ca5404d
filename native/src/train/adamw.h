// AdamW over the model's flat parameter buffer (PyTorch's torch.optim.AdamW: decoupled
// weight decay applied first, bias-corrected moments), with global grad-norm clipping as
// torch.nn.utils.clip_grad_norm_ does it.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace sr1 {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  float max_grad_norm = 1.0f;  // <= 0: no clipping
};

class AdamW {
 public:
  AdamW(Backend& backend, size_t n, AdamWConfig config);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update at learning rate `lr`; returns the gradient norm before clipping.
  double step(float* params, const float* grads, float lr);

  // Updates taken so far (bias correction's step count).
  int steps() const { return steps_; }
  // The moments and step count, as `adamw.m`, `adamw.v` (F32) and `adamw.step` (I64) of a
  // safetensors file, and back: a resumed run continues bit-exactly.
  struct State {
    std::vector<float> m, v;
    int steps = 0;
  };
  void save(const std::string& path) const;
  // Reads (and checks) a saved state without applying it; throws sr1::Error naming the
  // file when its tensors do not match this optimizer.
  State read(const std::string& path) const;
  void restore(const State& state);

 private:
  Backend& be_;
  size_t n_;
  AdamWConfig config_;
  float* m_;
  float* v_;
  int steps_ = 0;
};

}  // namespace sr1
