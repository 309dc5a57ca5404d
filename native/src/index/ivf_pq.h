// faiss's IndexIVFPQ ('IwPQ': faiss/IndexIVFPQ.cpp, faiss/IndexIVF.cpp; read_ivfpq and
// read_InvertedLists "ilar" in faiss/impl/index_read.cpp) as an opened file holds it, and
// its search:
//   - a coarse quantizer, an IndexFlatIP / IndexFlatL2 of nlist centroids (index_factory's
//     "IVF{nlist}" makes the one of the index's metric);
//   - a ProductQuantizer (product_quantizer.h) coding each vector's residual from its
//     list's centroid (by_residual, index_factory's choice) or the vector itself;
//   - nlist inverted lists, each its entries' codes then their ids (int64), where they lie
//     in the mapped file.
// Search (faiss 1.7.3's IndexIVF::search, search_preassigned with parallel_mode 0, and
// IVFPQScanner with precompute_mode 2): the query's nprobe nearest centroids by an exact
// search of the quantizer (flat_search.h), then each of those lists in that order, each
// entry scored
//   inner product: <q, centroid> + Σ_m table[m][code_m], table = q's inner products with
//                  the PQ centroids (without by_residual: the sum alone);
//   L2:            Σ_m table[m][code_m], table = the squared distances of the residual
//                  q - centroid (or of q) to the PQ centroids (faiss's
//                  use_precomputed_table 0 way; the table faiss precomputes for L2 gives
//                  the same sums up to rounding),
// and offered to a heap of k (topk.h: a score enters when strictly better than the worst
// kept), which is then sorted best first. The sum runs over m in order, as faiss's
// generic (non-AVX2) build sums it; ids are the file's.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "index/faiss_io.h"
#include "index/flat_search.h"
#include "index/product_quantizer.h"

namespace sr1 {

struct IvfPq {
  int64_t nlist = 0;
  int64_t nprobe = 1;  // the file's (faiss's index.nprobe; 1 unless its writer set another)
  bool by_residual = true;
  FaissIndex quantizer;  // the IndexFlat of the centroids, in the same mapping
  ProductQuantizer pq;
  // List i: sizes[i] entries, their codes at codes[i] (sizes[i] * code_size bytes) and ids
  // at ids[i] (sizes[i] int64, unaligned), in the mapped file.
  std::vector<int64_t> sizes;
  std::vector<const unsigned char*> codes, ids;
  uint64_t lists_offset = 0, lists_bytes = 0;  // where the lists' data lie in the file

  int64_t id_at(int64_t list, int64_t j) const {
    int64_t v;
    std::memcpy(&v, ids[list] + j * sizeof(int64_t), sizeof v);
    return v;
  }
};

// index.ivf's search of nq queries (nq x d) for k results each, probing nprobe lists (cut to
// nlist; 0: the file's nprobe). Queries run in parallel (OpenMP). Results as flat_search's:
// best first, id -1 and the worst score where fewer than k entries were scanned.
TopK ivfpq_search(const FaissIndex& index, const float* queries, int nq, int k, int nprobe);

}  // namespace sr1
