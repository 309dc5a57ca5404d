// The dot products of dots.h: a register tile of MR a rows x kNR b rows, each pair summed in
// a vector of 16 lanes over k, written with GCC/Clang vector types so that the compiler maps
// a 16-lane vector onto one AVX-512 register, two AVX ones or four SSE/NEON ones.
#include "backend/dots.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

// GCC notes that passing a 64-byte vector by value would follow a different ABI on machines
// without AVX-512; these functions are internal and inlined, so no ABI is involved.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace sr1 {
namespace {

using Index = std::ptrdiff_t;

constexpr int kLanes = 16;
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

// The tile: MR x kNR accumulators of 16 lanes must fit the registers beside the kNR b
// vectors and one a vector. AVX-512 (32 registers of 16 floats): 4 x 6 sums; AVX (16 of 8,
// two per sum): 2 x 2; SSE/NEON (four per sum): 1 x 2.
#if defined(__AVX512F__)
constexpr int kMR = 4, kNR = 6;
#elif defined(__AVX__)
constexpr int kMR = 2, kNR = 2;
#else
constexpr int kMR = 1, kNR = 2;
#endif

Lanes load(const float* p) {  // unaligned: a memcpy the compiler turns into one load
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Lane m of the result is lanes l and l + g of x and y side by side (32 lanes: x's, then
// y's), where l is the m-th lane that starts the first half of a 2g-lane group. From two
// vectors of 16 / (2g) sums in groups of 2g lanes, one of twice as many sums in groups of g.
constexpr int half_group(int m, int g) { return m / g * 2 * g + m % g; }

template <int g, std::size_t... m>
Lanes fold_pair(const Lanes& x, const Lanes& y, std::index_sequence<m...>) {
  return __builtin_shufflevector(x, y, half_group(m, g)...) +
         __builtin_shufflevector(x, y, (half_group(m, g) + g)...);
}

template <int g>
Lanes fold_pair(const Lanes& x, const Lanes& y) {
  return fold_pair<g>(x, y, std::make_index_sequence<kLanes>{});
}

// One level of the tree: w[0..n) to w[0..(n + 1) / 2), each pair folded at group size g
// (an odd last vector is folded with itself; the copy of its sums is never read).
template <int g, int n>
void fold_level(Lanes* w) {
  for (int i = 0; i < (n + 1) / 2; i++) {
    w[i] = fold_pair<g>(w[2 * i], w[std::min(2 * i + 1, n - 1)]);
  }
}

// out[i] = the 16 lanes of v[i] added, for i < N: lane l + lane l + 8, then + 4, + 2, + 1
// (the order of dots.h), up to sixteen vectors at a time in a tree of shuffled adds (15 for
// sixteen sums, 4 + 2 + 1 + 1 for six) instead of one reduction per vector.
template <int N>
void reduce(const Lanes* v, float* out) {
  constexpr int n = std::min(N, kLanes), n8 = (n + 1) / 2, n4 = (n8 + 1) / 2, n2 = (n4 + 1) / 2;
  Lanes w[n];
  for (int i = 0; i < n; i++) w[i] = v[i];
  fold_level<8, n>(w);
  fold_level<4, n8>(w);
  fold_level<2, n4>(w);
  fold_level<1, n2>(w);
  for (int i = 0; i < n; i++) out[i] = w[0][i];
  if constexpr (N > kLanes) reduce<N - kLanes>(v + kLanes, out + kLanes);
}

// The n < 16 floats at p, then zeros.
Lanes load_partial(const float* p, int n) {
  Lanes v = {};
  std::memcpy(&v, p, n * sizeof(float));
  return v;
}

// sums[i * kNR + j] = a[i] · b[j] for i < MR, j < kNR.
template <int MR>
void tile(int k, const float* const* a, const float* const* b, float* sums) {
  Lanes acc[MR * kNR];
  // The first step adds its products to a zero register (the same sums as adding them to
  // zeroed accumulators: `acc = {}` compiled to a memset of the array, 4 % of a batch).
  const auto step = [&](auto load_at, auto first) {
    Lanes bv[kNR];
    for (int j = 0; j < kNR; j++) bv[j] = load_at(b[j]);
    for (int i = 0; i < MR; i++) {
      const Lanes av = load_at(a[i]);
      for (int j = 0; j < kNR; j++) {
        Lanes& sum = acc[i * kNR + j];
        sum = (first ? Lanes{} : sum) + av * bv[j];
      }
    }
  };
  const auto full = [](int p) { return [p](const float* row) { return load(row + p); }; };
  // Terms past k are lanes of zeros (load_partial); with k < 16 the first step is one.
  const auto partial = [k](int p) {
    return [p, k](const float* row) { return load_partial(row + p, k - p); };
  };
  if (k >= kLanes) {
    step(full(0), std::true_type{});
  } else {
    step(partial(0), std::true_type{});
  }
  int p = kLanes;
  for (; p + kLanes <= k; p += kLanes) step(full(p), std::false_type{});
  if (p < k) step(partial(p), std::false_type{});
  reduce<MR * kNR>(acc, sums);
}

// tile<mr> for a run-time mr in 1..MR.
template <int MR>
void tile_rows(int mr, int k, const float* const* a, const float* const* b, float* sums) {
  if constexpr (MR > 1) {
    if (mr < MR) return tile_rows<MR - 1>(mr, k, a, b, sums);
  }
  tile<MR>(k, a, b, sums);
}

// The kNR b pointers of the tile starting at row j0 of n: past the end, the last row again
// (its sums are computed and dropped; every pair is summed on its own, so this changes no
// other result).
template <class Row>
void tile_columns(int j0, int n, const Row& row, const float** b) {
  for (int j = 0; j < kNR; j++) b[j] = row(std::min(j0 + j, n - 1));
}

// Rows of k floats that start on a 64-byte boundary: where they are, or copied. A load that
// straddles two cache lines costs about two, and rows rarely start on a line (a faiss
// file's vectors at byte 45, a malloc'd block at 16): aligned, a tile of 64 queries x 768
// ran 1.7x faster (one thread: 106 vs 64 GFLOP/s), for one extra pass over each row.
class AlignedRows {
 public:
  // rows[i] = row(i) for i < n, each copied unless it starts on a line.
  template <class Row>
  const float* const* take(int n, int k, const Row& row) {
    const std::size_t stride = (k + kLanes - 1) / kLanes * kLanes;
    rows_.resize(n);
    copies_.resize(n * stride / kLanes);
    for (int i = 0; i < n; i++) {
      rows_[i] = row(i);
      if (reinterpret_cast<std::uintptr_t>(rows_[i]) % sizeof(Lanes) == 0) continue;
      float* to = reinterpret_cast<float*>(copies_.data()) + i * stride;
      rows_[i] = static_cast<const float*>(std::memcpy(to, rows_[i], k * sizeof(float)));
    }
    return rows_.data();
  }

 private:
  std::vector<const float*> rows_;
  std::vector<Lanes> copies_;  // aligned by its type
};

// Writes a tile's sums to C.
void store(const float* sums, int mr, int nr, float alpha, float beta, float* c, Index ldc) {
  for (int i = 0; i < mr; i++, c += ldc) {
    for (int j = 0; j < nr; j++) {
      c[j] = alpha * sums[i * kNR + j] + (beta == 0.0f ? 0.0f : beta * c[j]);
    }
  }
}

// The part-th of `parts` shares of the cache lines of rows [j, j + n), asked for ahead:
// spread over the passes of one tile, the next tile's rows arrive from memory while this
// one is multiplied, and copying them then reads L1 (the copies took 22 % of a batch of 64
// queries without, 8 % with).
void prefetch_share(const float* B, Index ldb, int j, int n, int k, int part, int parts) {
  const int per_row = k / kLanes + 1;  // a row's lines, its last element's included
  for (int l = n * per_row * part / parts; l < n * per_row * (part + 1) / parts; l++) {
    const float* row = B + (j + l / per_row) * ldb;
    __builtin_prefetch(row + std::max(0, std::min(l % per_row * kLanes, k - 1)), 0, 3);
  }
}

// A's rows are aligned once per call. B's are aligned a tile at a time when A has at least
// this many rows; with fewer the product is bound by reading B from memory, and copying its
// rows only added work (0.8x at 1 to 4 rows, even at 8 and 16, 1.2x at 24 and 32).
constexpr int kAlignBFromRows = 20;

// dots over the b rows [j_begin, j_end), on the calling thread: each tile of kNR b rows is
// multiplied with all of A's from L1.
void dots_range(int j_begin, int j_end, int m, int k, float alpha, const float* A, Index lda,
                const float* B, Index ldb, float beta, float* C, Index ldc) {
  thread_local AlignedRows a_rows, b_rows;
  const float* const* a = a_rows.take(m, k, [&](int i) { return A + i * lda; });
  const bool align_b = m >= kAlignBFromRows;
  const int passes = (m + kMR - 1) / kMR;
  const float* bp[kNR];
  float sums[kMR * kNR];
  for (int j0 = j_begin; j0 < j_end; j0 += kNR) {
    tile_columns(j0, j_end, [&](int j) { return B + j * ldb; }, bp);
    const float* const* b = align_b ? b_rows.take(kNR, k, [&](int j) { return bp[j]; }) : bp;
    const int next = std::clamp(j_end - j0 - kNR, 0, kNR);
    for (int i0 = 0; i0 < m; i0 += kMR) {
      if (align_b) prefetch_share(B, ldb, j0 + kNR, next, k, i0 / kMR, passes);
      const int mr = std::min(kMR, m - i0);
      tile_rows<kMR>(mr, k, a + i0, b, sums);
      store(sums, mr, std::min(kNR, j_end - j0), alpha, beta, C + i0 * ldc + j0, ldc);
    }
  }
}

}  // namespace

void dots(int m, int n, int k, float alpha, const float* A, Index lda, const float* B,
          Index ldb, float beta, float* C, Index ldc) {
  if (m <= 0 || n <= 0) return;
  const int tiles = (n + kNR - 1) / kNR;
  // Each thread takes a contiguous run of tiles, so its b rows stream in order. Small
  // products stay on one thread: waking the others would cost more than they save.
#pragma omp parallel if (double(m) * n * k >= 1 << 18)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int j_begin = std::min(n, tiles * t / nt * kNR);
    const int j_end = std::min(n, tiles * (t + 1) / nt * kNR);
    dots_range(j_begin, j_end, m, k, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

void dots_gathered(int n, int k, const float* a, const float* const* rows, float* out) {
  const float* b[kNR];
  float sums[kNR];
  for (int j0 = 0; j0 < n; j0 += kNR) {
    tile_columns(j0, n, [&](int j) { return rows[j]; }, b);
    tile<1>(k, &a, b, sums);
    std::copy(sums, sums + std::min(kNR, n - j0), out + j0);
  }
}

}  // namespace sr1
