// A portable sgemm for builds without OpenBLAS: the cache blocking and packing of
// GotoBLAS/BLIS, written plainly, around a register-tile micro-kernel simple enough for the
// compiler to vectorise (with -march=native, at the widest vectors the machine has).
//
// The loop nest, outer to inner, for C += alpha * op(A) op(B):
//   jc: N in blocks of kNC columns; pc: K in blocks of kKC
//       pack the kKC x kNC block of op(B) (all threads), which then stays in L2/L3;
//   tasks, spread over the threads: a kMC-row block of op(A), packed by the task into its
//       thread's buffer, times a share of the B block's strips;
//   jr, ir: kMR x kNR tiles of C, one micro-kernel call each over kKC; a kKC x kNR strip of
//       packed B stays in L1 while the A strips stream past it.
// Packing copies a block into the order the micro-kernel reads it, which turns the four
// transpose cases into one kernel, and pads partial tiles with zeros, so the kernel has no
// edge cases: only its write-back looks at the tile's true size.
//
// Every element of C is summed in the same order (k ascending, one fp32 partial per kKC
// block) whatever M, N, its place in a tile and the thread count: a row scores the same, bit
// for bit, alone or in a batch, on 1 thread or 4, as with OpenBLAS.
#include <omp.h>

#include <cstddef>
#include <vector>

#include "backend/sgemm.h"

// GCC tunes most AVX-512 machines for 256-bit vectors; the micro-kernel's tile is sized for
// 512-bit ones, and runs ~1.2x faster with them than the AVX2 tile (2-core Xeon VM).
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("prefer-vector-width=512")
#define SR1_VECTOR_512
#endif

namespace sr1 {
namespace {

// The register tile: kMR x kNR accumulators must fit the vector registers with room for a
// row of B and a broadcast of A (AVX-512: 32 registers of 16 floats, 24 accumulators;
// AVX2: 16 registers of 8, 12 accumulators; SSE or NEON: 8 accumulators).
#if defined(SR1_VECTOR_512)
constexpr int kMR = 12, kNR = 32;
#elif defined(__AVX__)
constexpr int kMR = 6, kNR = 16;
#else
constexpr int kMR = 4, kNR = 8;
#endif
// The cache blocks: a kKC x kNR strip of B (32 KiB at kNR = 32) fits L1, a kMC x kKC block
// of A L2, and a kKC x kNC block of B L2 or L3.
constexpr int kKC = 256;
constexpr int kMC = 16 * kMR;
constexpr int kNC = 64 * kNR;

using Index = std::ptrdiff_t;

// C = beta * C, where beta == 0 writes zeros without reading C (as BLAS does).
void scale_c(float* C, Index ldc, int M, int N, float beta) {
  if (beta == 1.0f) return;
#pragma omp for schedule(static)
  for (int i = 0; i < M; i++) {
    float* c = C + i * ldc;
    for (int j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
  }
}

// Packs a strip of w <= W lines of a matrix over kc steps: dst[k * W + i] = X[i * si + k * sk]
// for i < w; lines w..W-1 are zeros. A strip of op(A) is kMR of its rows, a strip of op(B)
// kNR of its columns; si and sk are the strides that walk them in the matrix as stored.
template <int W>
void pack_strip(float* dst, const float* X, Index si, Index sk, int w, int kc) {
  if (sk == 1) {  // each line is contiguous in k: read along it
    for (int i = 0; i < w; i++) {
      for (int k = 0; k < kc; k++) dst[k * W + i] = X[i * si + k];
    }
  } else {  // each step k is contiguous across the lines
    for (int k = 0; k < kc; k++) {
      for (int i = 0; i < w; i++) dst[k * W + i] = X[i * si + k * sk];
    }
  }
  for (int k = 0; k < kc; k++) {
    for (int i = w; i < W; i++) dst[k * W + i] = 0.0f;
  }
}

// One kMR x kNR tile: acc = sum over k of a[k][:] (outer product) b[k][:], from packed
// strips, then C += alpha * acc on the m x n part of the tile that lies inside C. The fixed
// trip counts let the compiler keep acc in registers and vectorise over j.
void micro_kernel(int kc, const float* a, const float* b, float* C, Index ldc, int m, int n,
                  float alpha) {
  float acc[kMR][kNR] = {};
  for (int k = 0; k < kc; k++) {
    const float* ak = a + k * kMR;
    const float* bk = b + k * kNR;
#pragma GCC unroll 16
    for (int i = 0; i < kMR; i++) {
#pragma omp simd
      for (int j = 0; j < kNR; j++) acc[i][j] += ak[i] * bk[j];
    }
  }
  for (int i = 0; i < m; i++) {
    float* c = C + i * ldc;
    for (int j = 0; j < n; j++) c[j] += alpha * acc[i][j];
  }
}

// A packing buffer of the calling thread, kept between calls (a large allocation would be
// fresh pages every time, and OpenMP's threads live on).
float* buffer(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

}  // namespace

void sgemm_portable(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                    int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  // op(A)[i][k] = A[i * a_row + k * a_col], op(B)[k][j] = B[k * b_row + j * b_col].
  const Index a_row = ta == Trans::No ? lda : 1, a_col = ta == Trans::No ? 1 : lda;
  const Index b_row = tb == Trans::No ? ldb : 1, b_col = tb == Trans::No ? 1 : ldb;
  static thread_local std::vector<float> b_buf;  // shared by the team
  float* bp = buffer(b_buf, static_cast<size_t>(kKC) * kNC);
  const bool multiply = K > 0 && alpha != 0.0f;
  const int m_blocks = (M + kMC - 1) / kMC;

#pragma omp parallel
  {
    static thread_local std::vector<float> a_buf;  // each thread packs its own A blocks
    float* ap = buffer(a_buf, static_cast<size_t>(kMC) * kKC);
    scale_c(C, ldc, M, N, beta);  // ends in a barrier, like every omp for below
    for (int jc = 0; multiply && jc < N; jc += kNC) {
      const int nc = N - jc < kNC ? N - jc : kNC;
      const int n_strips = (nc + kNR - 1) / kNR;
      // Tasks: an A block times a share of the B strips. Few A blocks (small M) are split
      // over the strips, so that every thread has work; a task repacks its A block, which
      // costs little next to its share of the products.
      const int want = (4 * omp_get_num_threads() + m_blocks - 1) / m_blocks;
      const int parts = want < n_strips ? want : n_strips;
      for (int pc = 0; pc < K; pc += kKC) {
        const int kc = K - pc < kKC ? K - pc : kKC;
#pragma omp for schedule(static)
        for (int s = 0; s < n_strips; s++) {
          const int j = jc + s * kNR, w = N - j < kNR ? N - j : kNR;
          pack_strip<kNR>(bp + static_cast<Index>(s) * kc * kNR, B + pc * b_row + j * b_col,
                          b_col, b_row, w, kc);
        }
        // Tasks write disjoint tiles of C, so which thread runs which does not matter.
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < m_blocks * parts; task++) {
          const int ic = task / parts * kMC, part = task % parts;
          const int mc = M - ic < kMC ? M - ic : kMC;
          const int m_strips = (mc + kMR - 1) / kMR;
          for (int s = 0; s < m_strips; s++) {
            const int i = ic + s * kMR, w = M - i < kMR ? M - i : kMR;
            pack_strip<kMR>(ap + static_cast<Index>(s) * kc * kMR, A + i * a_row + pc * a_col,
                            a_row, a_col, w, kc);
          }
          // Column strip outermost: the B strip stays in L1 across the A strips.
          for (int sj = part * n_strips / parts; sj < (part + 1) * n_strips / parts; sj++) {
            for (int si = 0; si < m_strips; si++) {
              const int i = ic + si * kMR, j = jc + sj * kNR;
              micro_kernel(kc, ap + static_cast<Index>(si) * kc * kMR,
                           bp + static_cast<Index>(sj) * kc * kNR,
                           C + static_cast<Index>(i) * ldc + j, ldc, M - i < kMR ? M - i : kMR,
                           N - j < kNR ? N - j : kNR, alpha);
            }
          }
        }
      }
    }
  }
}

}  // namespace sr1
