// searchr1-gemm-check: the portable sgemm against a plain triple loop (in double) on shapes
// that hit every edge of its tiling (1 x N, M x 1, sizes off the tile multiples, M, N and K
// across a cache block, K = 0), all four transpose cases, beta 0/1/other and strides wider
// than the rows, `dots` likewise (B's rows unaligned), then the batch- and thread-invariance
// of both. Prints "ok: ..." or the first mismatch (and exits 1). With --bench M N K: GFLOP/s
// of the portable kernel and of `sgemm` (OpenBLAS where the build has it) in the three cases
// the CPU backend calls, and of `dots` in the forward one.
// Built on demand, not by `npm install`: cmake --build <dir> --target searchr1-gemm-check.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "backend/dots.h"
#include "backend/sgemm.h"

using sr1::Trans;

namespace {

struct Case {
  int M, N, K;
};

// op(X)[r][c] of a matrix stored with row stride ld.
float at(const std::vector<float>& X, Trans t, int ld, int r, int c) {
  return t == Trans::No ? X[static_cast<size_t>(r) * ld + c] : X[static_cast<size_t>(c) * ld + r];
}

std::vector<float> random_matrix(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Runs one case; returns false (after printing why) when an element is off by more than a
// relative 1e-5 of the sum of |terms| that make it.
bool check(const Case& s, Trans ta, Trans tb, float alpha, float beta, std::mt19937& rng) {
  const int pad = 3;  // strides wider than the rows
  const int a_rows = ta == Trans::No ? s.M : s.K, a_cols = ta == Trans::No ? s.K : s.M;
  const int b_rows = tb == Trans::No ? s.K : s.N, b_cols = tb == Trans::No ? s.N : s.K;
  const int lda = a_cols + pad, ldb = b_cols + pad, ldc = s.N + pad;
  const std::vector<float> A = random_matrix(static_cast<size_t>(a_rows) * lda, rng);
  const std::vector<float> B = random_matrix(static_cast<size_t>(b_rows) * ldb, rng);
  std::vector<float> C = random_matrix(static_cast<size_t>(s.M) * ldc, rng);
  if (beta == 0.0f) {  // beta 0 must not read C: NaNs there must not come through
    for (float& x : C) x = std::nanf("");
  }
  const std::vector<float> C0 = C;
  sr1::sgemm_portable(ta, tb, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(),
                      ldc);
  for (int i = 0; i < s.M; i++) {
    for (int j = 0; j < s.N; j++) {
      double sum = 0, mag = 0;
      for (int k = 0; k < s.K; k++) {
        const double t = static_cast<double>(at(A, ta, lda, i, k)) * at(B, tb, ldb, k, j);
        sum += t;
        mag += std::fabs(t);
      }
      const size_t ij = static_cast<size_t>(i) * ldc + j;
      const double c0 = beta == 0.0f ? 0.0 : static_cast<double>(beta) * C0[ij];
      const double want = alpha * sum + c0;
      const double tol = 1e-5 * (std::fabs(alpha) * mag + std::fabs(c0)) + 1e-30;
      if (!(std::fabs(C[ij] - want) <= tol)) {
        std::printf("FAIL M=%d N=%d K=%d ta=%d tb=%d alpha=%g beta=%g: C[%d][%d] = %.9g, "
                    "want %.9g\n",
                    s.M, s.N, s.K, ta == Trans::Yes, tb == Trans::Yes, alpha, beta, i, j, C[ij],
                    want);
        return false;
      }
    }
    for (int j = s.N; j < ldc; j++) {  // the padding between rows is left alone
      const size_t ij = static_cast<size_t>(i) * ldc + j;
      if (std::memcmp(&C[ij], &C0[ij], sizeof(float)) != 0) {
        std::printf("FAIL M=%d N=%d K=%d: wrote C[%d][%d] outside the matrix\n", s.M, s.N, s.K, i,
                    j);
        return false;
      }
    }
  }
  return true;
}

// dots against the same reference: C = alpha A Bᵀ + beta C, strides wider than the rows,
// and B's rows at an odd byte address (as in a memory-mapped faiss file).
bool check_dots(int M, int N, int K, float alpha, float beta, std::mt19937& rng) {
  const int lda = K + 3, ldb = K + 5, ldc = N + 2;
  const std::vector<float> A = random_matrix(static_cast<size_t>(M) * lda, rng);
  const std::vector<float> B = random_matrix(static_cast<size_t>(N) * ldb, rng);
  std::vector<unsigned char> odd(B.size() * sizeof(float) + 1);
  std::memcpy(odd.data() + 1, B.data(), B.size() * sizeof(float));
  const float* b_odd = reinterpret_cast<const float*>(odd.data() + 1);
  std::vector<float> C = random_matrix(static_cast<size_t>(M) * ldc, rng);
  if (beta == 0.0f) {  // beta 0 must not read C
    for (float& v : C) v = std::nanf("");
  }
  const std::vector<float> C0 = C;
  sr1::dots(M, N, K, alpha, A.data(), lda, b_odd, ldb, beta, C.data(), ldc);
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < ldc; j++) {
      const size_t ij = static_cast<size_t>(i) * ldc + j;
      if (j >= N) {  // the padding between rows is left alone
        if (std::memcmp(&C[ij], &C0[ij], sizeof(float)) == 0) continue;
        std::printf("FAIL dots M=%d N=%d K=%d: wrote C[%d][%d] outside the matrix\n", M, N, K,
                    i, j);
        return false;
      }
      double sum = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        const double t = static_cast<double>(A[static_cast<size_t>(i) * lda + k]) *
                         B[static_cast<size_t>(j) * ldb + k];
        sum += t;
        mag += std::fabs(t);
      }
      const double c0 = beta == 0.0f ? 0.0 : static_cast<double>(beta) * C0[ij];
      const double want = alpha * sum + c0;
      if (!(std::fabs(C[ij] - want) <= 1e-5 * (std::fabs(alpha) * mag + std::fabs(c0)) + 1e-30)) {
        std::printf("FAIL dots M=%d N=%d K=%d alpha=%g beta=%g: C[%d][%d] = %.9g, want %.9g\n",
                    M, N, K, alpha, beta, i, j, C[ij], want);
        return false;
      }
    }
  }
  return true;
}

// A product C = A Bᵀ of m rows of A (row stride K) with the same N x K matrix B.
using Product = std::function<void(int m, const float* A, const float* B, float* C)>;
constexpr int kInvN = 70, kInvK = 600, kInvRow = 5;

// Every element is summed in the same order whatever the shape and the thread count: a row
// of a 37-row product equals, bit for bit, the same row computed alone, and 1 thread gives
// what 3 give (the CPU backend's batch- and thread-invariance rests on this). Returns the
// row computed alone in `one`.
bool check_invariance(const char* name, const Product& product, std::mt19937& rng,
                      std::vector<float>& A, std::vector<float>& B, std::vector<float>& one) {
  const int M = 37, N = kInvN, K = kInvK, row = kInvRow;
  A = random_matrix(static_cast<size_t>(M) * K, rng);
  B = random_matrix(static_cast<size_t>(N) * K, rng);
  std::vector<float> all(static_cast<size_t>(M) * N), three(all.size());
  one.resize(N);
  product(M, A.data(), B.data(), all.data());
  product(1, A.data() + row * K, B.data(), one.data());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(3);
  product(M, A.data(), B.data(), three.data());
  omp_set_num_threads(threads);
  if (std::memcmp(one.data(), all.data() + row * N, N * sizeof(float)) != 0) {
    std::printf("FAIL: %s: a row computed alone differs from the same row in a batch\n", name);
    return false;
  }
  if (three != all) {
    std::printf("FAIL: %s: 3 threads give a different product than %d\n", name, threads);
    return false;
  }
  return true;
}

// Both kernels, and dots_gathered against dots over the same rows in another order.
bool check_invariance(std::mt19937& rng) {
  std::vector<float> A, B, one;
  const Product sgemm = [](int m, const float* A, const float* B, float* C) {
    sr1::sgemm_portable(Trans::No, Trans::Yes, m, kInvN, kInvK, 1.0f, A, kInvK, B, kInvK, 0.0f,
                        C, kInvN);
  };
  const Product dots = [](int m, const float* A, const float* B, float* C) {
    sr1::dots(m, kInvN, kInvK, 1.0f, A, kInvK, B, kInvK, 0.0f, C, kInvN);
  };
  if (!check_invariance("sgemm_portable", sgemm, rng, A, B, one) ||
      !check_invariance("dots", dots, rng, A, B, one)) {
    return false;
  }
  std::vector<const float*> rows(kInvN);
  for (int j = 0; j < kInvN; j++) rows[j] = B.data() + static_cast<size_t>(kInvN - 1 - j) * kInvK;
  std::vector<float> gathered(kInvN);
  sr1::dots_gathered(kInvN, kInvK, A.data() + kInvRow * kInvK, rows.data(), gathered.data());
  std::reverse(gathered.begin(), gathered.end());
  if (gathered != one) {
    std::printf("FAIL: dots_gathered differs from dots over the same rows\n");
    return false;
  }
  return true;
}

// The best of 5 timed rounds of `reps` calls: the machine may be shared, and the fastest
// round is the one least disturbed.
double seconds_per_call(int reps, const std::function<void()>& f) {
  f();  // warm-up: packing buffers, thread pool
  double best = 1e30;
  for (int round = 0; round < 5; round++) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; r++) f();
    const std::chrono::duration<double> t = std::chrono::steady_clock::now() - t0;
    best = std::min(best, t.count() / reps);
  }
  return best;
}

// The three cases the CPU backend calls: forward (A B^T), input gradient (A B), weight
// gradient (A^T B).
int bench(int M, int N, int K) {
  std::mt19937 rng(7);
  const std::vector<float> A = random_matrix(static_cast<size_t>(M) * K, rng);
  const std::vector<float> B = random_matrix(static_cast<size_t>(K) * N, rng);
  std::vector<float> C(static_cast<size_t>(M) * N);
  const double flop = 2.0 * M * N * K;
  const int reps = std::max(3, static_cast<int>(4e9 / flop));
  for (const auto& [ta, tb] : {std::pair{Trans::No, Trans::Yes}, {Trans::No, Trans::No},
                               {Trans::Yes, Trans::No}}) {
    const int lda = ta == Trans::No ? K : M, ldb = tb == Trans::No ? N : K;
    const double portable = seconds_per_call(reps, [&] {
      sr1::sgemm_portable(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(),
                          N);
    });
    const double dispatched = seconds_per_call(reps, [&] {
      sr1::sgemm(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), N);
    });
    std::printf(
        "bench M=%d N=%d K=%d op=%s threads=%d: portable %.1f GFLOP/s, %s %.1f GFLOP/s", M, N,
        K, ta == Trans::Yes ? "TN" : tb == Trans::Yes ? "NT" : "NN", omp_get_max_threads(),
        flop / portable / 1e9, sr1::sgemm_library(), flop / dispatched / 1e9);
    if (tb == Trans::Yes) {
      const double dots = seconds_per_call(reps, [&] {
        sr1::dots(M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
      });
      std::printf(", dots %.1f GFLOP/s", flop / dots / 1e9);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--bench") == 0) {
    return bench(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
  }
  std::printf("sgemm: %s\n", sr1::sgemm_library());
  const Case cases[] = {{1, 1, 1},     {1, 37, 5},    {29, 1, 300},    {1, 200, 600},
                        {7, 33, 17},   {9, 31, 256},  {9, 31, 257},    {130, 70, 513},
                        {61, 1100, 40}, {300, 2100, 3}, {64, 64, 0}};
  std::mt19937 rng(1);
  int n = 0;
  for (const Case& s : cases) {
    for (const Trans ta : {Trans::No, Trans::Yes}) {
      for (const Trans tb : {Trans::No, Trans::Yes}) {
        for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 0.25f}}) {
          if (!check(s, ta, tb, alpha, beta, rng)) return 1;
          n++;
        }
      }
    }
  }
  const Case dot_cases[] = {{1, 1, 1},  {1, 37, 5},   {3, 7, 16},  {5, 13, 17},  {4, 6, 48},
                            {9, 31, 600}, {33, 70, 47}, {2, 1100, 40}, {1, 300, 0}};
  for (const Case& s : dot_cases) {
    for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, {1.0f, 1.0f}, {-0.5f, 0.25f}}) {
      if (!check_dots(s.M, s.N, s.K, alpha, beta, rng)) return 1;
      n++;
    }
  }
  if (!check_invariance(rng)) return 1;
  std::printf("ok: %d cases match the reference; results are batch- and thread-invariant\n", n);
  return 0;
}
