// Products of a few rows by a weight matrix, out[N,OC] = inp[N,C] . w[OC,C]^T (+ bias), for
// the engine's decode steps of up to kGemvRows sequences. Such a product only streams the
// weights once, and what it costs is how many bytes are in flight: one warp per output
// feature reads that feature's weight row 16 bytes a lane (512 contiguous bytes a load), and
// every one of the N input rows is multiplied with it while it is in registers. cuBLASLt's
// kernels are tiled for many rows; with the BIAS epilogue its qkv projection (896 -> 1,152)
// took 32 us at one row on an H200, where its 2 MB of weights take under 1 us to read. Which
// of the two is faster at a few rows has not been measured yet, so Matmul::forward times both
// on a shape's first call and keeps the faster.
//
// fp32 accumulation; each row's sum is taken in the same order whatever N is, so a sequence's
// result does not depend on the other rows of its step. The product is rounded to bf16 before
// the bias is added, as Matmul::forward's bias kernel does after cuBLASLt.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"

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

template <int ROWS>
__global__ __launch_bounds__(32 * kWarps) void gemv_kernel(bf16* out, const bf16* inp,
                                                           const bf16* w, const bf16* bias,
                                                           int C, int OC) {
  const int j = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (j >= OC) return;  // the whole warp leaves together, before its shuffles
  const bf16* wr = w + static_cast<size_t>(j) * C;
  float acc[ROWS] = {};
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
  for (int m = 0; m < ROWS; m++) {
    const float sum = warp_sum(acc[m]);  // every lane holds it
    if (lane != m) continue;
    float v = __bfloat162float(__float2bfloat16_rn(sum));
    if (bias != nullptr) v += __bfloat162float(bias[j]);
    out[static_cast<size_t>(m) * OC + j] = __float2bfloat16_rn(v);
  }
}

template <int ROWS>
void launch(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int C, int OC,
            cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((OC + kWarps - 1) / kWarps);
  gemv_kernel<ROWS><<<blocks, 32 * kWarps, 0, stream>>>(out, inp, w, bias, C, OC);
}

}  // namespace

bool gemv_fits(const bf16* inp, const bf16* w, int N, int C) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return N >= 1 && N <= kGemvRows && C % kChunk == 0 && aligned16(inp) && aligned16(w);
}

void gemv(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C, int OC,
          cudaStream_t stream) {
  switch (N) {
    case 1: launch<1>(out, inp, w, bias, C, OC, stream); break;
    case 2: launch<2>(out, inp, w, bias, C, OC, stream); break;
    case 3: launch<3>(out, inp, w, bias, C, OC, stream); break;
    case 4: launch<4>(out, inp, w, bias, C, OC, stream); break;
    case 5: launch<5>(out, inp, w, bias, C, OC, stream); break;
    case 6: launch<6>(out, inp, w, bias, C, OC, stream); break;
    case 7: launch<7>(out, inp, w, bias, C, OC, stream); break;
    case 8: launch<8>(out, inp, w, bias, C, OC, stream); break;
    default: return;  // gemv_fits refuses other N
  }
  static_assert(kGemvRows == 8, "a case per row count");
  check_launch("gemv_kernel");
}

}  // namespace sr1::cuda
