#include "backend/cpu_adamw.h"

#include <omp.h>

#include <cmath>
#include <vector>

namespace sr1::cpu {

// Partials added in thread order (as cpu_backend.cpp's column_sums), so the norm is
// reproducible.
double sum_squares(const float* x, size_t n) {
  std::vector<double> partial(omp_get_max_threads(), 0.0);
#pragma omp parallel
  {
    double s = 0;
#pragma omp for schedule(static)
    for (size_t i = 0; i < n; i++) s += static_cast<double>(x[i]) * x[i];
    partial[omp_get_thread_num()] = s;
  }
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

void accumulate(float* dst, const float* src, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& a) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), a.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), a.step);
  const float step_size = static_cast<float>(a.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - a.lr * a.weight_decay;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; i++) {
    const float grad = g[i] * a.grad_scale;
    m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * grad;
    v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * grad * grad;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + a.eps;
    p[i] = p[i] * decay - step_size * m[i] / denom;
  }
}

}  // namespace sr1::cpu
