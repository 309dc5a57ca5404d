// Exact (flat) k-nearest-neighbour search over a faiss index's vectors, with faiss's
// semantics (faiss/utils/distances.cpp knn_inner_product / knn_L2sqr):
//   inner product: scores are q·x, best first = descending;
//   L2: scores are squared distances |q|² + |x|² - 2 q·x (negative round-off clamped to 0),
//       best first = ascending.
// Ids are row numbers. Each query's top k is kept in a faiss heap fed with the rows in id
// order, so the result is faiss's: a row enters only when strictly better than the worst
// kept, and bitwise-equal scores come out in faiss's heap order (for inner product the
// higher id first, for L2 the lower id first). k > ntotal leaves id -1 and the worst
// possible score (-FLT_MAX for inner product, FLT_MAX for L2) in the missing places.
//
// Each round, every thread multiplies all queries by its own block of rows with `dots`
// (backend/dots.h), which reads the rows once, where they lie in the (unaligned) mapped
// file: sgemm would first copy them into its blocked layout, which costs as much as reading
// them. Then the threads split the queries and feed that round's blocks, in row order, into
// each query's heap. With keep_fp16 (faiss_io.h) the rows are first converted from the fp16
// copy in memory into the thread's buffer (a block, or for a few queries a slice that stays
// in L2), so scores differ from faiss's fp32 ones by fp16 rounding, as with faiss's GPU index
// in float16.
#pragma once
#include <cstdint>
#include <vector>

#include "index/faiss_io.h"

namespace sr1 {

// Results of a batch of queries: row q's k ids and scores at [q*k, (q+1)*k).
struct TopK {
  int nq = 0, k = 0;
  std::vector<int64_t> ids;
  std::vector<float> scores;
};

struct FlatSearchOptions {
  int block_rows = 1024;  // database rows per thread per round (faiss's bs_y)
  // Queries per scan of the matrix: every tile of rows is multiplied with all of them from
  // L2 (128 x 768 floats: 384 KiB). 512 at a time spilled to L3: 512 queries of d = 768 in
  // 1.74-1.81 s against 1.17-1.58 s in scans of 128 (64: 1.64-1.87 s, the matrix read 8 times).
  int query_batch = 128;
};

// queries: nq rows of index.d floats. Uses all OpenMP threads.
TopK flat_search(const FaissIndex& index, const float* queries, int nq, int k,
                 const FlatSearchOptions& options = {});

}  // namespace sr1
