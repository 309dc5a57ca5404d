// The softmax over the vocabulary of each predicted position: log-prob of the target and
// entropy (forward), and the gradient of -coef * logprob written over the logits
// (backward). One block per row; each thread folds its strided share of the row into an
// online (max, sum of exp, sum of exp * z) triple in a single read of the row, then the block
// combines the triples.
#include <cstdint>
#include <cstring>

#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"

namespace sr1::cuda {
namespace {

constexpr int kThreads = 1024;  // per row; __launch_bounds__ keeps registers within reach

// K consecutive logits as floats: K = 8 is one 128-bit access (p 16-byte aligned), K = 1 the
// scalar fallback for rows that are not.
template <int K>
__device__ __forceinline__ void load(const bf16* p, float (&z)[K]) {
  if constexpr (K == 8) {
    // memcpy, not a bf16* into the int4: that breaks strict aliasing, and a host compiler
    // was seen to read the bf16s before the int4 was stored. Both compile to register moves.
    const int4 raw = *reinterpret_cast<const int4*>(p);
    unsigned short h[8];
    memcpy(h, &raw, sizeof raw);
    for (int k = 0; k < 8; k++) z[k] = __bfloat162float(__ushort_as_bfloat16(h[k]));
  } else {
    z[0] = __bfloat162float(*p);
  }
}

template <int K>
__device__ __forceinline__ void store(bf16* p, const float (&z)[K]) {
  if constexpr (K == 8) {
    unsigned short h[8];
    for (int k = 0; k < 8; k++) h[k] = __bfloat16_as_ushort(__float2bfloat16_rn(z[k]));
    int4 raw;
    memcpy(&raw, h, sizeof raw);  // as in load
    *reinterpret_cast<int4*>(p) = raw;
  } else {
    *p = __float2bfloat16_rn(z[0]);
  }
}

struct RowStats {
  float lse;     // log sum_v exp(z_v)
  float mean_z;  // sum_v softmax_v * z_v
};

// Statistics of row z (V a multiple of K), the same in every thread of the block on return.
// The backward pass needs only lse; the extra multiply-add per element for mean_z costs
// nothing in this memory-bound loop.
template <int K>
__device__ RowStats row_stats(const bf16* z, int V) {
  __shared__ float reduce_buf[32];
  float m = -INFINITY, s = 0, t = 0;  // max so far, sum of exp(z - m), sum of exp(z - m) * z
  for (int i = threadIdx.x * K; i < V; i += blockDim.x * K) {
    float x[K];
    load<K>(z + i, x);
    float mx = x[0];
    for (int k = 1; k < K; k++) mx = fmaxf(mx, x[k]);
    if (mx > m) {  // rescale once per load, not per element
      const float scale = expf(m - mx);
      s *= scale;
      t *= scale;
      m = mx;
    }
    for (int k = 0; k < K; k++) {
      const float e = expf(x[k] - m);
      s += e;
      t += e * x[k];
    }
  }
  const float M = block_max(m, reduce_buf);
  // A thread that saw no element (V < K * blockDim.x) has m = -inf and s = t = 0.
  const float scale = m == -INFINITY ? 0.0f : expf(m - M);
  const float S = block_sum(s * scale, reduce_buf);
  const float T = block_sum(t * scale, reduce_buf);
  return RowStats{M + logf(S), T / S};
}

template <int K>
__global__ void __launch_bounds__(kThreads)
    logprob_forward_kernel(float* logprob, float* entropy, const bf16* logits,
                           const int32_t* targets, int V) {
  const int r = blockIdx.x;
  const bf16* z = logits + static_cast<size_t>(r) * V;
  const RowStats st = row_stats<K>(z, V);
  if (threadIdx.x == 0) {
    logprob[r] = __bfloat162float(z[targets[r]]) - st.lse;
    entropy[r] = st.lse - st.mean_z;
  }
}

// z <- coef * (softmax(z) - onehot(target)) - ent_coef * p * (log p + H), the target element
// in the same pass (H = lse - mean_z from the same statistics). The block reductions in
// row_stats are barriers, so every read of the row precedes the first write.
template <int K>
__global__ void __launch_bounds__(kThreads)
    logprob_backward_kernel(bf16* logits, const int32_t* targets, const float* coef,
                            const float* ent_coef, int V) {
  const int r = blockIdx.x;
  bf16* z = logits + static_cast<size_t>(r) * V;
  const RowStats st = row_stats<K>(z, V);
  const float lse = st.lse, h = st.lse - st.mean_z;
  const float c = coef[r], e = ent_coef != nullptr ? ent_coef[r] : 0.0f;
  const int target = targets[r];
  for (int i = threadIdx.x * K; i < V; i += blockDim.x * K) {
    float x[K];
    load<K>(z + i, x);
    for (int k = 0; k < K; k++) {
      const float logp = x[k] - lse, p = expf(logp);
      x[k] = (i + k == target ? c * (p - 1.0f) : c * p) - e * p * (logp + h);
    }
    store<K>(z + i, x);
  }
}

// Rows V elements apart stay 16-byte aligned when V is a multiple of 8 and the base is.
bool vectorisable(const bf16* logits, int V) {
  return V % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
}

}  // namespace

void logprob_forward(float* logprob, float* entropy, const bf16* logits,
                     const int32_t* targets, int n, int V, cudaStream_t stream) {
  if (n == 0) return;
  if (vectorisable(logits, V)) {
    logprob_forward_kernel<8><<<n, kThreads, 0, stream>>>(logprob, entropy, logits, targets, V);
  } else {
    logprob_forward_kernel<1><<<n, kThreads, 0, stream>>>(logprob, entropy, logits, targets, V);
  }
  check_launch("logprob_forward");
}

void logprob_backward(bf16* logits, const int32_t* targets, const float* coef,
                      const float* ent_coef, int n, int V, cudaStream_t stream) {
  if (n == 0) return;
  if (vectorisable(logits, V)) {
    logprob_backward_kernel<8><<<n, kThreads, 0, stream>>>(logits, targets, coef, ent_coef, V);
  } else {
    logprob_backward_kernel<1><<<n, kThreads, 0, stream>>>(logits, targets, coef, ent_coef, V);
  }
  check_launch("logprob_backward");
}

}  // namespace sr1::cuda
