#include "index/hnsw_search.h"

#include <omp.h>

#include <algorithm>
#include <memory>
#include <string>

#include "backend/dots.h"
#include "index/topk.h"
#include "index/visited.h"
#include "util/error.h"

namespace sr1 {
namespace {

using Results = topk::Max<int64_t>;    // the k best distances: the worst on top
using QueueOrder = topk::Max<int32_t>; // the candidate queue, the worst on top

// The squared L2 distance of a query to a row (unaligned: memcpy loads), in 16 partial sums
// (one per SIMD lane) added at the end, as a vectorised fvec_L2sqr sums them.
float l2_sum(const float* q, const float* x, int d) {
  constexpr int kLanes = 16;
  const auto diff2 = [q, x](int i) {
    const float t = q[i] - row_element(x, i);
    return t * t;
  };
  float part[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    for (int j = 0; j < kLanes; j++) part[j] += diff2(i + j);
  }
  float s = 0;
  for (int j = 0; j < kLanes; j++) s += part[j];
  for (; i < d; i++) s += diff2(i);
  return s;
}

// Distances ("smaller is better") from one query to stored vectors (faiss's
// DistanceComputer). Rows are read where they are mapped (unaligned: memcpy loads), not
// copied first: the copy took a third of the search's time. An fp16 copy (keep_fp16) is
// converted row by row instead. Inner products are taken several rows at a time (dots.h),
// which overlaps their cache misses as faiss's distances_batch_4 does.
class QueryDistance {
 public:
  QueryDistance(const FaissIndex& index, const float* query) : index_(index), query_(query) {}

  float operator()(int32_t id) {
    float d;
    batch(&id, 1, &d);
    return d;
  }

  // out[j] = the distance to row ids[j], for j < n.
  void batch(const int32_t* ids, int n, float* out) {
    const float* const* rows = rows_of(ids, n);
    if (index_.metric == Metric::InnerProduct) {
      dots_gathered(n, index_.d, query_, rows, out);
      for (int j = 0; j < n; j++) out[j] = -out[j];
    } else {
      for (int j = 0; j < n; j++) out[j] = l2_sum(query_, rows[j], index_.d);
    }
  }

 private:
  // The rows ids[0..n): where they are mapped, or converted from the fp16 copy.
  const float* const* rows_of(const int32_t* ids, int n) {
    rows_.resize(n);
    if (index_.converted()) converted_.resize(size_t(n) * index_.d);
    for (int j = 0; j < n; j++) {
      rows_[j] = index_.mapped_rows(ids[j]);
      if (rows_[j] == nullptr) {
        float* row = converted_.data() + size_t(j) * index_.d;
        index_.copy_rows(ids[j], 1, row);
        rows_[j] = row;
      }
    }
    return rows_.data();
  }

  const FaissIndex& index_;
  const float* query_;
  std::vector<float> converted_;
  std::vector<const float*> rows_;
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

// What a thread reuses from one query to the next.
struct Scratch {
  explicit Scratch(int64_t ntotal) : visited(ntotal) {}
  // This thread's scratch for an index of ntotal nodes, kept from call to call: a server
  // searching one query per call would otherwise allocate and clear a table of ntotal marks
  // for each (200 KB at 200,000 vectors), as long as a search at efSearch 16.
  static Scratch& of_thread(int64_t ntotal) {
    thread_local std::unique_ptr<Scratch> mine;
    if (!mine || mine->visited.size() != ntotal) mine = std::make_unique<Scratch>(ntotal);
    return *mine;
  }
  Visited visited;
  std::vector<int32_t> ids;  // a node's neighbours
  std::vector<float> dis;    // their distances
};

// Step 1: on one level, move to a strictly closer neighbour until there is none.
void greedy_descend(const FaissIndex& index, QueryDistance& dist, int level, int32_t& nearest,
                    float& d_nearest, Scratch& s) {
  for (;;) {
    const int32_t previous = nearest;
    const int n = neighbors(index, previous, level, s.ids);
    s.dis.resize(n);
    dist.batch(s.ids.data(), n, s.dis.data());
    for (int j = 0; j < n; j++) {
      if (s.dis[j] < d_nearest) nearest = s.ids[j], d_nearest = s.dis[j];
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
                   int k, int ef_search, Scratch& s, float* val, int64_t* ids) {
  CandidateQueue candidates(std::max(ef_search, k));
  candidates.push(entry, d_entry);
  add_result(k, val, ids, d_entry, entry);
  s.visited.set(entry);
  while (candidates.size() > 0) {
    float d0 = 0;
    const int32_t v0 = candidates.pop_min(&d0);
    // Stop once efSearch candidates seen so far are closer than the best left.
    if (candidates.count_below(d0) >= ef_search) break;
    // The unvisited neighbours (marked now, as faiss does before computing any), then
    // their distances in one batch, offered in neighbour order.
    const int n = neighbors(index, v0, 0, s.ids);
    int fresh = 0;
    for (int j = 0; j < n; j++) {
      if (s.visited.set(s.ids[j])) s.ids[fresh++] = s.ids[j];
    }
    s.dis.resize(fresh);
    dist.batch(s.ids.data(), fresh, s.dis.data());
    for (int j = 0; j < fresh; j++) {
      add_result(k, val, ids, s.dis[j], s.ids[j]);
      candidates.push(s.ids[j], s.dis[j]);
    }
  }
}

void search_one(const FaissIndex& index, const float* query, int k, int ef_search, Scratch& s,
                float* val, int64_t* ids) {
  topk::heapify<Results>(k, val, ids);
  const HnswGraph& g = index.hnsw;
  if (g.entry_point >= 0) {
    s.visited.next_query();  // first, so marks a failed search left behind never count
    QueryDistance dist(index, query);
    int32_t nearest = g.entry_point;
    float d_nearest = dist(nearest);
    for (int level = g.max_level; level >= 1; level--) {
      greedy_descend(index, dist, level, nearest, d_nearest, s);
    }
    search_level0(index, dist, nearest, d_nearest, k, ef_search, s, val, ids);
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
  // One query runs on the calling thread: waking the others would only cost (as in faiss).
#pragma omp parallel if (nq > 1)
  {
    Scratch& scratch = Scratch::of_thread(index.ntotal);
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < nq; i++) {
      try {
        search_one(index, queries + size_t(i) * index.d, k, ef, scratch,
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
