// --profile: a backend that runs every operation on another one and times each on the
// device (DeviceTimer: CUDA events on the GPU, the clock on the CPU), so a command can print
// where its device time went. Operations are grouped by name, and matmuls also by weight
// shape (C x OC), which tells the model's projections and its head apart.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "util/json.h"
#include "util/json.h"

namespace sr1 {

class ProfiledBackend final : public Backend {
 public:
  explicit ProfiledBackend(std::unique_ptr<Backend> inner);
  ~ProfiledBackend() override;

  // Device time of one kind of operation.
  struct OpTime {
    std::string op;
    long calls = 0;
    double ms = 0;
  };
  // The operations timed so far, largest total first.
  std::vector<OpTime> times() const;
  // Forgets the operations timed so far (model loading), so the table covers what follows.
  void restart();
  // times() as {"ops": [{"op", "calls", "ms"}, ...], "device_ms": their sum}, then restart():
  // the `profile` command of searchr1-trainer serve and of searchr1-engine.
  json::Value take_times();
  // Time per operation so far, largest first, as a table; `wall_ms` (the host's time over
  // the same work, when the caller measured it) adds the share of it the device was busy.
  std::string report(double wall_ms = 0) const;

  std::string name() const override { return inner_->name(); }
  void synchronize() override { inner_->synchronize(); }
  std::unique_ptr<DeviceTimer> timer() const override { return inner_->timer(); }
  size_t x_elem() const override { return inner_->x_elem(); }
  size_t peak_bytes() const override { return inner_->peak_bytes(); }
  size_t live_bytes() const override { return inner_->live_bytes(); }
  void reset_peak_bytes() override { inner_->reset_peak_bytes(); }
  size_t free_bytes() const override { return inner_->free_bytes(); }
  size_t total_bytes() const override { return inner_->total_bytes(); }
  float* alloc(size_t n) override { return inner_->alloc(n); }
  int32_t* alloc_i32(size_t n) override { return inner_->alloc_i32(n); }
  XPtr alloc_x(size_t n) override { return inner_->alloc_x(n); }
  void release(void* p) override { inner_->release(p); }
  void* alloc_host(size_t bytes) override { return inner_->alloc_host(bytes); }
  void release_host(void* p) override { inner_->release_host(p); }
  void require_head_dim(int head_dim) const override { inner_->require_head_dim(head_dim); }

  void upload(float* dst, const float* src, size_t n) override;
  void upload_i32(int32_t* dst, const int32_t* src, size_t n) override;
  void download(float* dst, const float* src, size_t n) override;
  void upload_bytes(void* dst, const void* src, size_t bytes) override;
  void download_bytes(void* dst, const void* src, size_t bytes) override;
  void zero(float* p, size_t n) override;
  void zero_x(XPtr p, size_t n) override;
  void to_x(XPtr dst, const float* src, size_t n) override;
  void download_x(float* dst, XPtr src, size_t n) override;
  void embedding_forward(XPtr out, const int32_t* ids, XPtr wte, int N, int C) override;
  void embedding_backward(float* dwte, XPtr dout, const int32_t* ids, int N, int C) override;
  void rmsnorm_forward(XPtr out, float* rstd, XPtr inp, XPtr w, int N, int C,
                       float eps) override;
  void rmsnorm_backward(XPtr dinp, float* dw, XPtr dout, XPtr inp, XPtr w, const float* rstd,
                        int N, int C) override;
  void matmul_forward(XPtr out, XPtr inp, XPtr w, XPtr bias, int N, int C, int OC) override;
  void matmul_backward(XPtr dinp, float* dw, float* dbias, XPtr dout, XPtr inp, XPtr w, int N,
                       int C, int OC, bool accumulate_dinp) override;
  void rope_forward(XPtr qkv, const int32_t* pos, const AttentionShape& s,
                    float theta) override;
  void rope_backward(XPtr dqkv, const int32_t* pos, const AttentionShape& s,
                     float theta) override;
  void attention_forward(XPtr out, float* lse, XPtr qkv, const int32_t* key_mask,
                         const AttentionShape& s) override;
  void attention_backward(XPtr dqkv, XPtr dout, XPtr qkv, XPtr out, const float* lse,
                          const int32_t* key_mask, const AttentionShape& s) override;
  void swiglu_forward(XPtr out, XPtr gu, int N, int I) override;
  void swiglu_backward(XPtr dgu, XPtr dout, XPtr gu, int N, int I) override;
  void matmul_swiglu_forward(XPtr act, XPtr gu, XPtr inp, XPtr w, int N, int C,
                             int I) override;
  void add(XPtr out, XPtr a, XPtr b, size_t n) override;
  void rope_kv_store(XPtr qkv, const int32_t* pos, XPtr k_cache, XPtr v_cache,
                     const int32_t* slots, const PagedShape& s, float theta) override;
  void add_rmsnorm_forward(XPtr sum, XPtr out, float* rstd, XPtr a, XPtr b, XPtr w, int N, int C,
                           float eps) override;
  void scale(XPtr x, float s, size_t n) override;
  void copy_columns(XPtr dst, int ld_dst, XPtr src, int ld_src, int rows, int cols,
                    bool accumulate) override;
  void layernorm_forward(XPtr out, XPtr inp, XPtr w, XPtr bias, int N, int C,
                         float eps) override;
  void gelu_forward(XPtr out, XPtr inp, size_t n) override;
  void paged_attention(XPtr out, XPtr qkv, XPtr k_cache, XPtr v_cache,
                       const int32_t* block_tables, const int32_t* seq, const int32_t* pos,
                       const PagedShape& s) override;
  void gather_rows(XPtr out, XPtr in, const int32_t* rows, int n, int C) override;
  void scatter_rows(XPtr out, XPtr in, const int32_t* rows, int n, int C) override;
  void logprob_forward(float* logprob, float* entropy, XPtr logits, const int32_t* targets,
                       int n, int V) override;
  void logprob_backward(XPtr logits, const int32_t* targets, const float* coef,
                        const float* ent_coef, int n, int V) override;
  void sample_tokens(TokenDraw* out, XPtr logits, const SampleRow* rows, int n,
                     int V) override;
  double sum_squares(const float* x, size_t n) override;
  void accumulate(float* dst, const float* src, size_t n) override;
  void adamw_update(float* p, const float* g, float* m, float* v, size_t n,
                    const AdamWParams& a) override;

 private:
  // Runs `op` between the timer's brackets and files it under `key`.
  template <typename Op>
  void timed(std::string key, Op&& op);
  // Reads the timer and adds what it returns to the totals.
  void collect() const;

  std::unique_ptr<Backend> inner_;
  std::unique_ptr<DeviceTimer> timer_;
  mutable std::vector<std::string> pending_;  // keys of the brackets not read yet
  mutable std::map<std::string, OpTime> totals_;
};

}  // namespace sr1
