#include "index/kmeans.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "backend/sgemm.h"
#include "util/error.h"

namespace sr1 {

namespace {

// faiss's RandomGenerator (faiss/utils/random.cpp).
class FaissRng {
 public:
  explicit FaissRng(int64_t seed) : mt_(static_cast<unsigned int>(seed)) {}
  int rand_int(int max) { return static_cast<int>(mt_() % static_cast<uint32_t>(max)); }
  float rand_float() { return mt_() / static_cast<float>(std::mt19937::max()); }

 private:
  std::mt19937 mt_;
};

// fvec_renorm_L2: each row divided by its L2 norm (rows of norm 0 left as they are).
void renormalize(float* c, int k, int d) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < k; i++) {
    float* row = c + size_t(i) * d;
    float norm = 0;
    for (int j = 0; j < d; j++) norm += row[j] * row[j];
    if (norm > 0) {
      const float inv = 1 / std::sqrt(norm);
      for (int j = 0; j < d; j++) row[j] *= inv;
    }
  }
}

// compute_centroids: each centroid the mean of its points, summed in point order by the
// thread that owns its range of centroids; hassign gets each cluster's size.
void compute_centroids(const float* x, int64_t n, int d, int k, const int32_t* assign,
                       float* hassign, float* c) {
  std::fill(c, c + size_t(k) * d, 0.f);
  std::fill(hassign, hassign + k, 0.f);
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), rank = omp_get_thread_num();
    const int c0 = int(int64_t(k) * rank / nt), c1 = int(int64_t(k) * (rank + 1) / nt);
    for (int64_t i = 0; i < n; i++) {
      const int ci = assign[i];
      if (ci < c0 || ci >= c1) continue;
      hassign[ci] += 1;
      float* row = c + size_t(ci) * d;
      const float* xi = x + size_t(i) * d;
      for (int j = 0; j < d; j++) row[j] += xi[j];
    }
  }
#pragma omp parallel for schedule(static)
  for (int ci = 0; ci < k; ci++) {
    if (hassign[ci] == 0) continue;
    const float norm = 1 / hassign[ci];
    float* row = c + size_t(ci) * d;
    for (int j = 0; j < d; j++) row[j] *= norm;
  }
}

// split_clusters: an empty cluster takes a copy of one drawn with probability proportional
// to its size beyond one, both nudged apart by ±1/1024 on alternate components.
void split_clusters(int64_t n, int d, int k, float* hassign, float* c) {
  constexpr float kEps = 1 / 1024.f;
  FaissRng rng(1234);
  for (int ci = 0; ci < k; ci++) {
    if (hassign[ci] != 0) continue;
    int cj = 0;
    for (;; cj = (cj + 1) % k) {
      const float p = (hassign[cj] - 1.0f) / static_cast<float>(n - k);
      if (rng.rand_float() < p) break;
    }
    float* a = c + size_t(ci) * d;
    float* b = c + size_t(cj) * d;
    std::memcpy(a, b, sizeof(float) * d);
    for (int j = 0; j < d; j++) {
      if (j % 2 == 0) {
        a[j] *= 1 + kEps;
        b[j] *= 1 - kEps;
      } else {
        a[j] *= 1 - kEps;
        b[j] *= 1 + kEps;
      }
    }
    hassign[ci] = hassign[cj] / 2;
    hassign[cj] -= hassign[ci];
  }
}

}  // namespace

std::vector<int> faiss_rand_perm(int64_t n, int64_t seed) {
  if (n >= (int64_t{1} << 31)) throw Error("rand_perm: at most 2^31 - 1 points");
  std::vector<int> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) perm[i] = static_cast<int>(i);
  FaissRng rng(seed);
  for (int64_t i = 0; i + 1 < n; i++) {
    const int64_t i2 = i + rng.rand_int(static_cast<int>(n - i));
    std::swap(perm[i], perm[i2]);
  }
  return perm;
}

void assign_nearest(const float* x, int64_t n, int d, const float* centroids, int k,
                    bool inner_product, int32_t* out) {
  // Blocks of rows whose scores against all centroids take at most 64 MiB.
  const int64_t block = std::clamp<int64_t>((int64_t{1} << 24) / std::max(k, 1), 1, 4096);
  std::vector<float> norms(k, 0.f), scores(size_t(std::min(block, n)) * k);
  if (!inner_product) {
    for (int j = 0; j < k; j++) {
      const float* c = centroids + size_t(j) * d;
      float s = 0;
      for (int t = 0; t < d; t++) s += c[t] * c[t];
      norms[j] = s;
    }
  }
  for (int64_t i0 = 0; i0 < n; i0 += block) {
    const int b = static_cast<int>(std::min(block, n - i0));
    sgemm(Trans::No, Trans::Yes, b, k, d, 1.0f, x + size_t(i0) * d, d, centroids, d, 0.0f,
          scores.data(), k);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < b; i++) {
      const float* s = scores.data() + size_t(i) * k;
      int best = 0;
      if (inner_product) {
        float top = s[0];
        for (int j = 1; j < k; j++) {
          if (s[j] > top) top = s[j], best = j;
        }
      } else {  // |x - c|² less |x|², the same for every centroid
        float top = norms[0] - 2 * s[0];
        for (int j = 1; j < k; j++) {
          const float v = norms[j] - 2 * s[j];
          if (v < top) top = v, best = j;
        }
      }
      out[i0 + i] = best;
    }
  }
}

std::vector<float> kmeans(const float* x, int64_t n, int d, int k, const KMeansOptions& options) {
  if (k < 1) throw Error("k-means needs at least one centroid");
  if (n < k) {
    throw Error("k-means of " + std::to_string(n) + " points into " + std::to_string(k) +
                " clusters: needs at least as many points as clusters");
  }
  for (int64_t i = 0; i < n * d; i++) {  // faiss checks too: "input contains NaN's or Inf's"
    if (!std::isfinite(x[i])) {
      throw Error("k-means: point " + std::to_string(i / d) + " holds a NaN or an infinity");
    }
  }
  std::vector<float> c(size_t(k) * d);
  if (n == k) {  // faiss: "just copying"
    std::memcpy(c.data(), x, sizeof(float) * c.size());
    return c;
  }
  const std::vector<int> perm = faiss_rand_perm(n, options.seed + 1);
  for (int i = 0; i < k; i++) {
    std::memcpy(c.data() + size_t(i) * d, x + size_t(perm[i]) * d, sizeof(float) * d);
  }
  if (options.spherical) renormalize(c.data(), k, d);
  std::vector<int32_t> assign(static_cast<size_t>(n));
  std::vector<float> hassign(k);
  for (int it = 0; it < options.niter; it++) {
    assign_nearest(x, n, d, c.data(), k, options.inner_product, assign.data());
    compute_centroids(x, n, d, k, assign.data(), hassign.data(), c.data());
    split_clusters(n, d, k, hassign.data(), c.data());
    if (options.spherical) renormalize(c.data(), k, d);
    if (options.progress) options.progress(it + 1, options.niter);
  }
  return c;
}

}  // namespace sr1
