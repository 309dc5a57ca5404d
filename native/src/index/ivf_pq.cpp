#include "index/ivf_pq.h"

#include <algorithm>
#include <vector>

#include "index/topk.h"
#include "util/error.h"

namespace sr1 {

namespace {

// One query's scan of its probed lists into a heap of k (faiss's KnnSearchResults::add).
template <class C>
void scan_query(const IvfPq& ivf, Metric metric, const float* q, const int64_t* keys,
                int nprobe, int k, std::vector<float>& table, std::vector<float>& residual,
                float* val, int64_t* out) {
  const ProductQuantizer& pq = ivf.pq;
  const int d = pq.d, M = pq.M, nbits = pq.nbits, ksub = pq.ksub();
  const uint64_t code_size = pq.code_size();
  topk::heapify<C>(k, val, out);
  const bool ip = metric == Metric::InnerProduct;
  if (ip) {
    pq.inner_product_table(q, table.data());
  } else if (!ivf.by_residual) {
    pq.distance_table(q, table.data());
  }
  for (int p = 0; p < nprobe; p++) {
    const int64_t key = keys[p];
    if (key < 0 || ivf.sizes[key] == 0) continue;
    float dis0 = 0;
    if (ivf.by_residual) {
      const float* c = ivf.quantizer.mapped_rows(key);
      if (ip) {
        for (int t = 0; t < d; t++) dis0 += q[t] * row_element(c, t);
      } else {
        for (int t = 0; t < d; t++) residual[t] = q[t] - row_element(c, t);
        pq.distance_table(residual.data(), table.data());
      }
    }
    const unsigned char* code = ivf.codes[key];
    const int64_t n = ivf.sizes[key];
    float worst = val[0];
    for (int64_t j = 0; j < n; j++, code += code_size) {
      float s = 0;
      const float* tab = table.data();
      if (nbits == 8) {
        for (int m = 0; m < M; m++, tab += ksub) s += tab[code[m]];
      } else {
        for (int m = 0; m < M; m++, tab += ksub) {
          s += tab[ProductQuantizer::code_at(code, m, nbits)];
        }
      }
      const float dis = dis0 + s;
      if (C::cmp(worst, dis)) {
        topk::replace_top<C>(k, val, out, dis, ivf.id_at(key, j));
        worst = val[0];
      }
    }
  }
  topk::reorder<C>(k, val, out);
}

}  // namespace

TopK ivfpq_search(const FaissIndex& index, const float* queries, int nq, int k, int nprobe) {
  if (!index.ivf) throw Error(index.path + ": not an IVF index");
  if (k < 1) throw Error("k must be >= 1");
  const IvfPq& ivf = *index.ivf;
  const int probes =
      static_cast<int>(std::min<int64_t>(nprobe > 0 ? nprobe : ivf.nprobe, ivf.nlist));
  TopK r;
  r.nq = nq;
  r.k = k;
  r.ids.resize(size_t(nq) * k);
  r.scores.resize(size_t(nq) * k);
  if (nq == 0) return r;
  const TopK coarse = flat_search(ivf.quantizer, queries, nq, probes);
#pragma omp parallel
  {
    std::vector<float> table(size_t(ivf.pq.M) * ivf.pq.ksub()), residual(index.d);
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < nq; i++) {
      const float* q = queries + size_t(i) * index.d;
      const int64_t* keys = coarse.ids.data() + size_t(i) * probes;
      float* val = r.scores.data() + size_t(i) * k;
      int64_t* out = r.ids.data() + size_t(i) * k;
      if (index.metric == Metric::L2) {
        scan_query<topk::Max<int64_t>>(ivf, index.metric, q, keys, probes, k, table, residual,
                                       val, out);
      } else {
        scan_query<topk::Min<int64_t>>(ivf, index.metric, q, keys, probes, k, table, residual,
                                       val, out);
      }
    }
  }
  return r;
}

}  // namespace sr1
