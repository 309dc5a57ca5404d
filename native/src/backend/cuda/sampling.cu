// Next-token sampling on the GPU (Backend::sample_tokens): only each row's token and log-prob
// cross to the host, not its vocabulary of logits. One block per row, three reads of it:
// the arg max (lowest id among ties), the fp64 sum of exp(logit / T - max), then the
// inverse CDF in id order: each thread sums the probabilities of its contiguous slice, an
// exclusive scan over the block gives each slice the mass before it, and the slice where
// the running sum first passes the draw walks its tokens. The same arithmetic in fp64 as
// the CPU reference (backend/sample_row.cpp); only the order of the sums differs.
#include <climits>
#include <cmath>

#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"

namespace sr1::cuda {
namespace {

constexpr int kThreads = 1024;

struct ArgMax {
  float value;
  int index;
};

// The larger logit; the lower id between equals (the CPU's first maximum).
__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
}

__device__ ArgMax block_argmax(ArgMax v, float* values, int* indices) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) {
    v = better(v, ArgMax{__shfl_xor_sync(kFullMask, v.value, o),
                         __shfl_xor_sync(kFullMask, v.index, o)});
  }
  __syncthreads();
  if (lane == 0) {
    values[warp] = v.value;
    indices[warp] = v.index;
  }
  __syncthreads();
  v = lane < warps ? ArgMax{values[lane], indices[lane]} : ArgMax{-INFINITY, INT_MAX};
  for (int o = 16; o > 0; o >>= 1) {
    v = better(v, ArgMax{__shfl_xor_sync(kFullMask, v.value, o),
                         __shfl_xor_sync(kFullMask, v.index, o)});
  }
  return v;
}

// Σ of v over the threads before this one (thread order); `shared` holds 32 values.
__device__ double block_exclusive_sum(double v, double* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  double inclusive = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double t = __shfl_up_sync(kFullMask, inclusive, o);
    if (lane >= o) inclusive += t;
  }
  __syncthreads();
  if (lane == 31) shared[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    double w = lane < warps ? shared[lane] : 0.0;
    for (int o = 1; o < 32; o <<= 1) {
      const double t = __shfl_up_sync(kFullMask, w, o);
      if (lane >= o) w += t;
    }
    if (lane < warps) shared[lane] = w;  // the warps' inclusive totals
  }
  __syncthreads();
  return (warp > 0 ? shared[warp - 1] : 0.0) + inclusive - v;
}

__global__ __launch_bounds__(kThreads) void sample_kernel(TokenDraw* out, const bf16* logits,
                                                          const SampleRow* rows, int V) {
  __shared__ float max_values[32];
  __shared__ int max_indices[32];
  __shared__ double sums[32];
  __shared__ int chosen, last_positive;
  const SampleRow row = rows[blockIdx.x];
  if (row.temperature < 0) return;  // the host samples this row
  const bf16* z = logits + static_cast<size_t>(blockIdx.x) * V;
  const bool greedy = row.temperature == 0;
  const float inv_t = greedy ? 1.0f : 1.0f / row.temperature;
  const auto logit = [&](int v) { return static_cast<double>(__bfloat162float(z[v])) * inv_t; };

  ArgMax best{-INFINITY, INT_MAX};
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    best = better(best, ArgMax{__bfloat162float(z[v]), v});
  }
  best = block_argmax(best, max_values, max_indices);
  const double mx = static_cast<double>(best.value) * inv_t;
  double sum = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += exp(logit(v) - mx);
  const double log_sum = log(block_sum(sum, sums));
  const auto logprob = [&](int v) { return static_cast<float>(logit(v) - mx - log_sum); };
  if (greedy) {
    if (threadIdx.x == 0) out[blockIdx.x] = TokenDraw{best.index, logprob(best.index)};
    return;
  }

  // Thread t's slice [lo, hi) of the vocabulary, in id order.
  const int per = (V + blockDim.x - 1) / blockDim.x;
  const int lo = min(V, static_cast<int>(threadIdx.x) * per), hi = min(V, lo + per);
  double mass = 0;
  int last = -1;
  for (int v = lo; v < hi; v++) {
    const double p = exp(logit(v) - mx - log_sum);
    if (p > 0) {
      mass += p;
      last = v;
    }
  }
  const double before = block_exclusive_sum(mass, sums);
  if (threadIdx.x == 0) {
    chosen = INT_MAX;
    last_positive = -1;
  }
  __syncthreads();
  if (last >= 0) atomicMax(&last_positive, last);
  // Every slice whose running sum passes the draw offers its first token that does; the
  // lowest id wins (slices past the true one offer later ids).
  if (before + mass > row.uniform) {
    double acc = before;
    for (int v = lo; v < hi; v++) {
      const double p = exp(logit(v) - mx - log_sum);
      if (p <= 0) continue;
      acc += p;
      if (row.uniform < acc) {
        atomicMin(&chosen, v);
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // No slice passed it: the draw landed in the rounding gap below 1.
    const int token = chosen != INT_MAX ? chosen : max(last_positive, 0);
    out[blockIdx.x] = TokenDraw{token, logprob(token)};
  }
}

}  // namespace

void sample_tokens(TokenDraw* out, const bf16* logits, const SampleRow* rows, int n, int V,
                   cudaStream_t stream) {
  if (n == 0) return;
  sample_kernel<<<n, kThreads, 0, stream>>>(out, logits, rows, V);
  check_launch("sample_tokens");
}

}  // namespace sr1::cuda
