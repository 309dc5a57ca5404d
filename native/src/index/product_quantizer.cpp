#include "index/product_quantizer.h"

#include <string>

#include "index/kmeans.h"
#include "util/error.h"

namespace sr1 {

void ProductQuantizer::train(const float* x, int64_t n,
                             const std::function<void(int done, int total)>& progress) {
  const int ds = dsub(), ks = ksub();
  if (n < ks) {
    throw Error("PQ training needs at least ksub = " + std::to_string(ks) + " vectors, got " +
                std::to_string(n));
  }
  centroids.assign(size_t(M) * ks * ds, 0.f);
  std::vector<float> slice(size_t(n) * ds);
  for (int m = 0; m < M; m++) {
    for (int64_t i = 0; i < n; i++) {
      std::memcpy(slice.data() + size_t(i) * ds, x + size_t(i) * d + size_t(m) * ds,
                  sizeof(float) * ds);
    }
    const std::vector<float> c = kmeans(slice.data(), n, ds, ks, KMeansOptions{});
    std::memcpy(centroids.data() + size_t(m) * ks * ds, c.data(), sizeof(float) * c.size());
    if (progress) progress(m + 1, M);
  }
  prepare();
}

void ProductQuantizer::prepare() {
  const int ds = dsub(), ks = ksub();
  transposed_.resize(centroids.size());
  for (int m = 0; m < M; m++) {
    for (int j = 0; j < ks; j++) {
      for (int t = 0; t < ds; t++) {
        transposed_[(size_t(m) * ds + t) * ks + j] = centroids[(size_t(m) * ks + j) * ds + t];
      }
    }
  }
}

// The L2 table, the inner-product table and encode's search for the nearest centroid are one
// loop that differs only in the term it sums: sub_table, with these two.
namespace {
constexpr auto squared_difference = [](float a, float b) {
  const float diff = a - b;
  return diff * diff;
};
constexpr auto product = [](float a, float b) { return a * b; };
}  // namespace

template <typename Term>
void ProductQuantizer::sub_table(const float* x, int m, float* out, Term term) const {
  const int ds = dsub(), ks = ksub();
  for (int j = 0; j < ks; j++) out[j] = 0;
  for (int t = 0; t < ds; t++) {
    const float xt = x[m * ds + t];
    const float* ct = transposed_.data() + (size_t(m) * ds + t) * ks;
    for (int j = 0; j < ks; j++) out[j] += term(xt, ct[j]);
  }
}

void ProductQuantizer::distance_table(const float* x, float* table) const {
  for (int m = 0; m < M; m++) sub_table(x, m, table + size_t(m) * ksub(), squared_difference);
}

void ProductQuantizer::inner_product_table(const float* x, float* table) const {
  for (int m = 0; m < M; m++) sub_table(x, m, table + size_t(m) * ksub(), product);
}

void ProductQuantizer::encode(const float* x, uint8_t* code) const {
  const int ks = ksub();
  float dist[256];  // ksub <= 256
  std::memset(code, 0, code_size());
  for (int m = 0; m < M; m++) {
    sub_table(x, m, dist, squared_difference);  // distance_table's row m
    uint32_t best = 0;
    for (int j = 1; j < ks; j++) {
      if (dist[j] < dist[best]) best = uint32_t(j);
    }
    const uint64_t bit = uint64_t(m) * nbits;  // PQEncoderGeneric: low bits first
    const uint32_t shifted = best << (bit & 7);
    code[bit >> 3] |= uint8_t(shifted);
    if ((bit & 7) + nbits > 8) code[(bit >> 3) + 1] |= uint8_t(shifted >> 8);
  }
}

}  // namespace sr1
