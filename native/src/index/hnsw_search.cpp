#include "index/hnsw_search.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "index/topk.h"
#include "util/error.h"

namespace sr1 {
namespace {

using Results = topk::Max<int64_t>;    // the k best distances: the worst on top
using QueueOrder = topk::Max<int32_t>; // the candidate queue, the worst on top

// The distance of a query to a row: sum over i of q_i·x_i (inner product) or (q_i − x_i)²,
// in 16 partial sums (one per SIMD lane) added at the end, as a vectorised
// fvec_inner_product / fvec_L2sqr sums them. `x(i)` loads element i of the row.
template <bool L2, class Row>
float lane_sum(const float* q, const Row& x, int d) {
  constexpr int kLanes = 16;
  float part[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    for (int j = 0; j < kLanes; j++) {
      const float v = x(i + j);
      part[j] += L2 ? (q[i + j] - v) * (q[i + j] - v) : q[i + j] * v;
    }
  }
  float s = 0;
  for (int j = 0; j < kLanes; j++) s += part[j];
  for (; i < d; i++) s += L2 ? (q[i] - x(i)) * (q[i] - x(i)) : q[i] * x(i);
  return s;
}

// Distances ("smaller is better") from one query to stored vectors (faiss's
// DistanceComputer). Rows are read where they are mapped
// (unaligned: memcpy loads), not copied first: the copy took a third of the search's time.
// An fp16 copy (keep_fp16) is converted row by row instead.
class QueryDistance {
 public:
  QueryDistance(const FaissIndex& index, const float* query)
      : index_(index), query_(query), row_(index.d) {}
  float operator()(int32_t id) {
    const int d = index_.d;
    if (index_.vectors_f16) {
      index_.copy_rows(id, 1, row_.data());
      const float* x = row_.data();
      return finish(sum([x](int i) { return x[i]; }));
    }
    const unsigned char* mapped = index_.vectors.bytes + uint64_t(id) * uint64_t(d) * 4;
    return finish(sum([mapped](int i) {
      float v;
      std::memcpy(&v, mapped + 4 * i, 4);
      return v;
    }));
  }

 private:
  template <class Row>
  float sum(const Row& x) const {
    return index_.metric == Metric::L2 ? lane_sum<true>(query_, x, index_.d)
                                       : lane_sum<false>(query_, x, index_.d);
  }
  float finish(float s) const { return index_.metric == Metric::L2 ? s : -s; }

  const FaissIndex& index_;
  const float* query_;
  std::vector<float> row_;
};

// faiss's VisitedTable: a mark per node, cleared lazily by bumping the mark value.
class Visited {
 public:
  explicit Visited(int64_t n) : marks_(n, 0) {}
  // Marks node i; true when it was not marked yet.
  bool set(int32_t i) {
    if (marks_[i] == mark_) return false;
    marks_[i] = mark_;
    return true;
  }
  void next_query() {
    if (++mark_ == 250) {  // faiss's limit too; then really clear
      std::fill(marks_.begin(), marks_.end(), 0);
      mark_ = 1;
    }
  }

 private:
  std::vector<uint8_t> marks_;
  uint8_t mark_ = 1;
};

// faiss's MinimaxHeap: a max-heap of at most n candidates (the worst leaves when a better
// one arrives), from which the best is taken by a linear scan and marked done (id -1) but
// left in place: count_below still counts it, and it can still be pushed out.
class CandidateQueue {
 public:
  explicit CandidateQueue(int n) : n_(n), ids_(n), dis_(n) {}
  int size() const { return nvalid_; }

  void push(int32_t id, float dis) {
    if (k_ == n_) {
      if (!QueueOrder::cmp(dis_[0], dis)) return;  // not better than the worst
      if (ids_[0] != -1) nvalid_--;
      topk::pop<QueueOrder>(k_--, dis_.data(), ids_.data());
    }
    topk::push<QueueOrder>(++k_, dis_.data(), ids_.data(), dis, id);
    nvalid_++;
  }

  // The best live candidate; among equal distances the last in heap order (as faiss).
  int32_t pop_min(float* dis) {
    int i = k_ - 1;
    while (i >= 0 && ids_[i] == -1) i--;
    if (i < 0) return -1;
    int best = i;
    for (i--; i >= 0; i--) {
      if (ids_[i] != -1 && dis_[i] < dis_[best]) best = i;
    }
    *dis = dis_[best];
    const int32_t id = ids_[best];
    ids_[best] = -1;
    nvalid_--;
    return id;
  }

  // Candidates, done or not, strictly closer than `dis`.
  int count_below(float dis) const {
    int n = 0;
    for (int i = 0; i < k_; i++) n += dis_[i] < dis ? 1 : 0;
    return n;
  }

 private:
  int n_, k_ = 0, nvalid_ = 0;
  std::vector<int32_t> ids_;
  std::vector<float> dis_;
};

// Node `node`'s neighbours on `level` (at most the level's slot count; stops at -1),
// checked against the graph's bounds because they come from the file.
int neighbors(const FaissIndex& index, int32_t node, int level, std::vector<int32_t>& out) {
  const HnswGraph& g = index.hnsw;
  const uint64_t begin = g.offsets[node] + g.cum_nneighbor_per_level[level];
  const int slots = g.neighbor_slots(level);
  if (level + 1 > g.levels[node]) {
    throw Error(index.path + ": HNSW node " + std::to_string(node) + " is reached on level " +
                std::to_string(level) + " but has no such level");
  }
  out.resize(slots);
  g.neighbors.copy(begin, slots, out.data());
  int n = 0;
  while (n < slots && out[n] >= 0) {
    if (out[n] >= index.ntotal) {
      throw Error(index.path + ": HNSW neighbour " + std::to_string(out[n]) + " of node " +
                  std::to_string(node) + " is not a node (ntotal = " +
                  std::to_string(index.ntotal) + ")");
    }
    n++;
  }
  return n;
}

// Step 1: on one level, move to a strictly closer neighbour until there is none.
void greedy_descend(const FaissIndex& index, QueryDistance& dist, int level, int32_t& nearest,
                    float& d_nearest, std::vector<int32_t>& buf) {
  for (;;) {
    const int32_t previous = nearest;
    const int n = neighbors(index, previous, level, buf);
    for (int j = 0; j < n; j++) {
      const float d = dist(buf[j]);
      if (d < d_nearest) nearest = buf[j], d_nearest = d;
    }
    if (nearest == previous) return;
  }
}

// Offers a distance to the k results (faiss's HeapResultHandler::add_result).
void add_result(int k, float* val, int64_t* ids, float d, int32_t id) {
  if (Results::cmp(val[0], d)) topk::replace_top<Results>(k, val, ids, d, int64_t(id));
}

// Step 2: the beam search on level 0 from `entry` (faiss's search_from_candidates).
void search_level0(const FaissIndex& index, QueryDistance& dist, int32_t entry, float d_entry,
                   int k, int ef_search, Visited& visited, std::vector<int32_t>& buf,
                   float* val, int64_t* ids) {
  CandidateQueue candidates(std::max(ef_search, k));
  candidates.push(entry, d_entry);
  add_result(k, val, ids, d_entry, entry);
  visited.set(entry);
  while (candidates.size() > 0) {
    float d0 = 0;
    const int32_t v0 = candidates.pop_min(&d0);
    // Stop once efSearch candidates seen so far are closer than the best left.
    if (candidates.count_below(d0) >= ef_search) break;
    const int n = neighbors(index, v0, 0, buf);
    for (int j = 0; j < n; j++) {
      if (!visited.set(buf[j])) continue;
      const float d = dist(buf[j]);
      add_result(k, val, ids, d, buf[j]);
      candidates.push(buf[j], d);
    }
  }
}

void search_one(const FaissIndex& index, const float* query, int k, int ef_search,
                Visited& visited, std::vector<int32_t>& buf, float* val, int64_t* ids) {
  topk::heapify<Results>(k, val, ids);
  const HnswGraph& g = index.hnsw;
  if (g.entry_point >= 0) {
    QueryDistance dist(index, query);
    int32_t nearest = g.entry_point;
    float d_nearest = dist(nearest);
    for (int level = g.max_level; level >= 1; level--) {
      greedy_descend(index, dist, level, nearest, d_nearest, buf);
    }
    search_level0(index, dist, nearest, d_nearest, k, ef_search, visited, buf, val, ids);
    visited.next_query();
  }
  topk::reorder<Results>(k, val, ids);
  if (index.metric == Metric::InnerProduct) {
    for (int j = 0; j < k; j++) val[j] = ids[j] >= 0 ? -val[j] : topk::Min<int64_t>::neutral();
  }
}

}  // namespace

TopK hnsw_search(const FaissIndex& index, const float* queries, int nq, int k, int ef_search) {
  if (!index.has_hnsw) throw Error(index.path + ": not an HNSW index (" + index.fourcc + ")");
  if (k < 1) throw Error("k must be >= 1");
  const int ef = ef_search > 0 ? ef_search : index.hnsw.ef_search;
  TopK r;
  r.nq = nq;
  r.k = k;
  r.ids.resize(size_t(nq) * k);
  r.scores.resize(size_t(nq) * k);
  std::string error;  // exceptions must not leave an OpenMP region
#pragma omp parallel
  {
    Visited visited(index.ntotal);
    std::vector<int32_t> buf;
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < nq; i++) {
      try {
        search_one(index, queries + size_t(i) * index.d, k, ef, visited, buf,
                   r.scores.data() + size_t(i) * k, r.ids.data() + size_t(i) * k);
      } catch (const std::exception& e) {
#pragma omp critical
        if (error.empty()) error = e.what();
      }
    }
  }
  if (!error.empty()) throw Error(error);
  return r;
}

}  // namespace sr1
