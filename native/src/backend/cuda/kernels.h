// Launchers of the CUDA backend's own kernels (one .cu file per group, named below). All
// take device pointers, queue work on `stream` and return at once, except where noted.
// Activations and compute weights are bf16; gradients of parameters, master weights,
// AdamW state and per-row statistics are fp32; arithmetic is fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace sr1::cuda {

using bf16 = __nv_bfloat16;

// ---- elementwise.cu ----
// out[N,C] = wte[ids[n]]
void embedding_forward(bf16* out, const int32_t* ids, const bf16* wte, int N, int C,
                       cudaStream_t stream);
// dwte[ids[n]] += dout[n] (fp32 accumulation; rows may share an id)
void embedding_backward(float* dwte, const bf16* dout, const int32_t* ids, int N, int C,
                        cudaStream_t stream);
// gu row = [gate (I) | up (I)]; out = silu(gate) * up; backward overwrites dgu
void swiglu_forward(bf16* out, const bf16* gu, int N, int I, cudaStream_t stream);
void swiglu_backward(bf16* dgu, const bf16* dout, const bf16* gu, int N, int I,
                     cudaStream_t stream);
// out = a + b (out may alias a)
void add(bf16* out, const bf16* a, const bf16* b, size_t n, cudaStream_t stream);
// x *= s
void scale(bf16* x, float s, size_t n, cudaStream_t stream);
// dst[r * ld_dst + c] = (or +=) src[r * ld_src + c], r < rows, c < cols (Backend::copy_columns)
void copy_columns(bf16* dst, int ld_dst, const bf16* src, int ld_src, int rows, int cols,
                  bool accumulate, cudaStream_t stream);
// out = 0.5 x (1 + erf(x / sqrt 2)), the exact GELU (out may alias inp)
void gelu_forward(bf16* out, const bf16* inp, size_t n, cudaStream_t stream);
// out[r] = in[rows[r]] / out[rows[r]] = in[r], rows of C elements
void gather_rows(bf16* out, const bf16* in, const int32_t* rows, int n, int C,
                 cudaStream_t stream);
void scatter_rows(bf16* out, const bf16* in, const int32_t* rows, int n, int C,
                  cudaStream_t stream);
// dst = round-to-nearest-even bf16 of src
void f32_to_bf16(bf16* dst, const float* src, size_t n, cudaStream_t stream);
// Where rope also stores each row's rotated keys and its values: the engine's paged cache
// (layout: PagedShape), row n at slot slots[n] (SEARCHR1_FUSED_DECODE=on; else kv_store
// after rope).
struct KvStore {
  bf16 *k, *v;
  const int32_t* slots;
  int block_size;
};
// Rotary embedding of the q and k heads of each fused qkv row at its position, in place;
// sign -1 rotates back (the backward pass). Angles as Hugging Face computes them:
// inv_freq = 1 / theta^(2j/hd) in fp32, angle = float(pos) * inv_freq, cos/sin of it.
// With `store`, each row's rotated keys and its values also go to the cache.
void rope(bf16* qkv, const int32_t* pos, const AttentionShape& s, float theta, float sign,
          cudaStream_t stream, const KvStore* store = nullptr);

// ---- gemv.cu: out[N,OC] = inp[N,C] . w[OC,C]^T (+ bias[OC], may be null) for a few rows ----
constexpr int kGemvRows = 8;
// N in 1..kGemvRows, C a multiple of 8, inp and w 16-byte aligned.
bool gemv_fits(const bf16* inp, const bf16* w, int N, int C);
void gemv(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C, int OC,
          cudaStream_t stream);
// act[N,I] = silu(gate) * up of the product with w[2I,C] (gate rows, then up rows), without
// writing the product; N, C and the pointers as gemv_fits (SEARCHR1_FUSED_DECODE=on).
void gemv_swiglu(bf16* act, const bf16* inp, const bf16* w, int N, int C, int I,
                 cudaStream_t stream);

// ---- rmsnorm.cu ----
void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* w, int N, int C,
                     float eps, cudaStream_t stream);
// sum = a + b (rounded to bf16, as add), then out = rmsnorm_forward of sum; sum may alias a
// (one kernel, SEARCHR1_FUSED_DECODE=on; else the backend runs add and rmsnorm_forward)
void add_rmsnorm_forward(bf16* sum, bf16* out, float* rstd, const bf16* a, const bf16* b,
                         const bf16* w, int N, int C, float eps, cudaStream_t stream);
// dinp += ..., dw += ... (fp32)
void rmsnorm_backward(bf16* dinp, float* dw, const bf16* dout, const bf16* inp, const bf16* w,
                      const float* rstd, int N, int C, cudaStream_t stream);

// ---- layernorm.cu: the encoder's LayerNorm, forward only (out may alias inp) ----
void layernorm_forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C,
                       float eps, cudaStream_t stream);

// ---- logprob.cu: the language-model head's softmax over the vocabulary ----
void logprob_forward(float* logprob, float* entropy, const bf16* logits,
                     const int32_t* targets, int n, int V, cudaStream_t stream);
// ent_coef may be null (no entropy term)
void logprob_backward(bf16* logits, const int32_t* targets, const float* coef,
                      const float* ent_coef, int n, int V,
                      cudaStream_t stream);

// ---- sampling.cu: the inference engine's next tokens (Backend::sample_tokens), with out and
// rows in device memory, and a scratch of sample_tokens_scratch(n) bytes ----
size_t sample_tokens_scratch(int n);
void sample_tokens(TokenDraw* out, const bf16* logits, const SampleRow* rows, int n, int V,
                   void* scratch, cudaStream_t stream);

// ---- optimizer.cu ----
// Sum of squares of x in fp64 (partials per block, then one block). `partials` must hold
// sum_squares_partials() doubles. Synchronises the stream and returns the host value.
size_t sum_squares_partials();
double sum_squares(const float* x, size_t n, double* partials, cudaStream_t stream);
// dst += src
void accumulate(float* dst, const float* src, size_t n, cudaStream_t stream);
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& a,
                  cudaStream_t stream);

// ---- attention.cu: flash-style GQA attention (no T x T matrix in memory) over the spans of
// packed rows; causal, or bidirectional (forward only) when !s.causal ----
// Head dims the kernels are built for: 16, 32, 64 and 128. The one predicate of the CUDA
// attention, the engine's paged_attention included; the backend refuses other head dims
// with one message (CudaBackend::require_head_dim).
bool attention_supports(int head_dim);
// Their device scratch: attention_forward_scratch and attention_backward_scratch
// (backend/backend.h; the same buffer may serve both).
// mma: attention_mma.cu's kernels (FlashAttention-2's arrangement; SEARCHR1_ATTENTION=mma,
// not yet run on a GPU); else the WMMA ones of attention.cu (the default, which ran on the
// H200).
void attention_forward(bf16* out, float* lse, const bf16* qkv, const int32_t* key_mask,
                       const AttentionShape& s, void* scratch, bool mma, cudaStream_t stream);
void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, const int32_t* key_mask, const AttentionShape& s,
                        void* scratch, bool mma, cudaStream_t stream);

// ---- paged.cu: the inference engine's paged KV cache (layout: PagedShape); head dims as
// attention_supports ----
// Copies the k and v heads of each fused qkv row (after rope) to the cache at slots[r].
void kv_store(bf16* k, bf16* v, const bf16* qkv, const int32_t* slots, const PagedShape& s,
              cudaStream_t stream);
void paged_attention(bf16* out, const bf16* qkv, const bf16* k, const bf16* v,
                     const int32_t* block_tables, const int32_t* seq, const int32_t* pos,
                     const PagedShape& s, cudaStream_t stream);

// Throws sr1::Error naming `what` when the last launch or call failed.
void check(cudaError_t status, const char* what);
void check_launch(const char* kernel);

}  // namespace sr1::cuda
