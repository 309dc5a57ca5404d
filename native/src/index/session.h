// The dense retriever as `searchr1-index serve` keeps it between commands: a faiss index
// (memory-mapped, its fp16 copy, or a flat index's fp16 copy on the GPU(s):
// flat_search_cuda.h), a BERT encoder, a BERT cross-encoder (the reranker), and the flat
// index being built. Each command of the protocol (SERVE.md beside this file) is one call of
// handle_command(): searches by token ids or by vectors, scores of (query, passage) pairs,
// and builds of a flat index from token ids into a file that survives a kill. Opening the
// index and the models is the command line's (cli/index/serve.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "index/faiss_io.h"
#include "index/flat_search_cuda.h"
#include "model/bert.h"
#include "util/json_fields.h"

namespace sr1 {

// serve's defaults, chosen by measurement (bench/dense/serve_recall.py; the numbers in
// SERVE.md under `--index` and `--rescore-from`).
inline constexpr int kServeEfSearch = 64;
inline constexpr int kRescoreCandidates = 4;
inline constexpr int kServeNprobe = 64;
// An IVF-PQ file's: its PQ codes rank coarsely, so rescoring needs more candidates, and the
// lists to probe grow with nlist. At 1M × 768 vectors, IVF1024,PQ96 rescored from the Flat
// file (bench:dense --parts build, docs/performance.md "Index types"): recall@3 0.890 at 4
// candidates and 0.958 at 16 (nprobe 128 = nlist / 8); 0.760 at nprobe 32 = nlist / 32.
inline constexpr int kIvfRescoreCandidates = 16;
inline int ivf_default_nprobe(int64_t nlist) {
  return static_cast<int>(std::max<int64_t>(kServeNprobe, nlist / 8));
}

// Refuses (UsageError naming the option) the search options the file does not take:
// --ef-search but for an HNSW graph, --nprobe but for an IVF index, --exact for an IVF
// index (its PQ codes hold no exact vectors: --rescore-from does that). `index` may be null
// (serve without --index).
void check_search_options(const FaissIndex* index, bool ef_search, bool nprobe, bool exact);

struct IndexSession {
  std::unique_ptr<FaissIndex> index;
  std::unique_ptr<CudaFlatIndex> gpu;  // the index's vectors on the GPU(s), --device cuda
  std::unique_ptr<Backend> backend;  // declared before the encoder, which releases into it
  std::unique_ptr<BertEncoder> encoder;
  std::unique_ptr<BertEncoder> reranker;  // with its sequence-classification head, one label
  std::string pooling_name;
  Pooling pooling = Pooling::Mean;
  bool normalize = true;
  // HNSW beam: kServeEfSearch unless --ef-search. Not the file's efSearch (16 in faiss's
  // and Search-R1's files): at 16 an HNSW64 graph found 0.82 of the exact top 10, at 64
  // 0.99 (bench/dense/serve_recall.py, SERVE.md).
  int ef_search = kServeEfSearch;
  // IVF lists probed: kServeNprobe unless --nprobe. Not the file's nprobe (1 in faiss's
  // files): IVF1024,PQ64 over 100,000 x 768 vectors found 0.10 of the exact top 10 at 1,
  // 0.429 at 64 and 0.431 at 128 (bench/dense/ivf_recall.py, SERVE.md).
  int nprobe = kServeNprobe;
  std::unique_ptr<FaissIndex> rescore;  // --rescore-from: the Flat file of exact vectors
  int rescore_candidates = kRescoreCandidates;  // rescored per result: k * this
  bool exact = false;
  int64_t batch_tokens = 16384;  // padded tokens per encoder micro-batch
  std::unique_ptr<FlatIndexWriter> build;  // the file of build_open, until build_commit

  const FaissIndex& searched() const;
  BertEncoder& bert() const;
  BertEncoder& cross_encoder() const;
};

// One command (`shutdown` is the caller's loop's): checks its fields, runs it and returns
// the reply's fields. Throws sr1::Error naming the field.
json::Value handle_command(IndexSession& s, const std::string& op, const JsonFields& f);

}  // namespace sr1
