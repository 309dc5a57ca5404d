#include "index/rescore.h"

#include <algorithm>
#include <vector>

#include "index/topk.h"
#include "util/error.h"

namespace sr1 {

void check_rescore_file(const FaissIndex& index, const FaissIndex& flat, const std::string& flag) {
  const std::string what = flag + " " + flat.path;
  if (flat.fourcc != "IxFI" && flat.fourcc != "IxF2") {
    throw Error(what + ": is " + index_type_name(flat) +
                "; rescoring reads exact vectors from a Flat file (IndexFlatIP or IndexFlatL2)");
  }
  if (flat.metric != index.metric) {
    throw Error(what + ": its metric is " + metric_name(flat.metric) + " but " + index.path +
                " searches by " + metric_name(index.metric));
  }
  if (flat.ntotal != index.ntotal || flat.d != index.d) {
    throw Error(what + ": holds " + std::to_string(flat.ntotal) + " vectors of d = " +
                std::to_string(flat.d) + " but " + index.path + " holds " +
                std::to_string(index.ntotal) + " of d = " + std::to_string(index.d) +
                " (rescoring needs the same vectors, row for row)");
  }
}

void prepare_rescore_file(const FaissIndex& flat) {
  flat.file->advise_random(0, flat.file->size());
}

namespace {

// One query's candidates, scored exactly and fed in id order into a heap of k kept as
// flat_search keeps it (a candidate enters only when strictly better than the worst kept),
// so that the list, ties included, is what flat_search returns whenever the candidates
// hold its top k.
template <class C>
void rescore_one(const FaissIndex& flat, const float* query, std::vector<int64_t>& candidates,
                 int k, std::vector<float>& row, float* val, int64_t* ids) {
  const int d = flat.d;
  std::sort(candidates.begin(), candidates.end());
  topk::heapify<C>(k, val, ids);
  for (const int64_t id : candidates) {
    flat.vectors.copy(static_cast<uint64_t>(id) * d, d, row.data());
    float s = 0;
    if (flat.metric == Metric::InnerProduct) {
      for (int i = 0; i < d; i++) s += query[i] * row[i];
    } else {
      for (int i = 0; i < d; i++) s += (query[i] - row[i]) * (query[i] - row[i]);
    }
    if (C::cmp(val[0], s)) topk::replace_top<C>(k, val, ids, s, id);
  }
  topk::reorder<C>(k, val, ids);
}

}  // namespace

TopK rescore(const FaissIndex& flat, const float* queries, const TopK& candidates, int k) {
  const int nq = candidates.nq, kc = candidates.k, d = flat.d;
  TopK out;
  out.nq = nq;
  out.k = k;
  out.ids.resize(static_cast<size_t>(nq) * k);
  out.scores.resize(static_cast<size_t>(nq) * k);
#pragma omp parallel
  {
    std::vector<float> row(d);
    std::vector<int64_t> ids;
#pragma omp for schedule(dynamic, 1)
    for (int q = 0; q < nq; q++) {
      ids.clear();
      for (int j = 0; j < kc; j++) {
        const int64_t id = candidates.ids[static_cast<size_t>(q) * kc + j];
        if (id >= 0) ids.push_back(id);  // -1: an empty place
      }
      const float* query = queries + static_cast<size_t>(q) * d;
      float* val = out.scores.data() + static_cast<size_t>(q) * k;
      int64_t* top = out.ids.data() + static_cast<size_t>(q) * k;
      if (flat.metric == Metric::InnerProduct) {
        rescore_one<topk::Min<int64_t>>(flat, query, ids, k, row, val, top);
      } else {
        rescore_one<topk::Max<int64_t>>(flat, query, ids, k, row, val, top);
      }
    }
  }
  return out;
}

}  // namespace sr1
