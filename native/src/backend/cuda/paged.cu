// The inference engine's paged KV cache on the GPU: storing each new row's keys and values
// into its cache slot (kv_store; with SEARCHR1_FUSED_DECODE=on, rope in elementwise.cu stores
// them instead), and decode/prefill attention over a sequence's cached blocks (a block of
// warps per (row, query head), online softmax over tiles of keys, fp32 arithmetic).
// Layouts as PagedShape in backend.h; the CPU twin is in cpu_backend.cpp.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"

namespace sr1::cuda {
namespace {

// Lane l of a warp holds dimensions l, l+32, ... of the output: up to 128, the largest head
// dim the backend admits (attention_supports: 16 to 128).
constexpr int kMaxDimsPerLane = 4;
constexpr int kMaxHeadDim = 32 * kMaxDimsPerLane;
static_assert(kMaxHeadDim >= 128, "paged attention must cover attention_supports");
// Warps of one (row, head); each takes tiles of 32 keys in turn, one key per lane.
constexpr int kWarps = 4;
constexpr int kTile = 32;

// One thread per element of a row's k and v heads: copied to the row's slot. The kernel that
// ran on the H200 (docs/gpu-status.md), kept while the fused store in rope is opt-in.
__global__ void kv_store_kernel(bf16* k, bf16* v, const bf16* qkv, const int32_t* slots,
                                PagedShape s) {
  const size_t per_row = static_cast<size_t>(s.num_kv_heads) * s.head_dim;
  const size_t total = per_row * s.rows;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / per_row);
    const int g = static_cast<int>(i % per_row) / s.head_dim;
    const int d = static_cast<int>(i % s.head_dim);
    const bf16* row = qkv + static_cast<size_t>(r) * s.qkv_dim();
    const size_t at = s.cache_offset(slots[r] / s.block_size, g, slots[r] % s.block_size) + d;
    k[at] = row[(s.num_heads + g) * s.head_dim + d];
    v[at] = row[(s.num_heads + s.num_kv_heads + g) * s.head_dim + d];
  }
}

// q . k over head_dim (a multiple of 8): k read 16 bytes at a time, q (scaled) from shared
// memory, where every lane reads the same address.
__device__ float dot_key(const float* q, const bf16* k, int hd) {
  float dot = 0.0f;
  for (int d = 0; d < hd; d += 8) {
    const int4 raw = *reinterpret_cast<const int4*>(k + d);
    __nv_bfloat162 pairs[4];
    memcpy(pairs, &raw, sizeof raw);  // not a bf16* into the int4 (strict aliasing)
    for (int i = 0; i < 4; i++) {
      const float2 f = __bfloat1622float2(pairs[i]);
      dot += q[d + 2 * i] * f.x + q[d + 2 * i + 1] * f.y;
    }
  }
  return dot;
}

// One block of kWarps warps per (row, query head). Warp w takes the tiles of 32 keys w,
// w + kWarps, ...: each lane computes one key's score on its own, so the warp has 32 keys'
// loads in flight at once (a warp that walked the keys one by one waited on each load in
// turn: 115 us a layer at one row and ~190 keys on an H200); then the tile's online-softmax
// update and its weighted sum of V, lane l owning output dimensions l, l+32, .... The
// warps' partial results (max, sum of exp, accumulator) are merged at the end. fp32
// throughout, as the CPU twin (cpu_backend.cpp).
__global__ __launch_bounds__(32 * kWarps) void paged_attention_kernel(
    bf16* out, const bf16* qkv, const bf16* kc, const bf16* vc, const int32_t* block_tables,
    const int32_t* seq, const int32_t* pos, PagedShape s) {
  __shared__ float q_s[kMaxHeadDim];
  __shared__ float max_s[kWarps], sum_s[kWarps];
  __shared__ float acc_s[kWarps][kMaxHeadDim];
  const int r = blockIdx.x / s.num_heads, h = blockIdx.x % s.num_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hd = s.head_dim, g = h / (s.num_heads / s.num_kv_heads);
  const float scale = rsqrtf(static_cast<float>(hd));
  const bf16* q = qkv + static_cast<size_t>(r) * s.qkv_dim() + h * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) q_s[d] = __bfloat162float(q[d]) * scale;
  __syncthreads();

  const int32_t* table = block_tables + static_cast<size_t>(seq[r]) * s.max_blocks;
  const int keys = pos[r] + 1;
  const auto key_at = [&](int j) {
    return s.cache_offset(table[j / s.block_size], g, j % s.block_size);
  };
  float m = -INFINITY, l = 0.0f, acc[kMaxDimsPerLane] = {};
  for (int t0 = warp * kTile; t0 < keys; t0 += kWarps * kTile) {
    const int j = t0 + lane;
    const float score = j < keys ? dot_key(q_s, kc + key_at(j), hd) : -INFINITY;
    const float m_new = fmaxf(m, warp_max(score));  // finite: key t0 exists
    const float p = j < keys ? expf(score - m_new) : 0.0f;
    const float rescale = expf(m - m_new);
    l = l * rescale + warp_sum(p);
    for (int i = 0; i < kMaxDimsPerLane; i++) acc[i] *= rescale;
    const int n = min(kTile, keys - t0);
#pragma unroll 4
    for (int jj = 0; jj < n; jj++) {
      const float pj = __shfl_sync(kFullMask, p, jj);
      const bf16* v = vc + key_at(t0 + jj);
      for (int i = 0; i < kMaxDimsPerLane; i++) {
        const int d = lane + 32 * i;
        if (d < hd) acc[i] += pj * __bfloat162float(v[d]);
      }
    }
    m = m_new;
  }

  if (lane == 0) {
    max_s[warp] = m;
    sum_s[warp] = l;
  }
  for (int i = 0; i < kMaxDimsPerLane; i++) {
    const int d = lane + 32 * i;
    if (d < hd) acc_s[warp][d] = acc[i];
  }
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < kWarps; w++) m_all = fmaxf(m_all, max_s[w]);
  float l_all = 0.0f;
  for (int w = 0; w < kWarps; w++) l_all += sum_s[w] * expf(max_s[w] - m_all);  // idle: 0
  bf16* o = out + (static_cast<size_t>(r) * s.num_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; w++) sum += acc_s[w][d] * expf(max_s[w] - m_all);
    o[d] = __float2bfloat16(sum / l_all);
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
  const size_t blocks = static_cast<size_t>(s.rows) * s.num_heads;
  if (blocks == 0) return;
  paged_attention_kernel<<<static_cast<unsigned>(blocks), 32 * kWarps, 0, stream>>>(
      out, qkv, k, v, block_tables, seq, pos, s);
  check_launch("paged_attention");
}

}  // namespace sr1::cuda
