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
  // The same with the norm given: that of the whole gradient, of which `grads` is one rank's
  // shard (a ZeRO learner sums the shards' squares over the ranks).
  void step(float* params, const float* grads, float lr, double norm);

  // Updates taken so far (bias correction's step count).
  int steps() const { return steps_; }
  // The moments and step count, as `adamw.m`, `adamw.v` (F32) and `adamw.step` (I64) of a
  // safetensors file, and back: a resumed run continues bit-exactly.
  struct State {
    std::vector<float> m, v;
    int steps = 0;
  };
  void save(const std::string& path) const;
  // The same file from host copies of the moments (a ZeRO learner's, gathered).
  static void write(const std::string& path, const std::vector<float>& m,
                    const std::vector<float>& v, int steps);
  // Reads (and checks) a saved state without applying it; throws sr1::Error naming the
  // file when its tensors do not match this optimizer. With `total`, the file holds the
  // state of `total` values (a whole model's, as every checkpoint does) and this optimizer
  // takes its n values from `offset` on (zeros past `total`): a ZeRO shard's.
  State read(const std::string& path) const;
  State read(const std::string& path, size_t offset, size_t total) const;
  size_t size() const { return n_; }
  // The moments on the device (n values each), for a ZeRO learner to gather.
  const float* m() const { return m_; }
  const float* v() const { return v_; }
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
