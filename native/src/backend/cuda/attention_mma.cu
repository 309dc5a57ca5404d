// The attention passes in FlashAttention-2's arrangement (Dao, "FlashAttention-2", 2023,
// algorithms 1 and 2) on the tensor cores' mma.sync.m16n8k16 (bf16 in, fp32 accumulate). In
// the forward each warp keeps its 16 query rows' scores, probabilities and output in
// registers, as mma fragments, so the online softmax runs on registers with two shuffles a
// row, and only the key and value tiles pass through shared memory; the backward is below.
// attention.cu's WMMA kernels store every score tile to shared memory and walk its rows one
// at a time. These kernels have not run on a GPU yet, so they are opt-in
// (SEARCHR1_ATTENTION=mma); the WMMA ones, which ran on the H200, are the default.
//
// Fragment layouts are PTX's for mma.m16n8k16 with .bf16 inputs (PTX ISA, "Matrix Fragments
// for mma.m16n8k16"). With g = lane / 4 and t = lane % 4:
//   A (16 x 16, row-major):  a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1],
//                            a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, k x n):       b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8, fp32):     c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
// Each register holds two bf16, the lower-numbered element in the low half. So S = Q K^T
// takes its B from rows of K (k runs along the head dim), and the C fragments of two adjacent
// 8-key tiles of P are, as they stand, the A fragment of P for O += P V, whose B comes from
// rows of V^T: the value tile is stored transposed.
//
// The masking rules, spans and log-sum-exp are attention.cu's (see there and backend.h).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cuda/attention_mma.h"
#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/reduce.cuh"

namespace sr1::cuda {
namespace {

template <int HD>
struct Tiles {
  static constexpr int BQ = 64, BK = 64;  // query rows per block (16 per warp), keys per tile
  static constexpr int kWarps = BQ / 16, kThreads = 32 * kWarps;
  // Row strides (bf16) padded by 16 bytes: the fragment loads below then hit 32 distinct banks.
  static constexpr int LDK = HD + 8, LDV = BK + 8;
  static constexpr size_t kK = 0;                                        // K [BK][LDK]
  static constexpr size_t kVt = align128(sizeof(bf16) * BK * LDK);       // V^T [HD][LDV]
  static constexpr size_t kKeySpan = kVt + align128(sizeof(bf16) * HD * LDV);  // [BK]
  static constexpr size_t kBytes = kKeySpan + align128(sizeof(int) * BK);
};

// D += A B for one 16 x 8 x 16 step.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two bf16 from 4-byte-aligned memory, as one register.
__device__ __forceinline__ uint32_t load_pair(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// lo in the low half, as the fragments want it.
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  return bits;
}

// The A fragment of a 16 x 16 slice whose two 8-column halves are the C fragments lo and hi:
// a product's result, as it stands, is the next product's operand (FlashAttention-2's P V).
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  a[0] = pack_pair(lo[0], lo[1]);
  a[1] = pack_pair(lo[2], lo[3]);
  a[2] = pack_pair(hi[0], hi[1]);
  a[3] = pack_pair(hi[2], hi[3]);
}

// The 4 lanes of a quad (same g) hold the same two rows: combine their values.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}

// One block per (query tile, query head, sequence), as attention.cu's forward.
template <int HD>
__global__ void __launch_bounds__(Tiles<HD>::kThreads)
    attention_forward_mma_kernel(bf16* out, float* lse, const bf16* qkv,
                                 const int32_t* key_mask, const int32_t* span_begin,
                                 const int32_t* span_end, int T, int NH, int NKV,
                                 float scale_log2, bool causal) {
  using C = Tiles<HD>;
  constexpr int KS = HD / 16;    // k steps of Q K^T
  constexpr int NT = C::BK / 8;  // 8-key tiles of S
  constexpr int ND = HD / 8;     // 8-column tiles of O
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem + C::kK);
  bf16* sVt = reinterpret_cast<bf16*>(smem + C::kVt);
  int* sKeySpan = reinterpret_cast<int*>(smem + C::kKeySpan);

  // Tiles further down the diagonal see more keys: launch them first.
  const int q0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * C::BQ;
  const int h = blockIdx.y, b = blockIdx.z, kv = h / (NH / NKV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const size_t QKV = static_cast<size_t>(NH + 2 * NKV) * HD;
  const bf16* seq = qkv + static_cast<size_t>(b) * T * QKV;
  const int32_t* mask = key_mask + static_cast<size_t>(b) * T;
  const int32_t* lo = span_begin + static_cast<size_t>(b) * T;
  const int32_t* hi = span_end + static_cast<size_t>(b) * T;

  // This thread's two query rows (g and g + 8 of the warp's 16), their span (-2 past T: no
  // key has it), and the warp's Q as A fragments for the whole kernel.
  const int w0 = q0 + warp * 16;
  int row[2], span[2];
  uint32_t qa[KS][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = w0 + g + 8 * r;
    span[r] = row[r] < T ? lo[row[r]] : -2;
  }
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const int i = row[f % 2], col = kk * 16 + 2 * t + 8 * (f / 2);
      qa[kk][f] = i < T ? load_pair(seq + i * QKV + h * HD + col) : 0u;
    }
  }

  float o[ND][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's share of the sum

  const int q_last = min(q0 + C::BQ, T) - 1;
  const int key_end = causal ? q_last + 1 : hi[q_last];
  for (int k0 = lo[q0] / C::BK * C::BK; k0 < key_end; k0 += C::BK) {
    __syncthreads();  // every warp is done with the previous tiles
    const bf16* keys = seq + (NH + kv) * HD;
    const bf16* values = seq + (NH + NKV + kv) * HD;
    load_rows<C::BK, HD, C::LDK, C::kThreads>(sK, keys, QKV, k0, T);
    load_rows_transposed<C::BK, HD, 0, C::LDV, C::kThreads>(nullptr, sVt, values, QKV, k0, T);
    for (int j = threadIdx.x; j < C::BK; j += C::kThreads) {
      sKeySpan[j] = k0 + j < T && mask[k0 + j] != 0 ? lo[k0 + j] : -1;
    }
    __syncthreads();
    // Causal: a tile wholly after the warp's last row adds nothing to it.
    if (causal && k0 > w0 + 15) continue;

    // S = Q K^T, then the mask, in log2 units.
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
      const bf16* krow = sK + (nt * 8 + g) * C::LDK + 2 * t;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        const uint32_t kb[2] = {load_pair(krow + kk * 16), load_pair(krow + kk * 16 + 8)};
        mma16816(s[nt], qa[kk], kb);
      }
    }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, jj = nt * 8 + 2 * t + e % 2, j = k0 + jj;
        const bool valid = sKeySpan[jj] == span[r] && (!causal || j <= row[r]);
        s[nt][e] = valid ? s[nt][e] * scale_log2 : -INFINITY;
        tile_max[r] = fmaxf(tile_max[r], s[nt][e]);
      }
    }

    // Online softmax. Until a row has seen a key its max is -inf, and exp2(-inf - -inf) would
    // be NaN: measure from 0 instead (every p is 0 then, and so is the running O).
    float m_ref[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
      m_ref[r] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = exp2f(m[r] - m_ref[r]);
      m[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] = exp2f(s[nt][e] - m_ref[e / 2]);
        sum[e / 2] += s[nt][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
      o[nd][0] *= alpha[0];
      o[nd][1] *= alpha[0];
      o[nd][2] *= alpha[1];
      o[nd][3] *= alpha[1];
    }

    // O += P V: the probabilities of key tiles 2kk and 2kk + 1 are the A fragment of step kk.
#pragma unroll
    for (int kk = 0; kk < C::BK / 16; ++kk) {
      uint32_t pa[4];
      c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int nd = 0; nd < ND; ++nd) {
        const bf16* vrow = sVt + (nd * 8 + g) * C::LDV + kk * 16 + 2 * t;
        const uint32_t vb[2] = {load_pair(vrow), load_pair(vrow + 8)};
        mma16816(o[nd], pa, vb);
      }
    }
  }

  // A row that saw no key has l = 0 (and O = 0): its lse is -inf and its output zeros. lse is
  // null when no backward pass follows.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(l[r]);
    const int i = row[r];
    if (i >= T) continue;
    if (lse != nullptr && t == 0) {
      lse[(static_cast<size_t>(b) * NH + h) * T + i] =
          total > 0.0f ? (m[r] + log2f(total)) * kLn2 : -INFINITY;
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    bf16* dst = out + (static_cast<size_t>(b) * T + i) * NH * HD + h * HD + 2 * t;
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
      *reinterpret_cast<__nv_bfloat162*>(dst + nd * 8) =
          __floats2bfloat162_rn(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
    }
  }
}

template <int HD>
void launch(bf16* out, float* lse, const bf16* qkv, const int32_t* key_mask,
            const int32_t* span_begin, const int32_t* span_end, const AttentionShape& s,
            float scale_log2, cudaStream_t stream) {
  using C = Tiles<HD>;
  static_assert(C::kBytes <= 48 * 1024, "the tiles fit the default shared memory of a block");
  const dim3 grid((s.T + C::BQ - 1) / C::BQ, s.num_heads, s.B);
  attention_forward_mma_kernel<HD><<<grid, C::kThreads, C::kBytes, stream>>>(
      out, lse, qkv, key_mask, span_begin, span_end, s.T, s.num_heads, s.num_kv_heads,
      scale_log2, s.causal);
  check_launch("attention_forward_mma_kernel");
}

// ---- backward ----

// The backward pass in FlashAttention-2's arrangement (Dao 2023, algorithm 2): one block per
// (key tile, kv head, sequence), as attention.cu's backward, each warp owning 16 keys. Per
// query tile it computes S^T = K Q^T and dP^T = V dO^T with the keys as rows, so that P^T and
// dS^T are, in registers, the A fragments of dV += P^T dO and dK += dS^T Q; dK and dV stay in
// registers over every query tile and head of the group. dQ += dS K needs the queries as rows:
// dS^T goes through shared memory, and each warp adds its share of the tile's dQ into the fp32
// scratch with atomics. Q and dO are also stored transposed, the B operands of dK and dV.
template <int HD>
struct BwdTiles {
  static constexpr int BK = 64, BQ = HD == 128 ? 32 : 64;  // keys per block, queries per tile
  static constexpr int kWarps = BK / 16, kThreads = 32 * kWarps;
  static constexpr int LDH = HD + 8, LDT = BQ + 8;  // row strides (bf16), as in Tiles
  static constexpr size_t kK = 0;                                         // K [BK][LDH]
  static constexpr size_t kV = kK + align128(sizeof(bf16) * BK * LDH);    // V [BK][LDH]
  static constexpr size_t kQ = kV + align128(sizeof(bf16) * BK * LDH);    // Q [BQ][LDH]
  static constexpr size_t kdO = kQ + align128(sizeof(bf16) * BQ * LDH);   // dO [BQ][LDH]
  static constexpr size_t kQt = kdO + align128(sizeof(bf16) * BQ * LDH);  // Q^T [HD][LDT]
  static constexpr size_t kdOt = kQt + align128(sizeof(bf16) * HD * LDT);  // dO^T [HD][LDT]
  static constexpr size_t kdSt = kdOt + align128(sizeof(bf16) * HD * LDT);  // dS^T [BK][LDT]
  static constexpr size_t kLse = kdSt + align128(sizeof(bf16) * BK * LDT);  // [BQ], log2 units
  static constexpr size_t kDelta = kLse + align128(sizeof(float) * BQ);     // [BQ]
  static constexpr size_t kSpan = kDelta + align128(sizeof(float) * BQ);    // [BQ]
  static constexpr size_t kKeySpan = kSpan + align128(sizeof(int) * BQ);    // [BK]
  static constexpr size_t kBytes = kKeySpan + align128(sizeof(int) * BK);
  static_assert(kBytes <= 160 * 1024, "backward tiles exceed an sm_80 block's shared memory");
};

template <int HD>
__global__ void __launch_bounds__(BwdTiles<HD>::kThreads)
    attention_backward_mma_kernel(bf16* dqkv, float* dq, const bf16* dout, const bf16* qkv,
                                  const float* lse, const float* delta, const int32_t* key_mask,
                                  const int32_t* span_begin, const int32_t* span_end, int T,
                                  int NH, int NKV, float scale, float scale_log2) {
  using C = BwdTiles<HD>;
  constexpr int KS = HD / 16;     // k steps over the head dim
  constexpr int NT = C::BQ / 8;   // 8-query tiles of S^T
  constexpr int QS = C::BQ / 16;  // k steps over the queries
  constexpr int ND = HD / 8;      // 8-column tiles of dK, dV, dQ
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem + C::kK);
  bf16* sV = reinterpret_cast<bf16*>(smem + C::kV);
  bf16* sQ = reinterpret_cast<bf16*>(smem + C::kQ);
  bf16* sdO = reinterpret_cast<bf16*>(smem + C::kdO);
  bf16* sQt = reinterpret_cast<bf16*>(smem + C::kQt);
  bf16* sdOt = reinterpret_cast<bf16*>(smem + C::kdOt);
  bf16* sdSt = reinterpret_cast<bf16*>(smem + C::kdSt);
  float* sLse = reinterpret_cast<float*>(smem + C::kLse);
  float* sDelta = reinterpret_cast<float*>(smem + C::kDelta);
  int* sSpan = reinterpret_cast<int*>(smem + C::kSpan);
  int* sKeySpan = reinterpret_cast<int*>(smem + C::kKeySpan);

  const int k0 = blockIdx.x * C::BK;
  const int kv = blockIdx.y, b = blockIdx.z, group = NH / NKV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int kw = warp * 16;  // the warp's first key within the tile
  const size_t QKV = static_cast<size_t>(NH + 2 * NKV) * HD, OD = static_cast<size_t>(NH) * HD;
  const bf16* seq = qkv + static_cast<size_t>(b) * T * QKV;
  const bf16* seq_dout = dout + static_cast<size_t>(b) * T * OD;
  const int32_t* mask = key_mask + static_cast<size_t>(b) * T;
  const int32_t* lo = span_begin + static_cast<size_t>(b) * T;
  const int32_t* hi = span_end + static_cast<size_t>(b) * T;
  // Queries from this span end on belong to later spans than every key of the tile.
  const int query_end = hi[min(k0 + C::BK, T) - 1];

  load_rows<C::BK, HD, C::LDH, C::kThreads>(sK, seq + (NH + kv) * HD, QKV, k0, T);
  load_rows<C::BK, HD, C::LDH, C::kThreads>(sV, seq + (NH + NKV + kv) * HD, QKV, k0, T);
  bool any_key = false;
  for (int j = threadIdx.x; j < C::BK; j += C::kThreads) {
    sKeySpan[j] = k0 + j < T && mask[k0 + j] != 0 ? lo[k0 + j] : -1;
    any_key |= sKeySpan[j] >= 0;
  }

  float dk[ND][4] = {}, dv[ND][4] = {};
  // A tile of padding keys neither gets nor gives gradient: its dK and dV stay zero.
  if (__syncthreads_or(any_key)) {
    // This thread's two keys (g and g + 8 of the warp's 16), within the tile.
    const int key[2] = {kw + g, kw + g + 8};
    for (int h = kv * group; h < (kv + 1) * group; ++h) {
      const float* row_lse = lse + (static_cast<size_t>(b) * NH + h) * T;
      const float* row_delta = delta + (static_cast<size_t>(b) * NH + h) * T;
      // Query tiles before the one holding key k0 lie wholly above the diagonal.
      for (int q0 = k0 / C::BQ * C::BQ; q0 < query_end; q0 += C::BQ) {
        __syncthreads();  // the previous tile's Q, dO and dS^T are no longer read
        load_rows_transposed<C::BQ, HD, C::LDH, C::LDT, C::kThreads>(sQ, sQt, seq + h * HD,
                                                                     QKV, q0, T);
        load_rows_transposed<C::BQ, HD, C::LDH, C::LDT, C::kThreads>(
            sdO, sdOt, seq_dout + h * HD, OD, q0, T);
        load_query_stats<C::BQ, C::kThreads>(sLse, sDelta, sSpan, row_lse, row_delta, lo, q0, T);
        __syncthreads();

        // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys.
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
          for (int kk = 0; kk < KS; ++kk) {
            const int col = kk * 16 + 2 * t;
            const uint32_t ka[4] = {load_pair(sK + key[0] * C::LDH + col),
                                    load_pair(sK + key[1] * C::LDH + col),
                                    load_pair(sK + key[0] * C::LDH + col + 8),
                                    load_pair(sK + key[1] * C::LDH + col + 8)};
            const uint32_t va[4] = {load_pair(sV + key[0] * C::LDH + col),
                                    load_pair(sV + key[1] * C::LDH + col),
                                    load_pair(sV + key[0] * C::LDH + col + 8),
                                    load_pair(sV + key[1] * C::LDH + col + 8)};
            const bf16* q = sQ + (nt * 8 + g) * C::LDH + col;
            const bf16* o = sdO + (nt * 8 + g) * C::LDH + col;
            const uint32_t qb[2] = {load_pair(q), load_pair(q + 8)};
            const uint32_t ob[2] = {load_pair(o), load_pair(o + 8)};
            mma16816(s[nt], ka, qb);
            mma16816(dp[nt], va, ob);
          }
        }

        // P^T = exp(S^T * scale - lse) (0 where masked, as in the forward) and
        // dS^T = P^T * (dP^T - delta) * scale, written to shared memory for dQ as well.
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int jj = key[e / 2], ii = nt * 8 + 2 * t + e % 2;
            const bool valid = sKeySpan[jj] == sSpan[ii] && k0 + jj <= q0 + ii;
            const float p = valid ? exp2f(s[nt][e] * scale_log2 - sLse[ii]) : 0.0f;
            s[nt][e] = p;
            dp[nt][e] = p * (dp[nt][e] - sDelta[ii]) * scale;
          }
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            *reinterpret_cast<__nv_bfloat162*>(sdSt + key[r] * C::LDT + nt * 8 + 2 * t) =
                __floats2bfloat162_rn(dp[nt][2 * r], dp[nt][2 * r + 1]);
          }
        }

        // dV += P^T dO and dK += dS^T Q: query tiles 2qq and 2qq + 1 make the A fragments.
#pragma unroll
        for (int qq = 0; qq < QS; ++qq) {
          uint32_t pa[4], da[4];
          c_to_a(pa, s[2 * qq], s[2 * qq + 1]);
          c_to_a(da, dp[2 * qq], dp[2 * qq + 1]);
#pragma unroll
          for (int nd = 0; nd < ND; ++nd) {
            const bf16* ot = sdOt + (nd * 8 + g) * C::LDT + qq * 16 + 2 * t;
            const bf16* qt = sQt + (nd * 8 + g) * C::LDT + qq * 16 + 2 * t;
            const uint32_t ob[2] = {load_pair(ot), load_pair(ot + 8)};
            const uint32_t qb[2] = {load_pair(qt), load_pair(qt + 8)};
            mma16816(dv[nd], pa, ob);
            mma16816(dk[nd], da, qb);
          }
        }
        __syncthreads();  // dS^T is complete

        // dQ = dS K for this query tile, its 16 x 8 pieces dealt out to the warps. dS's A
        // fragment and K's B fragment take their pairs from two rows of dS^T and of K.
        for (int f = warp; f < QS * ND; f += C::kWarps) {
          const int mt = f / ND, nd = f % ND;
          float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int kk = 0; kk < C::BK / 16; ++kk) {
            const auto pair_of = [](const bf16* p, int stride) {
              __nv_bfloat162 v;
              v.x = p[0];
              v.y = p[stride];
              uint32_t bits;
              memcpy(&bits, &v, sizeof bits);
              return bits;
            };
            const bf16* ds = sdSt + (kk * 16 + 2 * t) * C::LDT + mt * 16 + g;
            const uint32_t a[4] = {pair_of(ds, C::LDT), pair_of(ds + 8, C::LDT),
                                   pair_of(ds + 8 * C::LDT, C::LDT),
                                   pair_of(ds + 8 * C::LDT + 8, C::LDT)};
            const bf16* k = sK + (kk * 16 + 2 * t) * C::LDH + nd * 8 + g;
            const uint32_t kb[2] = {pair_of(k, C::LDH), pair_of(k + 8 * C::LDH, C::LDH)};
            mma16816(acc, a, kb);
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = q0 + mt * 16 + g + 8 * (e / 2);
            if (i < T) {
              const size_t at = (static_cast<size_t>(b) * T + i) * OD + h * HD + nd * 8 + 2 * t;
              atomicAdd(dq + at + e % 2, acc[e]);
            }
          }
        }
      }
    }
  }

  // Every key row of the tile is written, zeros included.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = k0 + kw + g + 8 * r;
    if (j >= T) continue;
    bf16* row = dqkv + (static_cast<size_t>(b) * T + j) * QKV;
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) {
      const int c = nd * 8 + 2 * t;
      *reinterpret_cast<__nv_bfloat162*>(row + (NH + kv) * HD + c) =
          __floats2bfloat162_rn(dk[nd][2 * r], dk[nd][2 * r + 1]);
      *reinterpret_cast<__nv_bfloat162*>(row + (NH + NKV + kv) * HD + c) =
          __floats2bfloat162_rn(dv[nd][2 * r], dv[nd][2 * r + 1]);
    }
  }
}

template <int HD>
void launch_backward(bf16* dqkv, float* dq, const bf16* dout, const bf16* qkv, const float* lse,
                     const float* delta, const int32_t* key_mask, const int32_t* span_begin,
                     const int32_t* span_end, const AttentionShape& s, float scale,
                     cudaStream_t stream) {
  using C = BwdTiles<HD>;
  launch_tiles(attention_backward_mma_kernel<HD>,
               dim3((s.T + C::BK - 1) / C::BK, s.num_kv_heads, s.B), C::kThreads, C::kBytes,
               stream, "attention_backward_mma_kernel", dqkv, dq, dout, qkv, lse, delta,
               key_mask, span_begin, span_end, s.T, s.num_heads, s.num_kv_heads, scale,
               scale * kLog2e);
}

}  // namespace

void attention_forward_mma(bf16* out, float* lse, const bf16* qkv, const int32_t* key_mask,
                           const int32_t* span_begin, const int32_t* span_end,
                           const AttentionShape& s, float scale_log2, cudaStream_t stream) {
  with_head_dim(s.head_dim, [&](auto hd) {
    launch<decltype(hd)::value>(out, lse, qkv, key_mask, span_begin, span_end, s, scale_log2,
                                stream);
  });
}

void attention_backward_mma(bf16* dqkv, float* dq, const bf16* dout, const bf16* qkv,
                            const float* lse, const float* delta, const int32_t* key_mask,
                            const int32_t* span_begin, const int32_t* span_end,
                            const AttentionShape& s, float scale, cudaStream_t stream) {
  with_head_dim(s.head_dim, [&](auto hd) {
    launch_backward<decltype(hd)::value>(dqkv, dq, dout, qkv, lse, delta, key_mask, span_begin,
                                         span_end, s, scale, stream);
  });
}

}  // namespace sr1::cuda
