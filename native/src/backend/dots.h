// Dot products of a few rows with many rows that are read where they lie, once each:
// out[i][j] = a_i · b_j. This is the product sgemm handles worst: when one side has a few
// rows (a decode step of a few sequences against a weight matrix, a batch of queries against
// a block of an index, one query against a handful of HNSW neighbours), sgemm spends much of
// its time copying the large side into its blocked layout and then reuses little of that
// copy. Here each b row is read from where it is (any alignment: a memory-mapped faiss file
// starts its vectors at byte 45) and multiplied with every a row while it sits in L1; where
// there are enough a rows to make the product compute-bound, a few b rows at a time are
// first copied to cache-line-aligned storage (a load that straddles two lines costs two).
//
// Every dot product is summed the same way, whatever the shapes, the place of the pair in a
// tile, the thread count or the machine's vector width: 16 lanes (lane l accumulates the
// terms with index ≡ l mod 16, in index order, with fused multiply-adds where the machine
// has them), then the lanes folded in halves (l + 8, then + 4, + 2, + 1). So a row's
// results are the same alone or in a batch.
#pragma once

#include <cstddef>

namespace sr1 {

// C = alpha * A Bᵀ + beta * C, row-major: A is m x k (row stride lda), B is n x k (ldb), C is
// m x n (ldc). beta == 0 overwrites C, NaNs included. B's rows are split among the OpenMP
// threads (inside a parallel region: the calling thread does all). Faster than sgemm for m up
// to a few dozen (each tile of b rows is reused from L1 across all of A's rows).
void dots(int m, int n, int k, float alpha, const float* A, std::ptrdiff_t lda, const float* B,
          std::ptrdiff_t ldb, float beta, float* C, std::ptrdiff_t ldc);

// out[j] = a · rows[j] for j < n: one row against rows gathered from anywhere (the
// neighbours of an HNSW node), loaded side by side so their cache misses overlap. Runs on
// the calling thread.
void dots_gathered(int n, int k, const float* a, const float* const* rows, float* out);

}  // namespace sr1
