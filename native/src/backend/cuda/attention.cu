// Flash-style causal grouped-query attention on tensor cores: bf16 operands, fp32 accumulation,
// tiles of keys processed with an online softmax so no T x T matrix ever reaches global memory.
// Both passes run the kernels here (the ones that ran on the H200) unless SEARCHR1_ATTENTION=mma
// asks for attention_mma.cu's, which have not run on a GPU yet (docs/gpu-status.md).
// The forward kernel also runs bidirectionally (an encoder's attention: every query sees every
// unmasked key); the backward kernels are causal only.
//
// Matrix products use the WMMA API (16x16x16 bf16 fragments, fp32 accumulators) on tiles staged
// in shared memory. The layout of an accumulator fragment's elements across a warp is
// unspecified, so every per-row step (masking, softmax, rescaling) works on fp32 tiles that
// the fragments were stored to in shared memory, never on the fragments themselves.
//
// Tiles cover whole multiples of 16 rows; rows past the end of the sequence are zero-filled on
// load and treated as masked, so the products never read out of bounds.
//
// Scores are kept in log2 units (scaled by log2(e)) so the exponentials are exp2f; lse is
// stored in natural-log units, as the CPU reference defines it.
//
// A row may pack several sequences (key_mask holds sequence ids, see Backend::attention_forward).
// A first kernel finds each position's span [span_begin, span_end). Query i then sees key j when
// j is no padding, j's span is i's (span_begin[j] == span_begin[i]) and, if causal, j <= i; the
// kernels skip the tiles that lie wholly outside the spans of their rows.
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/attention_mma.h"
#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"
#include "util/error.h"

namespace sr1::cuda {
namespace {

namespace wmma = nvcuda::wmma;

// Dynamic shared memory budget of one block; sm_80 allows up to 163 KB.
constexpr size_t kMaxSmemBytes = 160 * 1024;

using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename Layout>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, Layout>;
template <typename Layout>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, Layout>;
using RowMajor = wmma::row_major;
// A row-major tile read column-major is its transpose (K^T, P^T, dS^T below).
using ColMajor = wmma::col_major;


// Row strides (in elements) of shared tiles are padded by 16 bytes so that consecutive rows
// start in different banks; they stay multiples of 16 bytes, as WMMA and uint4 access need.
template <int COLS>
constexpr int bf16_stride() { return COLS + 8; }
template <int COLS>
constexpr int f32_stride() { return COLS + 4; }

// acc += sum over k of A_k B_k, the 16x16 blocks A_k at a + k * a_step and B_k at
// b + k * b_step: the caller picks the layouts and steps that walk the shared dimension.
template <typename FA, typename FB, int KSTEPS>
__device__ __forceinline__ void mma_steps(FragC& acc, const bf16* a, int lda, int a_step,
                                          const bf16* b, int ldb, int b_step) {
  FA fa;
  FB fb;
#pragma unroll
  for (int k = 0; k < KSTEPS; ++k) {
    wmma::load_matrix_sync(fa, a + k * a_step, lda);
    wmma::load_matrix_sync(fb, b + k * b_step, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// ---- spans ----

__device__ __forceinline__ int highest_lane(unsigned bits) {
  return 31 - __clz(static_cast<int>(bits));
}
__device__ __forceinline__ int lowest_lane(unsigned bits) {
  return __ffs(static_cast<int>(bits)) - 1;
}

// Chunks of 32 positions a warp loads at once, so that it waits on one load latency per
// kSpanChunks chunks rather than per chunk.
constexpr int kSpanChunks = 8;

// span_begin and span_end [B, T] of key_mask [B, T]: one warp per row walks it in chunks of 32
// positions, one per lane, carrying from chunk to chunk what the positions before it decide.
__global__ void __launch_bounds__(32)
    attention_spans_kernel(int32_t* __restrict__ span_begin, int32_t* __restrict__ span_end,
                           const int32_t* __restrict__ key_mask, int T) {
  constexpr int kStep = 32 * kSpanChunks;
  const size_t row = static_cast<size_t>(blockIdx.x) * T;
  const int32_t* mask = key_mask + row;
  int32_t* sb = span_begin + row;
  int32_t* se = span_end + row;
  const int lane = threadIdx.x;
  const unsigned below = (1u << lane) - 1, at_or_below = kFullMask >> (31 - lane);

  // Left to right. A span starts at a nonzero id that differs from the last nonzero id before
  // it; a position's span begins at the last start at or before it, or at 0 (leading padding
  // belongs to the first span).
  int last_id = 0, begin = 0;  // over the chunks already done; last_id 0 while none was seen
  for (int c0 = 0; c0 < T; c0 += kStep) {
    int ids[kSpanChunks];
#pragma unroll
    for (int u = 0; u < kSpanChunks; ++u) {
      const int j = c0 + 32 * u + lane;
      ids[u] = j < T ? mask[j] : 0;
    }
#pragma unroll
    for (int u = 0; u < kSpanChunks; ++u) {
      const int c = c0 + 32 * u, id = ids[u];
      const unsigned nonzero = __ballot_sync(kFullMask, id != 0);
      const unsigned nonzero_below = nonzero & below;
      // The last nonzero id before this lane's position: in the chunk, or carried.
      const int src = nonzero_below != 0 ? highest_lane(nonzero_below) : 0;
      const int id_below = __shfl_sync(kFullMask, id, src);
      const int prev = nonzero_below != 0 ? id_below : last_id;
      const unsigned starts = __ballot_sync(kFullMask, id != 0 && prev != 0 && id != prev);
      const unsigned starts_here = starts & at_or_below;
      if (c + lane < T) sb[c + lane] = starts_here ? c + highest_lane(starts_here) : begin;
      if (nonzero != 0) last_id = __shfl_sync(kFullMask, id, highest_lane(nonzero));
      if (starts != 0) begin = c + highest_lane(starts);
    }
  }

  // Right to left. A position's span ends at the first start after it, or at T; j > 0 is a
  // start exactly when span_begin[j] == j. Each lane reads back only what it wrote itself.
  int end = T;  // the first start after the chunks still to do
  for (int c0 = (T - 1) / kStep * kStep; c0 >= 0; c0 -= kStep) {
    int begins[kSpanChunks];
#pragma unroll
    for (int u = 0; u < kSpanChunks; ++u) {
      const int j = c0 + 32 * u + lane;
      begins[u] = j < T ? sb[j] : -1;
    }
#pragma unroll
    for (int u = kSpanChunks - 1; u >= 0; --u) {
      const int c = c0 + 32 * u, j = c + lane;
      const unsigned starts = __ballot_sync(kFullMask, j > 0 && begins[u] == j);
      const unsigned starts_above = starts & ~at_or_below;
      if (j < T) se[j] = starts_above ? c + lowest_lane(starts_above) : end;
      if (starts != 0) end = c + lowest_lane(starts);
    }
  }
}

// ---- forward ----

// One block per (query tile, query head, sequence); each warp owns 16 query rows of the tile
// and keeps their output accumulator O (fp32, unnormalised) in shared memory.
template <int HD>
struct Fwd {
  static constexpr int BQ = 64, BK = 64;
  static constexpr int kWarps = BQ / 16, kThreads = 32 * kWarps;
  static constexpr int LDH = bf16_stride<HD>();  // Q, K, V tiles
  static constexpr int LDS = f32_stride<BK>();   // scores S
  static constexpr int LDP = bf16_stride<BK>();  // probabilities P
  static constexpr int LDO = f32_stride<HD>();   // output accumulator O
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + align128(sizeof(bf16) * BQ * LDH);
  static constexpr size_t kV = kK + align128(sizeof(bf16) * BK * LDH);
  static constexpr size_t kS = kV + align128(sizeof(bf16) * BK * LDH);
  static constexpr size_t kP = kS + align128(sizeof(float) * BQ * LDS);
  static constexpr size_t kO = kP + align128(sizeof(bf16) * BQ * LDP);
  static constexpr size_t kBytes = kO + align128(sizeof(float) * BQ * LDO);
  static_assert(BK % 32 == 0, "the softmax gives each lane BK / 32 columns of a row");
  static_assert(kBytes <= kMaxSmemBytes, "forward tiles exceed the shared memory budget");
};

template <int HD>
__global__ void __launch_bounds__(Fwd<HD>::kThreads)
    attention_forward_kernel(bf16* out, float* lse, const bf16* qkv, const int32_t* key_mask,
                             const int32_t* span_begin, const int32_t* span_end, int T, int NH,
                             int NKV, float scale_log2, bool causal) {
  using C = Fwd<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem + C::kQ);
  bf16* sK = reinterpret_cast<bf16*>(smem + C::kK);
  bf16* sV = reinterpret_cast<bf16*>(smem + C::kV);
  float* sS = reinterpret_cast<float*>(smem + C::kS);
  bf16* sP = reinterpret_cast<bf16*>(smem + C::kP);
  float* sO = reinterpret_cast<float*>(smem + C::kO);

  // Tiles further down the diagonal see more keys: launch them first so the grid's tail is
  // made of short blocks.
  const int q0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * C::BQ;
  const int h = blockIdx.y, b = blockIdx.z, g = h / (NH / NKV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = warp * 16;  // this warp's first row within the tile
  const size_t QKV = static_cast<size_t>(NH + 2 * NKV) * HD;
  const bf16* seq = qkv + static_cast<size_t>(b) * T * QKV;
  const int32_t* mask = key_mask + static_cast<size_t>(b) * T;
  const int32_t* lo = span_begin + static_cast<size_t>(b) * T;  // row b's span bounds
  const int32_t* hi = span_end + static_cast<size_t>(b) * T;

  load_rows<C::BQ, HD, C::LDH, C::kThreads>(sQ, seq + h * HD, QKV, q0, T);
  for (int idx = lane; idx < 16 * HD; idx += 32) sO[(r0 + idx / HD) * C::LDO + idx % HD] = 0.0f;
  // Running max (log2 units) and sum of exp2(score - max) of row r0 + lane, and the row's span
  // begin, held by lanes < 16. A row past T gets span -2, which no key has: it sees nothing.
  const int my_row = q0 + r0 + lane;
  const int my_span = lane < 16 && my_row < T ? lo[my_row] : -2;
  float row_max = -INFINITY, row_sum = 0.0f;

  // Only the keys of the tile's spans, which never go back along the row: from the first row's
  // span begin to the last row (causal) or the last row's span end.
  const int q_last = min(q0 + C::BQ, T) - 1;
  const int key_end = causal ? q_last + 1 : hi[q_last];
  for (int k0 = lo[q0] / C::BK * C::BK; k0 < key_end; k0 += C::BK) {
    __syncthreads();  // every warp is done with the previous K and V tiles (and Q is loaded)
    load_rows<C::BK, HD, C::LDH, C::kThreads>(sK, seq + (NH + g) * HD, QKV, k0, T);
    load_rows<C::BK, HD, C::LDH, C::kThreads>(sV, seq + (NH + NKV + g) * HD, QKV, k0, T);
    __syncthreads();

    // S = Q K^T for this warp's 16 rows.
    for (int nt = 0; nt < C::BK / 16; ++nt) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      mma_steps<FragA<RowMajor>, FragB<ColMajor>, HD / 16>(acc, sQ + r0 * C::LDH, C::LDH, 16,
                                                           sK + nt * 16 * C::LDH, C::LDH, 16);
      wmma::store_matrix_sync(sS + r0 * C::LDS + nt * 16, acc, C::LDS, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax, one row at a time across the warp; lane handles columns lane + 32 t.
    constexpr int kCols = C::BK / 32;
    int key_span[kCols];  // the span begin of each of the lane's keys; -1: padding or past T
#pragma unroll
    for (int t = 0; t < kCols; ++t) {
      const int j = k0 + lane + 32 * t;
      key_span[t] = j < T && mask[j] != 0 ? lo[j] : -1;
    }
    for (int r = 0; r < 16; ++r) {
      const int row = r0 + r, i = q0 + row;
      const int span = __shfl_sync(kFullMask, my_span, r);
      float s[kCols];
      float tile_max = -INFINITY;
#pragma unroll
      for (int t = 0; t < kCols; ++t) {
        const int j = k0 + lane + 32 * t;
        const bool valid = key_span[t] == span && (j <= i || !causal);
        s[t] = valid ? sS[row * C::LDS + lane + 32 * t] * scale_log2 : -INFINITY;
        tile_max = fmaxf(tile_max, s[t]);
      }
      const float m_old = __shfl_sync(kFullMask, row_max, r);
      const float m_new = fmaxf(m_old, warp_max(tile_max));
      // Until the row has seen a key m_new is -inf, and exp2(-inf - -inf) would be NaN:
      // measure from 0 instead (every p is 0 then, and so is the running O).
      const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < kCols; ++t) {
        const float p = exp2f(s[t] - m_ref);
        sum += p;
        sP[row * C::LDP + lane + 32 * t] = __float2bfloat16_rn(p);
      }
      sum = warp_sum(sum);
      const float alpha = exp2f(m_old - m_ref);  // rescales what was summed under m_old
      for (int c = lane; c < HD; c += 32) sO[row * C::LDO + c] *= alpha;
      if (lane == r) {
        row_max = m_new;
        row_sum = row_sum * alpha + sum;
      }
    }
    __syncwarp();

    // O += P V
    for (int nt = 0; nt < HD / 16; ++nt) {
      float* o = sO + r0 * C::LDO + nt * 16;
      FragC acc;
      wmma::load_matrix_sync(acc, o, C::LDO, wmma::mem_row_major);
      mma_steps<FragA<RowMajor>, FragB<RowMajor>, C::BK / 16>(
          acc, sP + r0 * C::LDP, C::LDP, 16, sV + nt * 16, C::LDH, 16 * C::LDH);
      wmma::store_matrix_sync(o, acc, C::LDO, wmma::mem_row_major);
    }
  }
  __syncwarp();

  // A row that saw no key has row_sum 0 (and O = 0): its lse is -inf and its output zeros.
  // lse is null when no backward pass follows.
  if (lse != nullptr && lane < 16 && my_row < T) {
    lse[(static_cast<size_t>(b) * NH + h) * T + my_row] =
        row_sum > 0.0f ? (row_max + log2f(row_sum)) * kLn2 : -INFINITY;
  }
  for (int r = 0; r < 16; ++r) {
    const int i = q0 + r0 + r;
    const float l = __shfl_sync(kFullMask, row_sum, r);
    if (i >= T) break;  // the same for the whole warp
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const float* o = sO + (r0 + r) * C::LDO;
    bf16* dst = out + (static_cast<size_t>(b) * T + i) * NH * HD + h * HD;
    for (int c = 2 * lane; c < HD; c += 64) {
      *reinterpret_cast<__nv_bfloat162*>(dst + c) = __floats2bfloat162_rn(o[c] * inv,
                                                                          o[c + 1] * inv);
    }
  }
}

// ---- backward ----

// delta[b, h, i] = dot(dout row, out row) of head h: the row term of the softmax backward.
// One warp per (token row, head).
__global__ void attention_delta_kernel(float* delta, const bf16* dout, const bf16* out, int N,
                                       int T, int NH, int hd) {
  const size_t w = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= static_cast<size_t>(N) * NH) return;  // the whole warp leaves together
  const size_t n = w / NH;                        // token row b * T + i
  const int h = static_cast<int>(w % NH);
  const bf16* d = dout + w * hd;  // == (n * NH + h) * hd
  const bf16* o = out + w * hd;
  float acc = 0.0f;
  for (int c = lane; c < hd; c += 32) acc += __bfloat162float(d[c]) * __bfloat162float(o[c]);
  acc = warp_sum(acc);
  if (lane == 0) delta[(n / T * NH + h) * T + n % T] = acc;
}

// One block per (key tile, kv head, sequence): it owns dK and dV of those keys (fp32 in shared
// memory) and accumulates them over every query head of the kv head's group and every query
// tile on or below the diagonal that the keys' spans reach. dQ is added into an fp32 scratch
// with atomics, since the key tiles of a query row live in different blocks.
//
// HD = 128 halves the query tile to stay within the shared memory budget.
template <int HD>
struct Bwd {
  static constexpr int BK = 64, BQ = HD == 128 ? 32 : 64;
  static constexpr int kWarps = 8, kThreads = 32 * kWarps;
  static constexpr int LDH = bf16_stride<HD>();  // K, V, Q, dO tiles
  static constexpr int LDS = f32_stride<BK>();   // S, dP
  static constexpr int LDP = bf16_stride<BK>();  // P, dS
  static constexpr int LDA = f32_stride<HD>();   // dK, dV, dQ accumulators
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + align128(sizeof(bf16) * BK * LDH);
  static constexpr size_t kQ = kV + align128(sizeof(bf16) * BK * LDH);
  static constexpr size_t kdO = kQ + align128(sizeof(bf16) * BQ * LDH);
  static constexpr size_t kS = kdO + align128(sizeof(bf16) * BQ * LDH);
  static constexpr size_t kdP = kS + align128(sizeof(float) * BQ * LDS);
  static constexpr size_t kP = kdP + align128(sizeof(float) * BQ * LDS);
  static constexpr size_t kdS = kP + align128(sizeof(bf16) * BQ * LDP);
  static constexpr size_t kdK = kdS + align128(sizeof(bf16) * BQ * LDP);
  static constexpr size_t kdV = kdK + align128(sizeof(float) * BK * LDA);
  static constexpr size_t kLse = kdV + align128(sizeof(float) * BK * LDA);
  static constexpr size_t kDelta = kLse + align128(sizeof(float) * BQ);
  static constexpr size_t kSpan = kDelta + align128(sizeof(float) * BQ);
  static constexpr size_t kKeySpan = kSpan + align128(sizeof(int) * BQ);
  static constexpr size_t kBytes = kKeySpan + align128(sizeof(int) * BK);
  // The dQ tile is staged where S and dP were, once dS has been computed from them.
  static constexpr size_t kdQ = kS;
  static_assert(sizeof(float) * BQ * LDA <= kP - kS, "the dQ tile must fit over S and dP");
  static_assert(kBytes <= kMaxSmemBytes, "backward tiles exceed the shared memory budget");
};

template <int HD>
__global__ void __launch_bounds__(Bwd<HD>::kThreads)
    attention_backward_kernel(bf16* dqkv, float* dq, const bf16* dout, const bf16* qkv,
                              const float* lse, const float* delta, const int32_t* key_mask,
                              const int32_t* span_begin, const int32_t* span_end, int T, int NH,
                              int NKV, float scale, float scale_log2) {
  using C = Bwd<HD>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem + C::kK);
  bf16* sV = reinterpret_cast<bf16*>(smem + C::kV);
  bf16* sQ = reinterpret_cast<bf16*>(smem + C::kQ);
  bf16* sdO = reinterpret_cast<bf16*>(smem + C::kdO);
  float* sS = reinterpret_cast<float*>(smem + C::kS);
  float* sdP = reinterpret_cast<float*>(smem + C::kdP);
  bf16* sP = reinterpret_cast<bf16*>(smem + C::kP);
  bf16* sdS = reinterpret_cast<bf16*>(smem + C::kdS);
  float* sdK = reinterpret_cast<float*>(smem + C::kdK);
  float* sdV = reinterpret_cast<float*>(smem + C::kdV);
  float* sLse = reinterpret_cast<float*>(smem + C::kLse);  // log2 units
  float* sDelta = reinterpret_cast<float*>(smem + C::kDelta);
  int* sSpan = reinterpret_cast<int*>(smem + C::kSpan);  // span begin of each query row
  int* sKeySpan = reinterpret_cast<int*>(smem + C::kKeySpan);  // of each key; -1: padding
  float* sdQ = reinterpret_cast<float*>(smem + C::kdQ);

  const int k0 = blockIdx.x * C::BK;
  const int g = blockIdx.y, b = blockIdx.z, group = NH / NKV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const size_t QKV = static_cast<size_t>(NH + 2 * NKV) * HD, OD = static_cast<size_t>(NH) * HD;
  const bf16* seq = qkv + static_cast<size_t>(b) * T * QKV;
  const bf16* seq_dout = dout + static_cast<size_t>(b) * T * OD;
  const int32_t* mask = key_mask + static_cast<size_t>(b) * T;
  const int32_t* lo = span_begin + static_cast<size_t>(b) * T;  // row b's span bounds
  const int32_t* hi = span_end + static_cast<size_t>(b) * T;
  // Queries from this span end on belong to later spans than every key of the tile (spans
  // never go back along the row), so see none of them.
  const int query_end = hi[min(k0 + C::BK, T) - 1];

  load_rows<C::BK, HD, C::LDH, C::kThreads>(sK, seq + (NH + g) * HD, QKV, k0, T);
  load_rows<C::BK, HD, C::LDH, C::kThreads>(sV, seq + (NH + NKV + g) * HD, QKV, k0, T);
  for (int idx = threadIdx.x; idx < C::BK * C::LDA; idx += C::kThreads) {
    sdK[idx] = 0.0f;
    sdV[idx] = 0.0f;
  }
  bool any_key = false;
  for (int c = threadIdx.x; c < C::BK; c += C::kThreads) {
    const int j = k0 + c;
    sKeySpan[c] = j < T && mask[j] != 0 ? lo[j] : -1;
    any_key |= sKeySpan[c] >= 0;
  }

  // A tile of padding keys neither gets nor gives gradient: its dK and dV stay zero.
  if (__syncthreads_or(any_key)) {
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const float* row_lse = lse + (static_cast<size_t>(b) * NH + h) * T;
      const float* row_delta = delta + (static_cast<size_t>(b) * NH + h) * T;
      // Query tiles before the one holding row k0 lie wholly above the diagonal.
      for (int q0 = k0 / C::BQ * C::BQ; q0 < query_end; q0 += C::BQ) {
        __syncthreads();  // the previous query tile's Q, dO, P, dS and dQ are no longer read
        load_rows<C::BQ, HD, C::LDH, C::kThreads>(sQ, seq + h * HD, QKV, q0, T);
        load_rows<C::BQ, HD, C::LDH, C::kThreads>(sdO, seq_dout + h * HD, OD, q0, T);
        load_query_stats<C::BQ, C::kThreads>(sLse, sDelta, sSpan, row_lse, row_delta, lo, q0, T);
        __syncthreads();

        // S = Q K^T and dP = dO V^T, their 16x16 blocks dealt out to the warps.
        for (int f = warp; f < (C::BQ / 16) * (C::BK / 16); f += C::kWarps) {
          const int mt = f / (C::BK / 16), nt = f % (C::BK / 16);
          FragC acc;
          wmma::fill_fragment(acc, 0.0f);
          mma_steps<FragA<RowMajor>, FragB<ColMajor>, HD / 16>(
              acc, sQ + mt * 16 * C::LDH, C::LDH, 16, sK + nt * 16 * C::LDH, C::LDH, 16);
          wmma::store_matrix_sync(sS + mt * 16 * C::LDS + nt * 16, acc, C::LDS,
                                  wmma::mem_row_major);
          wmma::fill_fragment(acc, 0.0f);
          mma_steps<FragA<RowMajor>, FragB<ColMajor>, HD / 16>(
              acc, sdO + mt * 16 * C::LDH, C::LDH, 16, sV + nt * 16 * C::LDH, C::LDH, 16);
          wmma::store_matrix_sync(sdP + mt * 16 * C::LDS + nt * 16, acc, C::LDS,
                                  wmma::mem_row_major);
        }
        __syncthreads();

        // P = exp(S * scale - lse) (0 where masked, as in the forward) and
        // dS = P * (dP - delta) * scale. A row with lse = -inf has every key masked, so exp2
        // never sees +inf - -inf.
        for (int idx = threadIdx.x; idx < C::BQ * C::BK; idx += C::kThreads) {
          const int r = idx / C::BK, c = idx % C::BK;
          const int i = q0 + r, j = k0 + c;
          const bool valid = sKeySpan[c] == sSpan[r] && j <= i;
          const float p = valid ? exp2f(sS[r * C::LDS + c] * scale_log2 - sLse[r]) : 0.0f;
          const float ds = p * (sdP[r * C::LDS + c] - sDelta[r]) * scale;
          sP[r * C::LDP + c] = __float2bfloat16_rn(p);
          sdS[r * C::LDP + c] = __float2bfloat16_rn(ds);
        }
        __syncthreads();

        // dV += P^T dO and dK += dS^T Q, per 16x16 block of the key tile's accumulators.
        for (int f = warp; f < (C::BK / 16) * (HD / 16); f += C::kWarps) {
          const int mt = f / (HD / 16), nt = f % (HD / 16);
          const int acc_off = mt * 16 * C::LDA + nt * 16;
          FragC acc;
          wmma::load_matrix_sync(acc, sdV + acc_off, C::LDA, wmma::mem_row_major);
          mma_steps<FragA<ColMajor>, FragB<RowMajor>, C::BQ / 16>(
              acc, sP + mt * 16, C::LDP, 16 * C::LDP, sdO + nt * 16, C::LDH, 16 * C::LDH);
          wmma::store_matrix_sync(sdV + acc_off, acc, C::LDA, wmma::mem_row_major);
          wmma::load_matrix_sync(acc, sdK + acc_off, C::LDA, wmma::mem_row_major);
          mma_steps<FragA<ColMajor>, FragB<RowMajor>, C::BQ / 16>(
              acc, sdS + mt * 16, C::LDP, 16 * C::LDP, sQ + nt * 16, C::LDH, 16 * C::LDH);
          wmma::store_matrix_sync(sdK + acc_off, acc, C::LDA, wmma::mem_row_major);
        }

        // dQ = dS K of this query tile, added into the scratch. Each block of dQ is staged by
        // the warp that computed it, in its own place, so only the warp need synchronise.
        for (int f = warp; f < (C::BQ / 16) * (HD / 16); f += C::kWarps) {
          const int mt = f / (HD / 16), nt = f % (HD / 16);
          FragC acc;
          wmma::fill_fragment(acc, 0.0f);
          mma_steps<FragA<RowMajor>, FragB<RowMajor>, C::BK / 16>(
              acc, sdS + mt * 16 * C::LDP, C::LDP, 16, sK + nt * 16, C::LDH, 16 * C::LDH);
          float* stage = sdQ + mt * 16 * C::LDA + nt * 16;
          wmma::store_matrix_sync(stage, acc, C::LDA, wmma::mem_row_major);
          __syncwarp();
          for (int e = lane; e < 16 * 16; e += 32) {
            const int i = q0 + mt * 16 + e / 16, c = nt * 16 + e % 16;
            if (i < T) {
              atomicAdd(dq + (static_cast<size_t>(b) * T + i) * OD + h * HD + c,
                        stage[e / 16 * C::LDA + e % 16]);
            }
          }
        }
      }
    }
  }
  __syncthreads();  // dK and dV are complete

  // Every key row of the tile is written, zeros included.
  for (int idx = threadIdx.x; idx < C::BK * HD / 2; idx += C::kThreads) {
    const int r = idx / (HD / 2), c = idx % (HD / 2) * 2;
    const int j = k0 + r;
    if (j >= T) continue;
    bf16* row = dqkv + (static_cast<size_t>(b) * T + j) * QKV;
    *reinterpret_cast<__nv_bfloat162*>(row + (NH + g) * HD + c) =
        __floats2bfloat162_rn(sdK[r * C::LDA + c], sdK[r * C::LDA + c + 1]);
    *reinterpret_cast<__nv_bfloat162*>(row + (NH + NKV + g) * HD + c) =
        __floats2bfloat162_rn(sdV[r * C::LDA + c], sdV[r * C::LDA + c + 1]);
  }
}

// The q part of each dqkv row from the fp32 dq scratch [N, QD], two columns per thread (QD is
// even, so a pair never straddles rows).
__global__ void attention_dq_kernel(bf16* dqkv, const float* dq, size_t pairs, int QD,
                                    size_t QKV) {
  const size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= pairs) return;
  const size_t e = 2 * idx, n = e / QD, c = e % QD;
  *reinterpret_cast<__nv_bfloat162*>(dqkv + n * QKV + c) = __floats2bfloat162_rn(dq[e],
                                                                                  dq[e + 1]);
}

// ---- launchers ----

// The tile loads read qkv and dout 16 bytes at a time.
void require_aligned(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    throw Error(std::string("attention: ") + what + " is not 16-byte aligned");
  }
}

float softmax_scale(int hd) { return 1.0f / std::sqrt(static_cast<float>(hd)); }

// Both scratches start with the spans: span_begin [B*T], then span_end [B*T] (int32).
struct Spans {
  int32_t* begin;
  int32_t* end;
};

Spans find_spans(void* scratch, const int32_t* key_mask, const AttentionShape& s,
                 cudaStream_t stream) {
  int32_t* begin = static_cast<int32_t*>(scratch);
  Spans spans{begin, begin + static_cast<size_t>(s.B) * s.T};
  attention_spans_kernel<<<s.B, 32, 0, stream>>>(spans.begin, spans.end, key_mask, s.T);
  check_launch("attention_spans_kernel");
  return spans;
}

template <int HD>
void forward_hd(bf16* out, float* lse, const bf16* qkv, const int32_t* key_mask, Spans spans,
                const AttentionShape& s, cudaStream_t stream) {
  using C = Fwd<HD>;
  launch_tiles(attention_forward_kernel<HD>, dim3((s.T + C::BQ - 1) / C::BQ, s.num_heads, s.B),
               C::kThreads, C::kBytes, stream, "attention_forward_kernel", out, lse, qkv,
               key_mask, spans.begin, spans.end, s.T, s.num_heads, s.num_kv_heads,
               softmax_scale(HD) * kLog2e, s.causal);
}

template <int HD>
void backward_hd(bf16* dqkv, float* dq, const bf16* dout, const bf16* qkv, const float* lse,
                 const float* delta, const int32_t* key_mask, Spans spans,
                 const AttentionShape& s, cudaStream_t stream) {
  using C = Bwd<HD>;
  const float scale = softmax_scale(HD);
  launch_tiles(attention_backward_kernel<HD>,
               dim3((s.T + C::BK - 1) / C::BK, s.num_kv_heads, s.B), C::kThreads, C::kBytes,
               stream, "attention_backward_kernel", dqkv, dq, dout, qkv, lse, delta, key_mask,
               spans.begin, spans.end, s.T, s.num_heads, s.num_kv_heads, scale,
               scale * kLog2e);
}


}  // namespace

bool attention_supports(int head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

void attention_forward(bf16* out, float* lse, const bf16* qkv, const int32_t* key_mask,
                       const AttentionShape& s, void* scratch, bool mma, cudaStream_t stream) {
  if (s.B == 0 || s.T == 0) return;
  if (!attention_supports(s.head_dim)) no_kernel_for(s.head_dim);
  require_aligned(qkv, "qkv");
  const Spans spans = find_spans(scratch, key_mask, s, stream);
  if (mma) {
    return attention_forward_mma(out, lse, qkv, key_mask, spans.begin, spans.end, s,
                                 softmax_scale(s.head_dim) * kLog2e, stream);
  }
  with_head_dim(s.head_dim, [&](auto hd) {
    forward_hd<decltype(hd)::value>(out, lse, qkv, key_mask, spans, s, stream);
  });
}

void attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* lse, const int32_t* key_mask, const AttentionShape& s,
                        void* scratch, bool mma, cudaStream_t stream) {
  if (!s.causal) throw Error("attention_backward: bidirectional attention is forward only");
  if (s.B == 0 || s.T == 0) return;
  if (!attention_supports(s.head_dim)) no_kernel_for(s.head_dim);
  require_aligned(qkv, "qkv");
  require_aligned(dout, "dout");
  const int N = s.B * s.T, QD = s.num_heads * s.head_dim;
  const Spans spans = find_spans(scratch, key_mask, s, stream);
  float* dq = reinterpret_cast<float*>(spans.end + N);
  float* delta = dq + static_cast<size_t>(N) * QD;
  check(cudaMemsetAsync(dq, 0, sizeof(float) * N * QD, stream), "attention dq scratch");

  constexpr int kThreads = 256;
  const size_t delta_threads = static_cast<size_t>(N) * s.num_heads * 32;
  attention_delta_kernel<<<(delta_threads + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      delta, dout, out, N, s.T, s.num_heads, s.head_dim);
  check_launch("attention_delta_kernel");

  if (mma) {
    attention_backward_mma(dqkv, dq, dout, qkv, lse, delta, key_mask, spans.begin, spans.end, s,
                           softmax_scale(s.head_dim), stream);
  } else {
    with_head_dim(s.head_dim, [&](auto hd) {
      backward_hd<decltype(hd)::value>(dqkv, dq, dout, qkv, lse, delta, key_mask, spans, s,
                                       stream);
    });
  }

  const size_t pairs = static_cast<size_t>(N) * QD / 2;
  attention_dq_kernel<<<(pairs + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      dqkv, dq, pairs, QD, static_cast<size_t>(s.qkv_dim()));
  check_launch("attention_dq_kernel");
}

}  // namespace sr1::cuda
