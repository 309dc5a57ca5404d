// What attention.cu's WMMA kernels and attention_mma.cu's share: the units of the softmax,
// the shared-memory layout rule, the per-row statistics a backward query tile loads, and the
// launch of a kernel whose tiles take more shared memory than a block gets by default.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace sr1::cuda {

// Scores are kept in log2 units (scaled by log2(e)) so the exponentials are exp2f; lse is
// stored in natural-log units, as the CPU reference defines it.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Regions of shared memory start on 128-byte boundaries (WMMA pointers need 32).
constexpr size_t align128(size_t bytes) { return (bytes + 127) / 128 * 128; }

// The backward's per-row values of query rows q0 .. q0 + ROWS - 1 of head h: lse (in log2
// units), delta, and the row's span (-2 past T, a span no key has: the row sees nothing).
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_query_stats(float* lse2, float* delta, int* span,
                                                 const float* row_lse, const float* row_delta,
                                                 const int32_t* span_begin, int q0, int T) {
  for (int r = threadIdx.x; r < ROWS; r += THREADS) {
    const bool in = q0 + r < T;
    lse2[r] = in ? row_lse[q0 + r] * kLog2e : 0.0f;
    delta[r] = in ? row_delta[q0 + r] : 0.0f;
    span[r] = in ? span_begin[q0 + r] : -2;
  }
}

// kernel<<<grid, threads, smem, stream>>>(args...), after letting it have `smem` bytes.
template <typename... Params, typename... Args>
void launch_tiles(void (*kernel)(Params...), dim3 grid, int threads, size_t smem,
                  cudaStream_t stream, const char* what, Args... args) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        what);
  kernel<<<grid, threads, smem, stream>>>(args...);
  check_launch(what);
}

}  // namespace sr1::cuda
