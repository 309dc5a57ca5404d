// The optimiser's kernels over the fp32 master weights: the sum of squares of the gradient
// (for global-norm clipping), a gradient shard's accumulation and the AdamW step, as the CPU
// reference computes them.
#include <algorithm>
#include <cmath>

#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"

namespace sr1::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kSumBlocks = 1024;

// Blocks for a grid-stride loop over n elements; the cap only bounds the grid.
unsigned flat_blocks(size_t n, size_t cap) {
  return static_cast<unsigned>(std::min((n + kThreads - 1) / kThreads, cap));
}

// Each block writes the fp64 sum of squares of its grid-stride share to partials[blockIdx.x].
__global__ void sum_squares_kernel(const float* x, size_t n, double* partials) {
  __shared__ double reduce_buf[32];
  double s = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s, reduce_buf);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void accumulate_kernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] += src[i];
  }
}

// The CPU's per-element formula in the same order. Division and sqrt are the IEEE-rounded
// intrinsics so that --use_fast_math does not make the fp32 master weights drift from the
// reference.
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, size_t n,
                             AdamWParams a, float step_size, float bc2_sqrt, float decay) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float grad = g[i] * a.grad_scale;
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * grad;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    const float denom = __fdiv_rn(__fsqrt_rn(vi), bc2_sqrt) + a.eps;
    p[i] = p[i] * decay - __fdiv_rn(step_size * mi, denom);
  }
}

}  // namespace

size_t sum_squares_partials() { return kSumBlocks; }

double sum_squares(const float* x, size_t n, double* partials, cudaStream_t stream) {
  if (n == 0) return 0.0;
  const unsigned blocks = flat_blocks(n, kSumBlocks);
  sum_squares_kernel<<<blocks, kThreads, 0, stream>>>(x, n, partials);
  check_launch("sum_squares");
  double host[kSumBlocks];
  check(cudaMemcpyAsync(host, partials, blocks * sizeof(double), cudaMemcpyDeviceToHost, stream),
        "copying the sum_squares partials");
  check(cudaStreamSynchronize(stream), "sum_squares");
  double s = 0;
  for (unsigned b = 0; b < blocks; b++) s += host[b];
  return s;
}

void accumulate(float* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  accumulate_kernel<<<flat_blocks(n, 65536), kThreads, 0, stream>>>(dst, src, n);
  check_launch("accumulate");
}

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& a,
                  cudaStream_t stream) {
  if (n == 0) return;
  // Bias corrections exactly as the CPU backend computes them (in double, then to float).
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), a.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), a.step);
  const float step_size = static_cast<float>(a.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - a.lr * a.weight_decay;
  adamw_kernel<<<flat_blocks(n, 65536), kThreads, 0, stream>>>(p, g, m, v, n, a, step_size,
                                                               bc2_sqrt, decay);
  check_launch("adamw_update");
}

}  // namespace sr1::cuda
