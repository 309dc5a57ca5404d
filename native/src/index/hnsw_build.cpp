#include "index/hnsw_build.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <queue>
#include <random>
#include <string>

#include "backend/dots.h"
#include "index/visited.h"
#include "util/error.h"

namespace sr1 {

void hnsw_default_probas(int M, std::vector<double>& assign_probas,
                         std::vector<int32_t>& cum_nneighbor_per_level) {
  // HNSW::HNSW(M): set_default_probas(M, 1.0 / log(M)), the multiplier held as a float.
  const float mult = static_cast<float>(1.0 / std::log(M));
  assign_probas.clear();
  cum_nneighbor_per_level.assign(1, 0);
  int nn = 0;
  for (int level = 0;; level++) {
    const float proba =
        std::exp(-static_cast<float>(level) / mult) * (1 - std::exp(-1 / mult));
    if (proba < 1e-9) break;
    assign_probas.push_back(proba);
    nn += level == 0 ? 2 * M : M;
    cum_nneighbor_per_level.push_back(nn);
  }
}

namespace {

// faiss's NodeDistCloser / NodeDistFarther: ordered by distance only, so that
// std::priority_queue breaks ties as faiss's does. Closer's top is the farthest node.
struct Closer {
  float d;
  int32_t id;
  bool operator<(const Closer& o) const { return d < o.d; }
};
struct Farther {  // top: the nearest node
  float d;
  int32_t id;
  bool operator<(const Farther& o) const { return d > o.d; }
};

// Distances of one node (the "query": the node being inserted) to others, and between any
// two rows: negated inner products, summed as dots.h sums them.
class Distances {
 public:
  static constexpr int kBatch = 16;
  explicit Distances(const RowSource& source)
      : source_(source), d_(source.dim()), query_(d_), a_(d_), scratch_(size_t(kBatch + 1) * d_),
        rows_(kBatch) {}

  void set_query(int32_t id) { load(id, query_.data()); }
  float operator()(int32_t id) {
    float out;
    batch(&id, 1, &out);
    return out;
  }
  // out[j] = distance of the query to ids[j].
  void batch(const int32_t* ids, int n, float* out) { against(query_.data(), ids, n, out); }
  // out[j] = distance of row `a` to ids[j].
  void from(int32_t a, const int32_t* ids, int n, float* out) {
    load(a, a_.data());
    against(a_.data(), ids, n, out);
  }

 private:
  void load(int32_t id, float* dst) {
    const float* r = source_.row(id, scratch_.data());
    std::memcpy(dst, r, sizeof(float) * d_);
  }
  void against(const float* a, const int32_t* ids, int n, float* out) {
    for (int j0 = 0; j0 < n; j0 += kBatch) {
      const int m = std::min(kBatch, n - j0);
      for (int j = 0; j < m; j++) {
        rows_[j] = source_.row(ids[j0 + j], scratch_.data() + size_t(j + 1) * d_);
      }
      dots_gathered(m, d_, a, rows_.data(), out + j0);
      for (int j = 0; j < m; j++) out[j0 + j] = -out[j0 + j];
    }
  }

  const RowSource& source_;
  int d_;
  std::vector<float> query_, a_, scratch_;
  std::vector<const float*> rows_;
};

// A node lock per node (faiss's LockVector of omp locks).
class Locks {
 public:
  explicit Locks(int64_t n) : locks_(n) {
    for (auto& l : locks_) omp_init_lock(&l);
  }
  ~Locks() {
    for (auto& l : locks_) omp_destroy_lock(&l);
  }
  void lock(int32_t i) { omp_set_lock(&locks_[i]); }
  void unlock(int32_t i) { omp_unset_lock(&locks_[i]); }

 private:
  std::vector<omp_lock_t> locks_;
};

class Builder {
 public:
  Builder(HnswGraphData& g, const RowSource& source, int64_t n)
      : g_(g), source_(source), locks_(n) {}

  // Inserts `pt` (of top level pt_level) with this thread's distances and visited table.
  void add(int32_t pt, int pt_level, Distances& dis, Visited& visited) {
    dis.set_query(pt);
    int32_t nearest = entry();
    if (nearest < 0) {
      std::lock_guard<std::mutex> guard(entry_mutex_);
      if (g_.entry_point < 0) {
        g_.entry_point = pt;
        g_.max_level = pt_level;
        return;
      }
      nearest = g_.entry_point;
    }
    locks_.lock(pt);
    int level = max_level();
    float d_nearest = dis(nearest);
    for (; level > pt_level; level--) greedy(dis, level, nearest, d_nearest);
    for (; level >= 0; level--) add_links(dis, visited, pt, nearest, d_nearest, level);
    locks_.unlock(pt);
    if (pt_level > max_level()) {
      std::lock_guard<std::mutex> guard(entry_mutex_);
      if (pt_level > g_.max_level) {
        g_.max_level = pt_level;
        g_.entry_point = pt;
      }
    }
  }

 private:
  int32_t entry() {
    std::lock_guard<std::mutex> guard(entry_mutex_);
    return g_.entry_point;
  }
  int max_level() {
    std::lock_guard<std::mutex> guard(entry_mutex_);
    return g_.max_level;
  }
  int32_t get(uint64_t i) const { return __atomic_load_n(&g_.neighbors[i], __ATOMIC_RELAXED); }
  void put(uint64_t i, int32_t v) { __atomic_store_n(&g_.neighbors[i], v, __ATOMIC_RELAXED); }
  void range(int32_t node, int level, uint64_t* begin, uint64_t* end) const {
    *begin = g_.offsets[node] + g_.cum_nneighbor_per_level[level];
    *end = g_.offsets[node] + g_.cum_nneighbor_per_level[level + 1];
  }
  // The node's neighbours on `level`, up to the first empty slot.
  void list(int32_t node, int level, std::vector<int32_t>& out) const {
    uint64_t begin, end;
    range(node, level, &begin, &end);
    out.clear();
    for (uint64_t j = begin; j < end; j++) {
      const int32_t v = get(j);
      if (v < 0) break;
      out.push_back(v);
    }
  }

  // greedy_update_nearest: move to a strictly closer neighbour while there is one.
  void greedy(Distances& dis, int level, int32_t& nearest, float& d_nearest) {
    for (;;) {
      const int32_t previous = nearest;
      list(previous, level, ids_);
      dist_.resize(ids_.size());
      dis.batch(ids_.data(), int(ids_.size()), dist_.data());
      for (size_t j = 0; j < ids_.size(); j++) {
        if (dist_[j] < d_nearest) nearest = ids_[j], d_nearest = dist_[j];
      }
      if (nearest == previous) return;
    }
  }

  // search_neighbors_to_add: a beam of efConstruction nodes on `level` from `entry`.
  void search(Distances& dis, Visited& visited, int32_t entry, float d_entry, int level,
              std::priority_queue<Closer>& results) {
    const size_t ef = static_cast<size_t>(g_.ef_construction);
    std::priority_queue<Farther> candidates;
    candidates.push({d_entry, entry});
    results.push({d_entry, entry});
    visited.set(entry);
    while (!candidates.empty()) {
      const Farther current = candidates.top();
      if (current.d > results.top().d) break;
      candidates.pop();
      list(current.id, level, ids_);
      size_t fresh = 0;
      for (size_t j = 0; j < ids_.size(); j++) {
        if (visited.set(ids_[j])) ids_[fresh++] = ids_[j];
      }
      dist_.resize(fresh);
      dis.batch(ids_.data(), int(fresh), dist_.data());
      for (size_t j = 0; j < fresh; j++) {
        if (results.size() < ef || results.top().d > dist_[j]) {
          results.push({dist_[j], ids_[j]});
          candidates.push({dist_[j], ids_[j]});
          if (results.size() > ef) results.pop();
        }
      }
    }
    visited.next_query();
  }

  // shrink_neighbor_list: nearest first, a node is kept when no kept node is closer to it
  // than the query is; at most max_size.
  void shrink(Distances& dis, std::priority_queue<Farther>& input, std::vector<Farther>& output,
              size_t max_size) {
    std::vector<int32_t> kept;
    std::vector<float> d_kept;
    while (!input.empty()) {
      const Farther v1 = input.top();
      input.pop();
      kept.clear();
      for (const Farther& v2 : output) kept.push_back(v2.id);
      d_kept.resize(kept.size());
      bool good = true;
      // In fours, stopping at the first kept node closer to v1 than the query.
      for (size_t j0 = 0; good && j0 < kept.size(); j0 += 4) {
        const int m = int(std::min<size_t>(4, kept.size() - j0));
        dis.from(v1.id, kept.data() + j0, m, d_kept.data() + j0);
        for (int j = 0; j < m; j++) {
          if (d_kept[j0 + j] < v1.d) good = false;
        }
      }
      if (good) {
        output.push_back(v1);
        if (output.size() >= max_size) return;
      }
    }
  }

  // faiss 1.7.3's shrink_neighbor_list(qdis, resultSet1, max_size): a list of max_size or
  // more is cut by the heuristic.
  void shrink_closer(Distances& dis, std::priority_queue<Closer>& set, size_t max_size) {
    if (set.size() < max_size) return;
    std::priority_queue<Farther> input;
    while (!set.empty()) {
      input.push({set.top().d, set.top().id});
      set.pop();
    }
    std::vector<Farther> output;
    shrink(dis, input, output, max_size);
    for (const Farther& f : output) set.push({f.d, f.id});
  }

  // add_link: dest into src's list on `level`, re-cut by the heuristic when full.
  void add_link(Distances& dis, int32_t src, int32_t dest, int level) {
    uint64_t begin, end;
    range(src, level, &begin, &end);
    if (get(end - 1) == -1) {
      uint64_t i = end;
      while (i > begin && get(i - 1) == -1) i--;
      put(i, dest);
      return;
    }
    std::vector<int32_t> ids(end - begin + 1);
    ids[0] = dest;
    for (uint64_t i = begin; i < end; i++) ids[1 + i - begin] = get(i);
    std::vector<float> d(ids.size());
    dis.from(src, ids.data(), int(ids.size()), d.data());
    std::priority_queue<Closer> set;
    for (size_t j = 0; j < ids.size(); j++) set.push({d[j], ids[j]});
    shrink_closer(dis, set, end - begin);
    uint64_t i = begin;
    for (; !set.empty(); set.pop()) put(i++, set.top().id);
    for (; i < end; i++) put(i, -1);
  }

  // add_links_starting_from
  void add_links(Distances& dis, Visited& visited, int32_t pt, int32_t nearest, float d_nearest,
                 int level) {
    std::priority_queue<Closer> targets;
    search(dis, visited, nearest, d_nearest, level, targets);
    const size_t slots =
        size_t(g_.cum_nneighbor_per_level[level + 1] - g_.cum_nneighbor_per_level[level]);
    shrink_closer(dis, targets, slots);
    std::vector<int32_t> added;
    for (; !targets.empty(); targets.pop()) {
      add_link(dis, pt, targets.top().id, level);
      added.push_back(targets.top().id);
    }
    locks_.unlock(pt);
    for (const int32_t other : added) {
      locks_.lock(other);
      add_link(dis, other, pt, level);
      locks_.unlock(other);
    }
    locks_.lock(pt);
  }

  HnswGraphData& g_;
  const RowSource& source_;
  Locks locks_;
  std::mutex entry_mutex_;
  // Each thread's neighbour list and distances being walked (greedy, search).
  static thread_local std::vector<int32_t> ids_;
  static thread_local std::vector<float> dist_;
};

thread_local std::vector<int32_t> Builder::ids_;
thread_local std::vector<float> Builder::dist_;

}  // namespace

HnswGraphData build_hnsw(const RowSource& source, const HnswBuildOptions& options) {
  const int64_t n = source.rows();
  if (options.M < 2) throw Error("HNSW M must be >= 2, not " + std::to_string(options.M));
  if (options.ef_construction < 1 || options.ef_search < 1) {
    throw Error("HNSW efConstruction and efSearch must be >= 1");
  }
  if (n >= (int64_t{1} << 31)) throw Error("HNSW holds at most 2^31 - 1 vectors");
  HnswGraphData g;
  g.ef_construction = options.ef_construction;
  g.ef_search = options.ef_search;
  hnsw_default_probas(options.M, g.assign_probas, g.cum_nneighbor_per_level);

  // prepare_level_tab: every node's level, in id order, then the neighbour table.
  std::mt19937 rng(12345);
  const auto random_level = [&] {
    float f = static_cast<float>(rng()) / static_cast<float>(std::mt19937::max());
    for (size_t level = 0; level < g.assign_probas.size(); level++) {
      if (f < g.assign_probas[level]) return int(level);
      f -= static_cast<float>(g.assign_probas[level]);
    }
    return int(g.assign_probas.size()) - 1;
  };
  g.levels.resize(n);
  g.offsets.assign(1, 0);
  g.offsets.reserve(n + 1);
  int top = 0;
  for (int64_t i = 0; i < n; i++) {
    const int level = random_level();
    g.levels[i] = level + 1;
    top = std::max(top, level);
    g.offsets.push_back(g.offsets.back() + uint64_t(g.cum_nneighbor_per_level[level + 1]));
  }
  g.neighbors.assign(g.offsets.back(), -1);
  if (n == 0) return g;

  // Bucket the nodes by level (a stable counting sort), highest first.
  std::vector<int64_t> hist(top + 1, 0);
  for (int64_t i = 0; i < n; i++) hist[g.levels[i] - 1]++;
  std::vector<int64_t> start(top + 2, 0);
  for (int l = 0; l <= top; l++) start[l + 1] = start[l] + hist[l];
  std::vector<int32_t> order(n);
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; i++) order[next[g.levels[i] - 1]++] = int32_t(i);
  }

  Builder builder(g, source, n);
  std::mt19937 rng2(789);
  int64_t done = 0, reported = 0;
  const auto report = [&](bool always) {
    if (options.progress && (always || done - reported >= std::max<int64_t>(1, n / 100))) {
      reported = done;
      options.progress(done, n);
    }
  };
  std::string error;
  for (int level = top; level >= 0; level--) {
    const int64_t i0 = start[level], i1 = start[level + 1];
    for (int64_t j = i0; j < i1; j++) {  // faiss: swap(order[j], order[j + rand_int(i1 - j)])
      std::swap(order[j], order[j + int64_t(rng2() % uint32_t(i1 - j))]);
    }
    // In slices, so that the calling thread reports progress between them.
    const int64_t slice = std::max<int64_t>(4096, n / 100);
    for (int64_t s0 = i0; s0 < i1 && error.empty(); s0 += slice) {
      const int64_t s1 = std::min(i1, s0 + slice);
#pragma omp parallel if (s1 - s0 > 100)
      {
        Distances dis(source);
        thread_local std::unique_ptr<Visited> visited;
        if (!visited || visited->size() != n) visited = std::make_unique<Visited>(n);
#pragma omp for schedule(dynamic, 16)
        for (int64_t i = s0; i < s1; i++) {
          try {
            builder.add(order[i], level, dis, *visited);
          } catch (const std::exception& e) {
#pragma omp critical
            if (error.empty()) error = e.what();
          }
        }
      }
      done += s1 - s0;
      report(false);
    }
    if (!error.empty()) throw Error(error);
  }
  report(true);
  return g;
}

}  // namespace sr1
