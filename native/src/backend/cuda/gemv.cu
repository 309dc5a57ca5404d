// Products of a few rows by a weight matrix, out[N,OC] = inp[N,C] . w[OC,C]^T (+ bias), for
// the engine's decode steps of up to kGemvRows sequences. Such a product only streams the
// weights once, and what it costs is how many bytes are in flight: one warp per output
// feature reads that feature's weight row 16 bytes a lane (512 contiguous bytes a load), and
// every one of the N input rows is multiplied with it while it is in registers. cuBLASLt's
// kernels are tiled for many rows; with the BIAS epilogue its qkv projection (896 -> 1,152)
// took 32 us at one row on an H200, where its 2 MB of weights take under 1 us to read. Which
// of the two is faster at a few rows has not been measured yet, and these kernels have not
// run on a GPU: cuBLASLt stays the default, SEARCHR1_GEMV=auto has Matmul::forward time both
// on a shape's first call and keep the faster, SEARCHR1_GEMV=on always runs these.
//
// fp32 accumulation; each row's sum is taken in the same order whatever N is, so a sequence's
// result does not depend on the other rows of its step. The product is rounded to bf16 before
// the bias is added, as Matmul::forward's bias kernel does after cuBLASLt. The gate/up
// product of an MLP may instead end in SwiGLU in the same kernel (Matmul::forward_swiglu):
// the product never reaches memory, and a decode step runs one kernel a layer fewer.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"
#include "util/error.h"

namespace sr1::cuda {
namespace {

constexpr int kWarps = 4;          // output features per block
constexpr int kChunk = 8;          // bf16 elements per 16-byte load
constexpr int kWarpChunk = 32 * kChunk;

// The 8 bf16 values of a 16-byte load, as floats.
__device__ __forceinline__ void unpack8(const int4& raw, float* out) {
  __nv_bfloat162 pairs[4];
  memcpy(pairs, &raw, sizeof raw);  // not a bf16* into the int4 (strict aliasing)
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// acc[m] = inp row m . w row (C elements), for m < ROWS, in every lane of the warp.
template <int ROWS>
__device__ __forceinline__ void dot_rows(float (&acc)[ROWS], const bf16* wr, const bf16* inp,
                                         int C, int lane) {
#pragma unroll
  for (int m = 0; m < ROWS; m++) acc[m] = 0.0f;
#pragma unroll 4
  for (int k = lane * kChunk; k < C; k += kWarpChunk) {
    float wf[kChunk], xf[kChunk];
    unpack8(__ldg(reinterpret_cast<const int4*>(wr + k)), wf);
#pragma unroll
    for (int m = 0; m < ROWS; m++) {
      unpack8(__ldg(reinterpret_cast<const int4*>(inp + static_cast<size_t>(m) * C + k)), xf);
#pragma unroll
      for (int i = 0; i < kChunk; i++) acc[m] += wf[i] * xf[i];
    }
  }
#pragma unroll
  for (int m = 0; m < ROWS; m++) acc[m] = warp_sum(acc[m]);
}

__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// One warp per output feature j; lane m writes row m's value.
template <int ROWS>
__global__ __launch_bounds__(32 * kWarps) void gemv_kernel(bf16* out, const bf16* inp,
                                                           const bf16* w, const bf16* bias,
                                                           int C, int OC) {
  const int j = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (j >= OC) return;  // the whole warp leaves together, before its shuffles
  float acc[ROWS];
  dot_rows(acc, w + static_cast<size_t>(j) * C, inp, C, lane);
#pragma unroll
  for (int m = 0; m < ROWS; m++) {
    if (lane != m) continue;
    float v = round_bf16(acc[m]);
    if (bias != nullptr) v += __bfloat162float(bias[j]);
    out[static_cast<size_t>(m) * OC + j] = __float2bfloat16_rn(v);
  }
}

// The gate/up product and SwiGLU in one: warp j takes weight rows j (gate) and I + j (up),
// and writes act[m, j] = silu(gate) * up, each product rounded to bf16 first as the separate
// product and swiglu_forward (elementwise.cu) would.
template <int ROWS>
__global__ __launch_bounds__(32 * kWarps) void gemv_swiglu_kernel(bf16* act, const bf16* inp,
                                                                  const bf16* w, int C, int I) {
  const int j = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (j >= I) return;
  float gate[ROWS], up[ROWS];
  dot_rows(gate, w + static_cast<size_t>(j) * C, inp, C, lane);
  dot_rows(up, w + static_cast<size_t>(I + j) * C, inp, C, lane);
#pragma unroll
  for (int m = 0; m < ROWS; m++) {
    if (lane != m) continue;
    const float g = round_bf16(gate[m]);
    act[static_cast<size_t>(m) * I + j] =
        __float2bfloat16_rn(g / (1.0f + expf(-g)) * round_bf16(up[m]));
  }
}

// f(std::integral_constant<int, N>()) for N in 1..kGemvRows: the kernels' row counts.
template <typename F>
void with_rows(int N, const F& f) {
  static_assert(kGemvRows == 8, "a case per row count");
  switch (N) {
    case 1: return f(std::integral_constant<int, 1>());
    case 2: return f(std::integral_constant<int, 2>());
    case 3: return f(std::integral_constant<int, 3>());
    case 4: return f(std::integral_constant<int, 4>());
    case 5: return f(std::integral_constant<int, 5>());
    case 6: return f(std::integral_constant<int, 6>());
    case 7: return f(std::integral_constant<int, 7>());
    case 8: return f(std::integral_constant<int, 8>());
    default: throw Error("gemv: " + std::to_string(N) + " rows (gemv_fits allows 1 to 8)");
  }
}

unsigned blocks_for(int features) {
  return static_cast<unsigned>((features + kWarps - 1) / kWarps);
}

}  // namespace

bool gemv_fits(const bf16* inp, const bf16* w, int N, int C) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return N >= 1 && N <= kGemvRows && C % kChunk == 0 && aligned16(inp) && aligned16(w);
}

void gemv(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C, int OC,
          cudaStream_t stream) {
  with_rows(N, [&](auto rows) {
    gemv_kernel<decltype(rows)::value><<<blocks_for(OC), 32 * kWarps, 0, stream>>>(out, inp, w,
                                                                                 bias, C, OC);
  });
  check_launch("gemv_kernel");
}

void gemv_swiglu(bf16* act, const bf16* inp, const bf16* w, int N, int C, int I,
                 cudaStream_t stream) {
  with_rows(N, [&](auto rows) {
    gemv_swiglu_kernel<decltype(rows)::value><<<blocks_for(I), 32 * kWarps, 0, stream>>>(
        act, inp, w, C, I);
  });
  check_launch("gemv_swiglu_kernel");
}

}  // namespace sr1::cuda
