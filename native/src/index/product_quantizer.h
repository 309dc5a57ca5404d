// faiss's ProductQuantizer (faiss/impl/ProductQuantizer.h, .cpp, ProductQuantizer-inl.h) as
// an IndexIVFPQ holds it: a vector of d floats cut into M sub-vectors of dsub = d / M, each
// coded as the index of its nearest of ksub = 2^nbits centroids (L2), the M indexes packed
// nbits each, low bits first, into code_size = ceil(M·nbits / 8) bytes (PQEncoderGeneric;
// with nbits 8 a byte each). centroids is faiss's table: sub-quantizer m's centroid j at
// [(m·ksub + j)·dsub, +dsub).
//   - train: each sub-quantizer by k-means of its slice of the training vectors (kmeans.h,
//     faiss's Clustering defaults: 25 iterations, seed 1234, L2);
//   - encode: the nearest centroid per sub-vector (the first of equals);
//   - tables: a query's inner products (compute_inner_prod_table) or squared L2 distances
//     (compute_distance_table) to every centroid, M x ksub, from which a code's product or
//     distance is the sum of its M entries (the asymmetric distance IndexIVFPQ scans with).
// faiss 1.7.3's IndexIVFPQ takes nbits 1..8 (its constructor refuses more); so does this.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

namespace sr1 {

struct ProductQuantizer {
  int d = 0, M = 0, nbits = 8;
  std::vector<float> centroids;  // M * ksub * dsub

  int dsub() const { return d / M; }
  int ksub() const { return 1 << nbits; }
  uint64_t code_size() const { return (uint64_t(M) * nbits + 7) / 8; }
  const float* centroid(int m, int j) const {
    return centroids.data() + (size_t(m) * ksub() + j) * dsub();
  }

  // Sub-code m of a code (any address).
  static uint32_t code_at(const unsigned char* code, int m, int nbits) {
    if (nbits == 8) return code[m];
    const uint64_t bit = uint64_t(m) * nbits;
    uint32_t v = code[bit >> 3];
    if ((bit & 7) + nbits > 8) v |= uint32_t(code[(bit >> 3) + 1]) << 8;
    return (v >> (bit & 7)) & ((1u << nbits) - 1);
  }

  // Trains on n vectors (n >= ksub); `progress` gets the sub-quantizers done after each.
  void train(const float* x, int64_t n, const std::function<void(int done, int total)>& progress);
  // Makes the transposed copy encode and the tables read: call after train or after
  // filling `centroids`.
  void prepare();
  void encode(const float* x, uint8_t* code) const;
  // table[m * ksub + j] = <x_m, centroid(m, j)>, or |x_m - centroid(m, j)|².
  void inner_product_table(const float* x, float* table) const;
  void distance_table(const float* x, float* table) const;

 private:
  // out[j] = the sum over sub-vector m's components t of term(x[m·dsub + t], centroid(m, j)[t]),
  // for the ksub centroids j (a row of the tables above).
  template <typename Term>
  void sub_table(const float* x, int m, float* out, Term term) const;

  // Sub-quantizer m's centroids transposed, [m][t][j]: a sub-vector's products or distances
  // to all ksub centroids are then one vectorised loop over j per component t.
  std::vector<float> transposed_;
};

}  // namespace sr1
