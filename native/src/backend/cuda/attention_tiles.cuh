// What attention.cu's WMMA kernels and attention_mma.cu's share: the units of the softmax,
// the shared-memory layout rule, the loads of a tile of rows, the per-row statistics a
// backward query tile loads, and the
// launch of a kernel whose tiles take more shared memory than a block gets by default.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "util/error.h"

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

// Copies rows row0 .. row0 + ROWS - 1 of one head (HD columns) into a shared tile with row
// stride LD, in 16-byte chunks. `src` points at row 0 of the sequence, at the head's first
// column, and `ld` is the global row stride. Rows at or past T are zero-filled.
template <int ROWS, int HD, int LD, int THREADS>
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* src, size_t ld, int row0,
                                          int T) {
  constexpr int kChunks = HD / 8;  // 8 bf16 per 16 bytes
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += THREADS) {
    const int r = idx / kChunks, c = idx % kChunks * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row0 + r < T) v = *reinterpret_cast<const uint4*>(src + (row0 + r) * ld + c);
    *reinterpret_cast<uint4*>(dst + r * LD + c) = v;
  }
}

// The same rows, also (or, with dst null, only) transposed: dst_t[c * LDT + r] is column c
// of row row0 + r (the mma kernels' V^T, Q^T and dO^T, the B operands taken along a row).
template <int ROWS, int HD, int LD, int LDT, int THREADS>
__device__ __forceinline__ void load_rows_transposed(bf16* dst, bf16* dst_t, const bf16* src,
                                                     size_t ld, int row0, int T) {
  for (int idx = threadIdx.x; idx < ROWS * (HD / 8); idx += THREADS) {
    const int r = idx / (HD / 8), c = idx % (HD / 8) * 8;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (row0 + r < T) raw = *reinterpret_cast<const uint4*>(src + (row0 + r) * ld + c);
    if (dst != nullptr) *reinterpret_cast<uint4*>(dst + r * LD + c) = raw;
    bf16 v8[8];
    memcpy(v8, &raw, sizeof v8);
#pragma unroll
    for (int e = 0; e < 8; ++e) dst_t[(c + e) * LDT + r] = v8[e];
  }
}

// The error for a head dim no kernel is built for (attention_supports).
[[noreturn]] inline void no_kernel_for(int head_dim) {
  throw Error("attention: no CUDA kernel for head_dim " + std::to_string(head_dim));
}

// f(std::integral_constant<int, HD>()) for the head dims the kernels are built for.
template <typename F>
void with_head_dim(int head_dim, const F& f) {
  switch (head_dim) {
    case 16: return f(std::integral_constant<int, 16>());
    case 32: return f(std::integral_constant<int, 32>());
    case 64: return f(std::integral_constant<int, 64>());
    case 128: return f(std::integral_constant<int, 128>());
    default: no_kernel_for(head_dim);
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
