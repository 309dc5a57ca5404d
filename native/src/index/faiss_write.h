// Builds and writes the faiss index types `searchr1-index build` makes from a flat file,
// named by faiss's index_factory strings (faiss/index_factory.cpp), in faiss's own format
// (faiss/impl/index_write.cpp: write_index_header, write_HNSW, write_ScalarQuantizer, the
// IndexFlat, IndexScalarQuantizer and IndexHNSW cases; io_macros.h WRITEVECTOR), so that
// faiss.read_index reads them:
//   Flat            IndexFlatIP           'IxFI'
//   HNSW{M}         IndexHNSWFlat         'IHNf' (graph, then an IxFI storage)
//   HNSW{M},Flat    the same
//   SQ8 / SQfp16    IndexScalarQuantizer  'IxSQ' (QT_8bit RS_minmax / QT_fp16)
//   HNSW{M},SQ8     IndexHNSWSQ           'IHNs' (graph, then an IxSQ storage); also ,SQfp16
//   IVF{n},PQ{M}    IndexIVFPQ            'IwPQ' (write_ivf_header with an IxFI quantizer and
//   IVF{n},PQ{M}x{b}                      no direct map, by_residual, code_size,
//                                         write_ProductQuantizer, then write_InvertedLists
//                                         'ilar': ivf_pq_build.h); n may end in k or M (x1024,
//                                         x1048576) as faiss's parse_nlist reads it
// all with METRIC_INNER_PRODUCT, as Search-R1's index_builder.py asks index_factory.
#pragma once
#include <functional>
#include <string>

#include "index/faiss_io.h"
#include "index/scalar_quantizer.h"

namespace sr1 {

struct FactorySpec {
  std::string text;  // as given
  std::string flag;  // the option that gave it, for messages
  int hnsw_m = 0;    // 0: no graph
  enum class Storage { Flat, SQ8, SQfp16, PQ } storage = Storage::Flat;
  int ivf_nlist = 0;  // IVF{n},PQ{M}x{b}: n, M and b (storage PQ)
  int pq_m = 0;
  int pq_nbits = 8;
};

// Parses an index_factory string; a UsageError naming `flag` for one searchr1 does not
// build (IVF{n},Flat and the other IVF encodings among them).
FactorySpec parse_factory(const std::string& text, const std::string& flag = "--faiss-type");

struct BuildIndexOptions {
  int ef_construction = 0;  // 0: kDefaultEfConstruction
  int ef_search = 16;
  std::function<void(const std::string& stage, int64_t done, int64_t total)> progress;
};

// The default efConstruction of our HNSW builds, chosen by measurement (docs/commands/
// build-index.md, "Choosing --ef-construction").
constexpr int kDefaultEfConstruction = 80;

// What the build wrote.
struct BuiltIndex {
  std::string type;  // faiss's class name
  uint64_t bytes = 0;
  int max_level = -1;
  double graph_seconds = 0;
};

// Builds `spec` over the vectors of an IndexFlatIP file and writes it to `out` (at a
// temporary name, renamed into place when complete). An IVF shape the file cannot train
// (ivf_pq_build.h) is a UsageError naming spec.flag.
BuiltIndex build_faiss_index(const FaissIndex& flat, const FactorySpec& spec,
                             const std::string& out, const BuildIndexOptions& options);

}  // namespace sr1
