#include "index/ivf_pq_build.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "index/kmeans.h"
#include "util/error.h"

namespace sr1 {

namespace {

constexpr int kMaxPointsPerCentroid = 256;  // ClusteringParameters defaults
constexpr int kMinPointsPerCentroid = 39;
constexpr int64_t kSeed = 1234;
constexpr int64_t kChunkRows = 16384;

// The training sample of `count` rows: all of them in row order when count is every row,
// else rows perm[0..count) in that order (subsample_training_set, fvecs_maybe_subsample).
std::vector<float> sample_rows(const FaissIndex& flat, const std::vector<int>& perm,
                               int64_t count) {
  std::vector<float> x(size_t(count) * flat.d);
  if (count == flat.ntotal) {
    flat.copy_rows(0, count, x.data());
    return x;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; i++) flat.copy_rows(perm[i], 1, x.data() + size_t(i) * flat.d);
  return x;
}

void note_few_points(const std::string& what, int64_t n, int64_t k, const char* clustering) {
  if (n >= k * kMinPointsPerCentroid) return;
  std::fprintf(stderr,
               "searchr1-index: note: %s: %s clusters %lld vectors into %lld centroids; faiss "
               "asks for at least %lld (%d a centroid) and warns with fewer\n",
               what.c_str(), clustering, static_cast<long long>(n), static_cast<long long>(k),
               static_cast<long long>(k * kMinPointsPerCentroid), kMinPointsPerCentroid);
}

}  // namespace

IvfPqBuilt build_ivfpq(const FaissIndex& flat, const IvfPqShape& shape, const std::string& what,
                       const std::function<void(const std::string&, int64_t, int64_t)>& progress) {
  const int64_t n = flat.ntotal;
  const int d = flat.d, ksub = 1 << shape.nbits;
  if (shape.nlist > n) {
    throw UsageError(what + ": " + std::to_string(shape.nlist) + " lists for " +
                     std::to_string(n) + " vectors; k-means needs at least one vector a list "
                     "(faiss refuses fewer training points than centroids)");
  }
  if (d % shape.M != 0) {
    throw UsageError(what + ": PQ" + std::to_string(shape.M) + " does not divide d = " +
                     std::to_string(d) + " into equal sub-vectors (M must divide d)");
  }
  if (n < ksub) {
    throw UsageError(what + ": " + std::to_string(n) + " vectors; each PQ sub-quantizer "
                     "clusters them into 2^" + std::to_string(shape.nbits) + " = " +
                     std::to_string(ksub) + " centroids, so it needs at least that many");
  }
  note_few_points(what, n, shape.nlist, "the coarse k-means");
  note_few_points(what, std::min<int64_t>(n, int64_t{kMaxPointsPerCentroid} * ksub), ksub,
                  "each PQ sub-quantizer's k-means");
  IvfPqBuilt b;
  b.d = d;
  b.ntotal = n;
  b.nlist = shape.nlist;
  const std::vector<int> perm = faiss_rand_perm(n, kSeed);
  {
    const int64_t count = std::min<int64_t>(n, int64_t{kMaxPointsPerCentroid} * shape.nlist);
    const std::vector<float> x = sample_rows(flat, perm, count);
    KMeansOptions o;
    o.inner_product = true;
    o.spherical = true;
    o.progress = [&](int done, int total) {
      if (progress) progress("clustering", done, total);
    };
    b.centroids = kmeans(x.data(), count, d, shape.nlist, o);
  }
  b.pq.d = d;
  b.pq.M = shape.M;
  b.pq.nbits = shape.nbits;
  {
    const int64_t count = std::min<int64_t>(n, int64_t{kMaxPointsPerCentroid} * ksub);
    std::vector<float> x = sample_rows(flat, perm, count);
    std::vector<int32_t> assign(static_cast<size_t>(count));
    assign_nearest(x.data(), count, d, b.centroids.data(), shape.nlist, true, assign.data());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; i++) {
      const float* c = b.centroids.data() + size_t(assign[i]) * d;
      float* xi = x.data() + size_t(i) * d;
      for (int t = 0; t < d; t++) xi[t] -= c[t];
    }
    b.pq.train(x.data(), count, [&](int done, int total) {
      if (progress) progress("quantizer", done, total);
    });
  }
  const uint64_t code_size = b.pq.code_size();
  b.list.resize(static_cast<size_t>(n));
  b.codes.resize(static_cast<size_t>(n) * code_size);
  std::vector<float> rows;
  for (int64_t r = 0; r < n; r += kChunkRows) {
    const int64_t m = std::min(kChunkRows, n - r);
    rows.resize(size_t(m) * d);
    flat.copy_rows(r, m, rows.data());
    assign_nearest(rows.data(), m, d, b.centroids.data(), shape.nlist, true, b.list.data() + r);
#pragma omp parallel
    {
      std::vector<float> residual(d);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < m; i++) {
        const float* c = b.centroids.data() + size_t(b.list[r + i]) * d;
        const float* xi = rows.data() + size_t(i) * d;
        for (int t = 0; t < d; t++) residual[t] = xi[t] - c[t];
        b.pq.encode(residual.data(), b.codes.data() + uint64_t(r + i) * code_size);
      }
    }
    if (progress) progress("encoding", r + m, n);
  }
  return b;
}

}  // namespace sr1
