// Trains and fills faiss's IndexIVFPQ, index_factory(d, "IVF{nlist},PQ{M}[x{nbits}]",
// METRIC_INNER_PRODUCT) followed by train(all vectors) and add(all vectors) as Search-R1's
// index_builder.py runs them, over the rows of an IndexFlatIP file, with faiss's algorithms
// and parameters (faiss/index_factory.cpp fix_ivf_fields; faiss/IndexIVF.cpp train,
// train_q1, add_with_ids; faiss/IndexIVFPQ.cpp train_residual_o, add_core_o;
// faiss/Clustering.cpp; faiss/utils/utils.cpp fvecs_maybe_subsample):
//   - training samples: faiss's Clustering and fvecs_maybe_subsample both draw
//     rand_perm(ntotal, 1234) (kmeans.h): the coarse k-means takes its first 256·nlist rows,
//     the PQ its first 256·ksub (65,536 at 8 bits); a sample of every row keeps row order.
//     Only those rows are read, so a file larger than memory trains;
//   - the coarse quantizer: spherical k-means by inner product (index_factory sets
//     cp.spherical for an inner-product IVF, and faiss clusters with the IndexFlatIP
//     itself), niter 25; its centroids become an IndexFlatIP;
//   - the PQ: its sample's residuals (row - its nearest centroid) clustered per
//     sub-quantizer (product_quantizer.h). index_factory also asks for polysemous training
//     (do_polysemous_training), which only reorders each sub-quantizer's centroids so that
//     Hamming distances between codes follow theirs: a search uses that only with
//     polysemous_ht, 0 by default and not stored in an IVFPQ file, so it is left out (the
//     same distances; codes number the centroids differently);
//   - add: every row assigned to its nearest centroid by inner product, its residual coded,
//     and appended to that list in row order (ids = row numbers, as add() gives them), in
//     parallel chunks.
// k-means rounds its distances differently from faiss's BLAS (kmeans.h), so the centroids
// and codes are faiss's in law, not bit for bit: recall is compared, not bytes
// (test/retrieval/make_faiss_build_fixtures.py).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "index/faiss_io.h"
#include "index/product_quantizer.h"

namespace sr1 {

struct IvfPqShape {
  int nlist = 0, M = 0, nbits = 8;
};

// What build_ivfpq made: the centroids, the PQ, and each row's list and code (in row
// order; faiss_write.cpp lays them out as inverted lists).
struct IvfPqBuilt {
  int d = 0;
  int64_t ntotal = 0;
  int nlist = 0;
  std::vector<float> centroids;  // nlist x d
  ProductQuantizer pq;
  std::vector<int32_t> list;     // ntotal
  std::vector<uint8_t> codes;    // ntotal x code_size
};

// `progress(stage, done, total)` after each step of a stage: "clustering" (k-means
// iterations), "quantizer" (PQ sub-quantizers trained), "encoding" (rows added). Notes (too
// few training points, as faiss warns) go to stderr. Refusals (UsageError, naming `what`,
// e.g. "--type IVF4096,PQ64"): more lists than rows, an M that does not divide d, fewer rows
// than the 2^nbits centroids of a sub-quantizer.
IvfPqBuilt build_ivfpq(const FaissIndex& flat, const IvfPqShape& shape, const std::string& what,
                       const std::function<void(const std::string&, int64_t, int64_t)>& progress);

}  // namespace sr1
