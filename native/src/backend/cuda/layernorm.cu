// LayerNorm forward (the BERT encoder's): out = (x - mean) * rstd * w + bias per row, with
// fp32 statistics over bf16 activations, as the CPU reference computes them.
#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"

namespace sr1::cuda {
namespace {

constexpr int kWarps = 8;  // rows per block, one warp each

// Two passes over the row (mean, then the mean of (x - mean)^2), not E[x^2] - mean^2, which
// loses digits when |mean| is large against the spread. Lane l handles columns l, l + 32, ...
// in every pass, so with out == inp each element is read only by the lane that writes it.
__global__ void layernorm_forward_kernel(bf16* out, const bf16* inp, const bf16* w,
                                         const bf16* bias, int N, int C, float eps) {
  const int row = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;  // the whole warp leaves together, before its shuffles
  const bf16* x = inp + static_cast<size_t>(row) * C;
  bf16* y = out + static_cast<size_t>(row) * C;
  float sum = 0;
  for (int c = lane; c < C; c += 32) sum += __bfloat162float(x[c]);
  const float mean = warp_sum(sum) / C;
  float ss = 0;
  for (int c = lane; c < C; c += 32) {
    const float d = __bfloat162float(x[c]) - mean;
    ss += d * d;
  }
  const float rstd = rsqrtf(warp_sum(ss) / C + eps);
  for (int c = lane; c < C; c += 32) {
    const float xhat = (__bfloat162float(x[c]) - mean) * rstd;
    y[c] = __float2bfloat16_rn(xhat * __bfloat162float(w[c]) + __bfloat162float(bias[c]));
  }
}

}  // namespace

void layernorm_forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C,
                       float eps, cudaStream_t stream) {
  if (N == 0) return;
  const int blocks = (N + kWarps - 1) / kWarps;
  layernorm_forward_kernel<<<blocks, kWarps * 32, 0, stream>>>(out, inp, w, bias, N, C, eps);
  check_launch("layernorm_forward");
}

}  // namespace sr1::cuda
