// k-means as faiss's Clustering runs it with its default ClusteringParameters (faiss
// faiss/Clustering.cpp, Clustering::train_encoded, compute_centroids, split_clusters,
// post_process_centroids; faiss/utils/random.cpp, RandomGenerator and rand_perm), the
// clustering behind an IndexIVF's coarse quantizer and a ProductQuantizer's sub-quantizers:
//   - init: the first k points of rand_perm(n, seed + 1) (seed 1234: faiss's default);
//   - niter (25) iterations of: assign each point to its nearest centroid (the largest inner
//     product for an inner-product quantizer, as the IndexFlatIP faiss clusters with; else
//     the smallest L2 distance), each centroid the mean of its points (summed in point
//     order, one thread per range of centroids), empty clusters re-seeded by splitting a
//     large one (RandomGenerator(1234), faiss's pick and its ±1/1024 perturbation), and
//     with `spherical` (what index_factory sets for an inner-product IVF) the centroids
//     renormalised to unit length, as after the init;
//   - n == k: the points are the centroids.
// Sampling a training set (faiss's subsample_training_set, at most 256 points a centroid)
// is the caller's: it reads only the sampled rows of a file that may not fit in memory.
// Distances are products from sgemm (backend/sgemm.h) in blocks, which round differently
// from faiss's BLAS: a point equidistant to two centroids may join the other, so the
// centroids are faiss's in law, not bit for bit.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace sr1 {

// faiss's rand_perm(perm, n, seed): 0..n-1 shuffled by Fisher-Yates, each swap drawn by
// RandomGenerator(seed).rand_int(n - i) (a mt19937 seeded with the seed's low 32 bits).
std::vector<int> faiss_rand_perm(int64_t n, int64_t seed);

struct KMeansOptions {
  int niter = 25;
  bool inner_product = false;  // assign by the largest inner product (IndexFlatIP)
  bool spherical = false;      // renormalise the centroids after each update
  int64_t seed = 1234;
  // After each iteration: (iterations done, niter). Called from the calling thread.
  std::function<void(int done, int total)> progress;
};

// k centroids (k x d, row-major) of the n points x (n x d); n must be >= k (faiss refuses
// fewer training points than clusters).
std::vector<float> kmeans(const float* x, int64_t n, int d, int k, const KMeansOptions& options);

// out[i] = the centroid nearest to x[i] (by inner product when inner_product, else L2), the
// lowest index among equals; in blocks, in parallel (OpenMP and sgemm's threads).
void assign_nearest(const float* x, int64_t n, int d, const float* centroids, int k,
                    bool inner_product, int32_t* out);

}  // namespace sr1
