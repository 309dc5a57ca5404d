// Builds an HNSW graph in faiss's layout with faiss's algorithm, in parallel on all cores
// (faiss/IndexHNSW.cpp hnsw_add_vertices; faiss/impl/HNSW.cpp set_default_probas,
// random_level, prepare_level_tab, add_with_locks, add_links_starting_from,
// search_neighbors_to_add, shrink_neighbor_list, add_link), as faiss 1.7.3 does it:
//   - levels: each node draws random_level() from faiss's generator (mt19937 seeded 12345,
//     rand_float = mt() / float(mt.max())) over assign_probas, the geometric law of level
//     multiplier 1/ln(M) (a level's probability exp(-l/mult)·(1 - exp(-1/mult)), cut below
//     1e-9); a node on level l has 2M neighbour slots on level 0 and M on each level 1..l;
//   - order: nodes bucketed by level and inserted top level first, each bucket shuffled by
//     a second generator (mt19937 seeded 789, rand_int(n) = mt() % n), the nodes of a bucket
//     inserted in parallel;
//   - insertion of node p: a greedy descent from the entry point on the levels above p's,
//     then on each of p's levels from the top, a beam search of efConstruction candidates,
//     the list cut to the level's slots by faiss's heuristic (keep a candidate only when no
//     kept one is closer to it than p is), links p -> each kept node, then each kept node ->
//     p (a full list re-cut by the same heuristic); each node's lists under its own lock,
//     as faiss's LockVector, the graph read by the walks without one (ids are read and
//     written whole, so a walk sees a list as it was before or after a change).
// Distances are faiss's for an IndexHNSWFlat with METRIC_INNER_PRODUCT: the negated inner
// product, smaller is better. A graph built on one thread is faiss's when the distances
// are (ours are summed as dots.h sums them, which may round differently); on several, the
// interleaving decides some links, in faiss as here.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

namespace sr1 {

// The vectors a graph is built over: row i as d floats.
class RowSource {
 public:
  virtual ~RowSource() = default;
  virtual int64_t rows() const = 0;
  virtual int dim() const = 0;
  // Row i, either where it lies (any alignment: read with memcpy loads) or decoded into
  // `scratch` (d floats); valid until scratch is reused.
  virtual const float* row(int64_t i, float* scratch) const = 0;
};

// An HNSW graph as faiss's HNSW struct holds and write_HNSW writes it.
struct HnswGraphData {
  std::vector<double> assign_probas;
  std::vector<int32_t> cum_nneighbor_per_level;
  std::vector<int32_t> levels;    // node i's top level + 1
  std::vector<uint64_t> offsets;  // ntotal + 1
  std::vector<int32_t> neighbors;
  int32_t entry_point = -1, max_level = -1, ef_construction = 40, ef_search = 16;
};

struct HnswBuildOptions {
  int M = 32;
  int ef_construction = 40;
  int ef_search = 16;  // stored in the file: the beam a reader uses by default
  // Called from the calling thread with the nodes inserted so far, at least every 1%.
  std::function<void(int64_t done, int64_t total)> progress;
};

// faiss's HNSW(M) tables: assign_probas and cum_nneighbor_per_level.
void hnsw_default_probas(int M, std::vector<double>& assign_probas,
                         std::vector<int32_t>& cum_nneighbor_per_level);

// Builds the graph over all rows of `source` with the OpenMP threads.
HnswGraphData build_hnsw(const RowSource& source, const HnswBuildOptions& options);

}  // namespace sr1
