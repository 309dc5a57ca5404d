// AdamW over the model's flat parameter buffer (PyTorch's torch.optim.AdamW: decoupled
// weight decay applied first, bias-corrected moments), with global grad-norm clipping as
// torch.nn.utils.clip_grad_norm_ does it. On the device, or on the host (a learner's
// optimizer_offload, train/learner.h): the moments in host memory and the step run there by
// the CPU backend's own arithmetic (backend/cpu_adamw.h), as DeepSpeed's ZeRO-Offload steps
// its DeepSpeedCPUAdam (deepspeed/runtime/zero/stage_1_and_2.py, cpu_offload).
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/host_buffer.h"

namespace sr1 {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  float max_grad_norm = 1.0f;  // <= 0: no clipping
};

class AdamW {
 public:
  // `on_host`: the moments live in host memory (Backend::alloc_host), and step() takes
  // parameters and gradients in host memory too.
  AdamW(Backend& backend, size_t n, AdamWConfig config, bool on_host = false);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update at learning rate `lr`; returns the gradient norm before clipping.
  double step(float* params, const float* grads, float lr);
  // The same with the norm given: that of the whole gradient, of which `grads` is one rank's
  // shard (a ZeRO learner sums the shards' squares over the ranks). `updated(begin, end)` is
  // called once the parameters [begin, end) hold their new values: on the host after each
  // piece of kHostPiece values, so that the caller's copy of a piece to the device overlaps
  // the arithmetic of the next (DeepSpeed's cpu_adam step with its copy, adam_update_copy);
  // on the device once, for all n.
  using Updated = std::function<void(size_t begin, size_t end)>;
  void step(float* params, const float* grads, float lr, double norm,
            const Updated& updated = nullptr);
  static constexpr size_t kHostPiece = size_t{1} << 24;  // 64 MiB of fp32 parameters
  // The squared norm of n gradient values, summed where the step runs.
  double sum_squares(const float* grads) const;

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
  // The moments (n values each, on the device or, on_host(), in host memory), for a ZeRO
  // learner to gather.
  const float* m() const { return m_; }
  const float* v() const { return v_; }
  bool on_host() const { return !host_.empty(); }
  void restore(const State& state);

 private:
  Backend& be_;
  size_t n_;
  AdamWConfig config_;
  HostBuffer host_;  // on the host: m, then v
  float* m_;
  float* v_;
  int steps_ = 0;
};

}  // namespace sr1
