// RMSNorm forward (alone, or after a residual add: add_rmsnorm_forward, the engine's with
// SEARCHR1_FUSED_DECODE=on) and backward: out = w * (x * rstd), rstd = 1/sqrt(mean(x^2) + eps)
// per row, with fp32 statistics over bf16 activations.
#include <algorithm>

#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"

namespace sr1::cuda {
namespace {

constexpr int kForwardWarps = 8;  // rows per forward block, one warp each
constexpr int kBackwardThreads = 256;
constexpr int kBackwardMaxBlocks = 1024;  // enough to fill an H100 at 256 threads a block

// One warp per row. With RESIDUAL the row normalised is a + b, rounded to bf16 and written to
// `sum` first (as `add` would: sum may alias a, each element read by the thread that writes
// it); without, it is `a`.
template <bool RESIDUAL>
__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, bf16* sum, const bf16* a,
                                       const bf16* b, const bf16* w, int N, int C, float eps) {
  const int row = blockIdx.x * kForwardWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;  // the whole warp leaves together, before its shuffles
  const size_t off = static_cast<size_t>(row) * C;
  float ss = 0;
  for (int c = lane; c < C; c += 32) {
    float v = __bfloat162float(a[off + c]);
    if (RESIDUAL) {
      const bf16 s = __float2bfloat16_rn(v + __bfloat162float(b[off + c]));
      sum[off + c] = s;
      v = __bfloat162float(s);
    }
    ss += v * v;
  }
  const float r = rsqrtf(warp_sum(ss) / C + eps);
  if (lane == 0) rstd[row] = r;
  const bf16* x = (RESIDUAL ? sum : a) + off;
  bf16* y = out + off;
  for (int c = lane; c < C; c += 32) {
    y[c] = __float2bfloat16_rn(__bfloat162float(w[c]) * (__bfloat162float(x[c]) * r));
  }
}

// Each block takes rows blockIdx.x, blockIdx.x + gridDim.x, ..., all its threads on one row
// at a time. Thread t always handles columns t, t + blockDim.x, ..., so it alone owns those
// entries of the block's dw partial in shared memory (no shared atomics), and the block adds
// its partial to dw with one atomic per column.
__global__ void rmsnorm_backward_kernel(bf16* dinp, float* dw, const bf16* dout, const bf16* inp,
                                        const bf16* w, const float* rstd, int N, int C) {
  extern __shared__ float dw_part[];  // [C]
  __shared__ float reduce_buf[32];
  for (int c = threadIdx.x; c < C; c += blockDim.x) dw_part[c] = 0.0f;
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const size_t off = static_cast<size_t>(row) * C;
    const bf16* x = inp + off;
    const bf16* g = dout + off;
    bf16* dx = dinp + off;
    const float r = rstd[row];
    float dot = 0;  // sum over c of (g*w) * xhat
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      dot += __bfloat162float(g[c]) * __bfloat162float(w[c]) * (__bfloat162float(x[c]) * r);
    }
    const float mean = block_sum(dot, reduce_buf) / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float xhat = __bfloat162float(x[c]) * r, gc = __bfloat162float(g[c]);
      dx[c] = __float2bfloat16_rn(__bfloat162float(dx[c]) +
                                  r * (gc * __bfloat162float(w[c]) - xhat * mean));
      dw_part[c] += gc * xhat;
    }
  }
  if (dw == nullptr) return;  // a frozen norm (a LoRA learner's base)
  for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(dw + c, dw_part[c]);
}

}  // namespace

void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, const bf16* w, int N, int C,
                     float eps, cudaStream_t stream) {
  if (N == 0) return;
  const int blocks = (N + kForwardWarps - 1) / kForwardWarps;
  rmsnorm_forward_kernel<false><<<blocks, kForwardWarps * 32, 0, stream>>>(
      out, rstd, nullptr, inp, nullptr, w, N, C, eps);
  check_launch("rmsnorm_forward");
}

void add_rmsnorm_forward(bf16* sum, bf16* out, float* rstd, const bf16* a, const bf16* b,
                         const bf16* w, int N, int C, float eps, cudaStream_t stream) {
  if (N == 0) return;
  const int blocks = (N + kForwardWarps - 1) / kForwardWarps;
  rmsnorm_forward_kernel<true><<<blocks, kForwardWarps * 32, 0, stream>>>(out, rstd, sum, a, b,
                                                                          w, N, C, eps);
  check_launch("add_rmsnorm_forward");
}

void rmsnorm_backward(bf16* dinp, float* dw, const bf16* dout, const bf16* inp, const bf16* w,
                      const float* rstd, int N, int C, cudaStream_t stream) {
  if (N == 0 || C == 0) return;
  const size_t smem = static_cast<size_t>(C) * sizeof(float);
  if (smem > 48 * 1024) {  // past the default limit (C > 12288) the kernel must opt in
    check(cudaFuncSetAttribute(rmsnorm_backward_kernel,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          "rmsnorm_backward shared memory");
  }
  const int blocks = std::min(N, kBackwardMaxBlocks);
  rmsnorm_backward_kernel<<<blocks, kBackwardThreads, smem, stream>>>(dinp, dw, dout, inp, w,
                                                                      rstd, N, C);
  check_launch("rmsnorm_backward");
}

}  // namespace sr1::cuda
