// The inference engine's paged KV cache on the GPU: storing each new row's keys and values
// into its cache slot, and decode/prefill attention over a sequence's cached blocks (one
// warp per (row, query head), online softmax over the keys, fp32 arithmetic). Layouts as
// PagedShape in backend.h; the CPU twin is in cpu_backend.cpp.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/kernels.h"

namespace sr1::cuda {
namespace {

// Lane l of a warp holds dimensions l, l+32, ...: up to 256, more than the head dims the
// backend admits (attention_supports: 16 to 128). A head_dim below 32 leaves lanes idle;
// they add zeros to the warp's dot product.
constexpr int kMaxDimsPerLane = 8;
static_assert(32 * kMaxDimsPerLane >= 128, "paged attention must cover attention_supports");

__device__ int qkv_dim(const PagedShape& s) {
  return (s.num_heads + 2 * s.num_kv_heads) * s.head_dim;
}

__device__ size_t cache_offset(int block, int g, int off, const PagedShape& s) {
  return ((static_cast<size_t>(block) * s.num_kv_heads + g) * s.block_size + off) * s.head_dim;
}

__global__ void kv_store_kernel(bf16* k, bf16* v, const bf16* qkv, const int32_t* slots,
                                PagedShape s) {
  const size_t per_row = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
  const size_t total = per_row * s.rows;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / per_row);
    const int g = static_cast<int>(i % per_row) / s.head_dim;
    const int d = static_cast<int>(i % s.head_dim);
    const bf16* row = qkv + static_cast<size_t>(r) * qkv_dim(s);
    const size_t at = cache_offset(slots[r] / s.block_size, g, slots[r] % s.block_size, s) + d;
    k[at] = row[(s.num_heads + g) * s.head_dim + d];
    v[at] = row[(s.num_heads + s.num_kv_heads + g) * s.head_dim + d];
  }
}

// Warp w of the grid handles (row, head) = (w / num_heads, w % num_heads). Lane l holds the
// dimensions l, l+32, ... of q and of the output accumulator.
__global__ void paged_attention_kernel(bf16* out, const bf16* qkv, const bf16* kc,
                                       const bf16* vc, const int32_t* block_tables,
                                       const int32_t* seq, const int32_t* pos, PagedShape s) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= s.rows * s.num_heads) return;
  const int r = warp / s.num_heads, h = warp % s.num_heads;
  const int hd = s.head_dim, g = h / (s.num_heads / s.num_kv_heads);
  const float scale = rsqrtf(static_cast<float>(hd));
  const bf16* q = qkv + static_cast<size_t>(r) * qkv_dim(s) + h * hd;
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
  for (int i = 0; i < kMaxDimsPerLane; i++) {
    const int d = lane + 32 * i;
    qr[i] = d < hd ? __bfloat162float(q[d]) : 0.0f;
    acc[i] = 0.0f;
  }
  const int32_t* table = block_tables + static_cast<size_t>(seq[r]) * s.max_blocks;
  float m = -INFINITY, l = 0.0f;
  for (int j = 0; j <= pos[r]; j++) {
    const size_t at = cache_offset(table[j / s.block_size], g, j % s.block_size, s);
    float part = 0.0f;
    for (int i = 0; i < kMaxDimsPerLane; i++) {
      const int d = lane + 32 * i;
      if (d < hd) part += qr[i] * __bfloat162float(kc[at + d]);
    }
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    const float score = part * scale;
    const float m_new = fmaxf(m, score);
    const float rescale = expf(m - m_new), p = expf(score - m_new);
    l = l * rescale + p;
    for (int i = 0; i < kMaxDimsPerLane; i++) {
      const int d = lane + 32 * i;
      if (d < hd) acc[i] = acc[i] * rescale + p * __bfloat162float(vc[at + d]);
    }
    m = m_new;
  }
  bf16* o = out + (static_cast<size_t>(r) * s.num_heads + h) * hd;
  for (int i = 0; i < kMaxDimsPerLane; i++) {
    const int d = lane + 32 * i;
    if (d < hd) o[d] = __float2bfloat16(acc[i] / l);
  }
}

}  // namespace

void kv_store(bf16* k, bf16* v, const bf16* qkv, const int32_t* slots, const PagedShape& s,
              cudaStream_t stream) {
  const size_t total = static_cast<size_t>(s.rows) * s.num_kv_heads * s.head_dim;
  if (total == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<size_t>((total + 255) / 256, 65536));
  kv_store_kernel<<<blocks, 256, 0, stream>>>(k, v, qkv, slots, s);
  check_launch("kv_store");
}

void paged_attention(bf16* out, const bf16* qkv, const bf16* k, const bf16* v,
                     const int32_t* block_tables, const int32_t* seq, const int32_t* pos,
                     const PagedShape& s, cudaStream_t stream) {
  const size_t warps = static_cast<size_t>(s.rows) * s.num_heads;
  if (warps == 0) return;
  constexpr int kWarpsPerBlock = 4;
  const unsigned blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  paged_attention_kernel<<<blocks, 32 * kWarpsPerBlock, 0, stream>>>(out, qkv, k, v,
                                                                     block_tables, seq, pos, s);
  check_launch("paged_attention");
}

}  // namespace sr1::cuda
