// sgemm's dispatch: OpenBLAS when CMake found it, else the portable kernels.
#include "backend/sgemm.h"

#ifdef SR1_HAVE_CBLAS
#include <cblas.h>
#else
#include "backend/dots.h"
#endif

namespace sr1 {

#ifdef SR1_HAVE_CBLAS

void sgemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  const auto op = [](Trans t) { return t == Trans::Yes ? CblasTrans : CblasNoTrans; };
  cblas_sgemm(CblasRowMajor, op(ta), op(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void sgemv(int M, int K, float alpha, const float* A, int lda, const float* x, float beta,
           float* y) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, M, K, alpha, A, lda, x, 1, beta, y, 1);
}
void set_sgemm_threads(int n) { openblas_set_num_threads(n); }
SerialSgemm::SerialSgemm() : threads_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
SerialSgemm::~SerialSgemm() { openblas_set_num_threads(threads_); }
const char* sgemm_library() { return "openblas"; }

#else

void sgemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  sgemm_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void sgemv(int M, int K, float alpha, const float* A, int lda, const float* x, float beta,
           float* y) {
  dots(1, M, K, alpha, x, K, A, lda, beta, y, M);
}
void set_sgemm_threads(int) {}  // omp_set_num_threads, which the caller does, is enough
SerialSgemm::SerialSgemm() = default;
SerialSgemm::~SerialSgemm() = default;
const char* sgemm_library() { return "portable"; }

#endif

}  // namespace sr1
