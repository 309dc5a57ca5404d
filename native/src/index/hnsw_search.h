// Approximate k-nearest-neighbour search in an IndexHNSWFlat graph with faiss's algorithm
// (faiss/impl/HNSW.cpp: HNSW::search, greedy_update_nearest, search_from_candidates;
// MinimaxHeap), so that the same file and efSearch give faiss's results:
//   1. from the entry point, a greedy descent on levels max_level .. 1: move to the best
//      neighbour while one is strictly better;
//   2. on level 0, a beam search from that node: a bounded candidate queue of
//      max(efSearch, k) entries, expanding the best unexpanded candidate until efSearch
//      already-seen candidates are better than it; every distance computed is offered to
//      a k-heap of results.
// Distances are "smaller is better": squared L2, or the negated inner product as faiss
// has long computed them (recent faiss compares the similarities themselves, which decides
// everything the same way but the order of bitwise-equal values); the scores returned are
// the inner products again. Results
// are ordered as flat_search orders them (best first; id -1 where fewer than k were found).
#pragma once

#include "index/faiss_io.h"
#include "index/flat_search.h"

namespace sr1 {

// ef_search 0 uses the efSearch stored in the file. Queries run in parallel (OpenMP).
TopK hnsw_search(const FaissIndex& index, const float* queries, int nq, int k, int ef_search = 0);

}  // namespace sr1
