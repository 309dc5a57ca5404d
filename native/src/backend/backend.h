// The per-layer operations of the model, in the style of llm.c: explicit forward and
// backward functions over flat buffers. The model code (model/qwen2.cpp) is written once
// against this interface; each device (CPU now, CUDA next) is one implementation of it,
// chosen at run time. Buffers returned by `alloc` live on the backend's device.
//
// Layouts are row-major. "Rows" are the B*T token positions of a batch. Weights are
// stored (out, in) like PyTorch nn.Linear. Backward functions accumulate (+=) into
// parameter gradients, so micro-batches can be summed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace sr1 {

// Shape of one attention call. The fused qkv row is [q (NH*hd) | k (NKV*hd) | v (NKV*hd)].
struct AttentionShape {
  int B = 0, T = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int qkv_dim() const { return (num_heads + 2 * num_kv_heads) * head_dim; }
};

struct AdamWParams {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  int step = 1;             // 1-based, for bias correction
  float grad_scale = 1.0f;  // multiplies the gradient first (global-norm clipping)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory (counts are elements) ----
  virtual float* alloc(size_t n) = 0;
  virtual int32_t* alloc_i32(size_t n) = 0;
  virtual void release(void* p) = 0;
  virtual void upload(float* dst, const float* src, size_t n) = 0;
  virtual void upload_i32(int32_t* dst, const int32_t* src, size_t n) = 0;
  virtual void download(float* dst, const float* src, size_t n) = 0;
  virtual void zero(float* p, size_t n) = 0;

  // ---- layers ----
  // out[N,C] = wte[ids[n]]
  virtual void embedding_forward(float* out, const int32_t* ids, const float* wte, int N,
                                 int C) = 0;
  // dwte[ids[n]] += dout[n]
  virtual void embedding_backward(float* dwte, const float* dout, const int32_t* ids, int N,
                                  int C) = 0;
  // out = w * inp * rstd, rstd = 1/sqrt(mean(inp^2) + eps), per row
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w,
                               int N, int C, float eps) = 0;
  // dinp += d(out)/d(inp) . dout ; dw += sum over rows
  virtual void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp,
                                const float* w, const float* rstd, int N, int C) = 0;
  // out[N,OC] = inp[N,C] . w[OC,C]^T (+ bias[OC])
  virtual void matmul_forward(float* out, const float* inp, const float* w, const float* bias,
                              int N, int C, int OC) = 0;
  // dinp[N,C] = (or +=, with accumulate) dout . w ; dw += dout^T . inp ; dbias += colsum
  // Any of dinp, dw, dbias may be null to skip it.
  virtual void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout,
                               const float* inp, const float* w, int N, int C, int OC,
                               bool accumulate_dinp) = 0;
  // Rotary embedding (rotate_half pairing j, j+hd/2) of the q and k parts of each fused
  // qkv row, in place, at the row's position. Backward applies the inverse rotation to the
  // gradient.
  virtual void rope_forward(float* qkv, const int32_t* pos, const AttentionShape& s,
                            float theta) = 0;
  virtual void rope_backward(float* dqkv, const int32_t* pos, const AttentionShape& s,
                             float theta) = 0;
  // Causal grouped-query attention with a key mask (key_mask[b*T+j] != 0: real token).
  // out[N, NH*hd]; lse[B, NH, T] keeps each row's log-sum-exp for the backward pass.
  // Query rows that can see no key produce zeros.
  virtual void attention_forward(float* out, float* lse, const float* qkv,
                                 const int32_t* key_mask, const AttentionShape& s) = 0;
  // dqkv[N, qkv_dim] = gradient of q, k, v (overwritten)
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* lse, const int32_t* key_mask,
                                  const AttentionShape& s) = 0;
  // gu row = [gate (I) | up (I)]; out[N,I] = silu(gate) * up
  virtual void swiglu_forward(float* out, const float* gu, int N, int I) = 0;
  virtual void swiglu_backward(float* dgu, const float* dout, const float* gu, int N, int I) = 0;
  // out = a + b (out may alias a)
  virtual void add(float* out, const float* a, const float* b, size_t n) = 0;

  // ---- language-model head, on the rows that predict a token ----
  // out[r] = in[rows[r]] for r < n
  virtual void gather_rows(float* out, const float* in, const int32_t* rows, int n, int C) = 0;
  // out[rows[r]] = in[r] (rows distinct)
  virtual void scatter_rows(float* out, const float* in, const int32_t* rows, int n, int C) = 0;
  // For each of n rows of logits[n,V]: logprob of targets[r] and entropy of the softmax.
  virtual void logprob_forward(float* logprob, float* entropy, const float* logits,
                               const int32_t* targets, int n, int V) = 0;
  // In place: logits[r] <- coef[r] * (softmax(logits[r]) - onehot(targets[r])), the
  // gradient of -coef[r] * logprob[r].
  virtual void logprob_backward(float* logits, const int32_t* targets, const float* coef,
                                int n, int V) = 0;

  // ---- optimiser ----
  virtual double sum_squares(const float* x, size_t n) = 0;
  // p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p), PyTorch AdamW order
  virtual void adamw_update(float* p, const float* g, float* m, float* v, size_t n,
                            const AdamWParams& a) = 0;
};

// "cpu" (the reference; always available). Throws sr1::UsageError for an unknown device.
std::unique_ptr<Backend> make_backend(const std::string& device);

}  // namespace sr1
