#include "index/flat_search.h"

#include <omp.h>

#include <algorithm>

#include "backend/dots.h"
#include "index/topk.h"
#include "util/error.h"

namespace sr1 {
namespace {

// |x|², x a row that may be unaligned (in the mapped file).
float squared_norm(const float* x, int d) {
  float s = 0;
  for (int i = 0; i < d; i++) s += row_element(x, i) * row_element(x, i);
  return s;
}

// Rows of an fp16 copy converted at a time for a few queries (at most kFewQueries): 192 KiB
// at d = 768, multiplied while in L2; converting a whole block of 1024 first sends it out to
// L3 and back, which a scan for one query (memory-bound) pays for: 1.5x faster at batch 1.
// With many queries the products dominate and whole blocks were faster (0.85x in slices at
// batch 64).
constexpr int kConvertRows = 64;
constexpr int kFewQueries = 16;

// What one thread computes for one block: the queries' scores against the block's rows
// (nq x rows, row-major); `vectors` holds rows converted from an fp16 copy.
struct Block {
  int64_t first = 0;
  int rows = 0;
  std::vector<float> vectors, scores, norms;
};

// scores = queries · rowsᵀ, read from the mapping where they lie (or converted from the fp16
// copy a slice at a time), then turned into squared L2 distances the way faiss's BLAS path
// does (so that scores agree to round-off with faiss's).
void score_block(const FaissIndex& index, const float* queries, const float* query_norms,
                 int nq, Block& b) {
  const int d = index.d;
  const int slice = index.converted() && nq <= kFewQueries ? kConvertRows : b.rows;
  for (int j0 = 0; j0 < b.rows; j0 += slice) {
    const int n = std::min(slice, b.rows - j0);
    const float* rows = index.mapped_rows(b.first + j0);
    if (rows == nullptr) {
      index.copy_rows(b.first + j0, n, b.vectors.data());
      rows = b.vectors.data();
    }
    dots(nq, n, d, 1.0f, queries, d, rows, d, 0.0f, b.scores.data() + j0, b.rows);
    if (index.metric != Metric::L2) continue;
    for (int j = 0; j < n; j++) b.norms[j0 + j] = squared_norm(rows + size_t(j) * d, d);
  }
  if (index.metric != Metric::L2) return;
  for (int i = 0; i < nq; i++) {
    float* s = b.scores.data() + size_t(i) * b.rows;
    for (int j = 0; j < b.rows; j++) {
      const float dis = query_norms[i] + b.norms[j] - 2 * s[j];
      s[j] = dis < 0 ? 0 : dis;  // round-off can make a vector's distance to itself < 0
    }
  }
}

// Feeds query i's scores of one block into its heap, rows in id order (faiss's
// HeapBlockResultHandler::add_results). Once the heap is full few scores beat its worst:
// runs of kRun scores are first compared with it all at once (vectorised) and skipped
// when none does.
template <class C>
void add_block(const Block& b, int i, int k, float* val, int64_t* ids) {
  constexpr int kRun = 16;
  const float* s = b.scores.data() + size_t(i) * b.rows;
  float worst = val[0];
  for (int j0 = 0; j0 < b.rows; j0 += kRun) {
    const int end = std::min(b.rows, j0 + kRun);
    bool any = false;
#pragma omp simd reduction(|| : any)
    for (int j = j0; j < end; j++) any = any || C::cmp(worst, s[j]);
    if (!any) continue;
    for (int j = j0; j < end; j++) {
      if (C::cmp(worst, s[j])) {
        topk::replace_top<C>(k, val, ids, s[j], b.first + j);
        worst = val[0];
      }
    }
  }
}

// One scan of the whole matrix for nq queries; val/ids are nq heaps of k.
template <class C>
void scan(const FaissIndex& index, const float* queries, int nq, int k, int block_rows,
          float* val, int64_t* ids) {
  std::vector<float> query_norms(nq);
  for (int i = 0; i < nq; i++) {
    query_norms[i] = squared_norm(queries + size_t(i) * index.d, index.d);
  }
  for (int i = 0; i < nq; i++) topk::heapify<C>(k, val + size_t(i) * k, ids + size_t(i) * k);
  std::vector<Block> blocks(omp_get_max_threads());
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    Block& mine = blocks[t];  // allocated by the thread that uses it (first touch)
    if (index.converted()) mine.vectors.resize(size_t(block_rows) * index.d);
    mine.scores.resize(size_t(block_rows) * nq);
    mine.norms.resize(block_rows);
    const int64_t round_rows = int64_t(nt) * block_rows;
    for (int64_t round = 0; round < index.ntotal; round += round_rows) {
      mine.first = round + int64_t(t) * block_rows;
      mine.rows = int(std::clamp<int64_t>(index.ntotal - mine.first, 0, block_rows));
      if (mine.rows > 0) score_block(index, queries, query_norms.data(), nq, mine);
#pragma omp barrier
#pragma omp for schedule(static)
      for (int i = 0; i < nq; i++) {
        float* v = val + size_t(i) * k;
        int64_t* id = ids + size_t(i) * k;
        for (int b = 0; b < nt; b++) {
          if (blocks[b].rows > 0) add_block<C>(blocks[b], i, k, v, id);
        }
      }  // the implicit barrier here frees the blocks for the next round
    }
  }
  for (int i = 0; i < nq; i++) topk::reorder<C>(k, val + size_t(i) * k, ids + size_t(i) * k);
}

}  // namespace

TopK flat_search(const FaissIndex& index, const float* queries, int nq, int k,
                 const FlatSearchOptions& options) {
  if (k < 1) throw Error("k must be >= 1");
  TopK r;
  r.nq = nq;
  r.k = k;
  r.ids.resize(size_t(nq) * k);
  r.scores.resize(size_t(nq) * k);
  // The threads split the rows themselves (dots inside their region runs on the caller).
  const int batch = std::max(1, options.query_batch);
  for (int q0 = 0; q0 < nq; q0 += batch) {
    const int n = std::min(batch, nq - q0);
    const float* q = queries + size_t(q0) * index.d;
    float* val = r.scores.data() + size_t(q0) * k;
    int64_t* ids = r.ids.data() + size_t(q0) * k;
    if (index.metric == Metric::L2) {
      scan<topk::Max<int64_t>>(index, q, n, k, options.block_rows, val, ids);
    } else {
      scan<topk::Min<int64_t>>(index, q, n, k, options.block_rows, val, ids);
    }
  }
  return r;
}

}  // namespace sr1
