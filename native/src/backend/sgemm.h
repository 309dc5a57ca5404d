// The one matrix product the CPU backend needs, C = alpha * op(A) op(B) + beta * C on
// row-major fp32 matrices (cblas_sgemm with CblasRowMajor). `sgemm` calls OpenBLAS where
// the build found it (SR1_HAVE_CBLAS) and the portable kernel of sgemm_portable.cpp
// otherwise, so that the native core builds on a machine with only a C++ compiler.
#pragma once

namespace sr1 {

enum class Trans { No, Yes };  // op(X) = X or X^T

// op(A) is M x K, op(B) is K x N, C is M x N; lda, ldb, ldc are the row strides of the
// matrices as stored (A is K x M when transposed). beta == 0 overwrites C, NaNs included.
void sgemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);

// y = alpha * A x + beta * y, A an M x K row-major matrix (lda its row stride): the product
// of a matrix with one vector, which sgemm would compute at a fraction of the speed (it
// first copies the whole matrix into its blocked layout, and a vector reuses none of it).
// beta == 0 overwrites y. OpenBLAS's where the build has it, else `dots` (dots.h). Its sums
// may round differently from sgemm's.
void sgemv(int M, int K, float alpha, const float* A, int lda, const float* x, float beta,
           float* y);

// The portable kernel itself (compiled in every build: searchr1-gemm-check tests and times
// sgemm's).
void sgemm_portable(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                    int lda, const float* B, int ldb, float beta, float* C, int ldc);

// Threads for sgemm: OpenBLAS keeps its own pool; the portable kernel uses OpenMP's.
void set_sgemm_threads(int n);

// While one is alive, `sgemm` runs on its calling thread alone, so that the threads of an
// OpenMP region can each multiply their own matrices, with results that do not depend on
// the thread count (OpenBLAS would otherwise start its own pool inside ours; the portable
// kernel's nested region is inactive anyway). Create it outside the region.
class SerialSgemm {
 public:
  SerialSgemm();
  ~SerialSgemm();
  SerialSgemm(const SerialSgemm&) = delete;
  SerialSgemm& operator=(const SerialSgemm&) = delete;

 private:
  int threads_ = 0;  // OpenBLAS's thread count before, restored after
};

// "openblas" or "portable": which one `sgemm` calls.
const char* sgemm_library();

}  // namespace sr1
