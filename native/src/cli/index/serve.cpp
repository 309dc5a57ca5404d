// searchr1-index serve: the dense retriever's (and the reranker's) long-lived process
// (index/session.h holds it and answers its commands; the protocol is in index/SERVE.md).
// Here: the options, opening the index and the models they name, and the JSON-lines loop on
// stdin/stdout.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/common.h"
#include "index/faiss_io.h"
#include "index/flat_search_cuda.h"
#include "index/ivf_pq.h"
#include "index/rescore.h"
#include "index/session.h"
#include "model/bert.h"
#include "util/error.h"

namespace sr1 {
namespace {

// Opens the index and the encoder the command line names; the usage is checked before
// anything slow starts.
void start(IndexSession& s, const Args& args) {
  s.ef_search = static_cast<int>(args.integer("ef-search", s.ef_search, 1));
  s.nprobe = static_cast<int>(args.integer("nprobe", s.nprobe, 1));
  s.exact = args.flag("exact");
  s.batch_tokens = args.integer("batch-tokens", s.batch_tokens, 1);
  s.normalize = !args.flag("no-normalize");
  s.pooling_name = args.text("pooling", "mean");
  s.pooling = parse_pooling(s.pooling_name);
  if (args.has("index")) {
    s.index = std::make_unique<FaissIndex>(open_faiss_index(args.required("index")));
  }
  check_search_options(s.index.get(), args.has("ef-search"), args.has("nprobe"), s.exact);
  if (s.index && s.index->ivf) {  // an IVF-PQ file's defaults (session.h)
    if (!args.has("nprobe")) s.nprobe = ivf_default_nprobe(s.index->ivf->nlist);
    s.rescore_candidates = kIvfRescoreCandidates;
  }
  if (args.flag("fp16") && !s.index) throw UsageError("--fp16 applies to an --index");
  if (args.has("rescore-from") && !s.index) {
    throw UsageError("--rescore-from applies to an --index");
  }
  if (args.has("rescore-candidates") && !args.has("rescore-from")) {
    throw UsageError("--rescore-candidates applies with --rescore-from");
  }
  s.rescore_candidates =
      static_cast<int>(args.integer("rescore-candidates", s.rescore_candidates, 1));
  if (args.has("rescore-from")) {
    s.rescore = std::make_unique<FaissIndex>(open_faiss_index(args.required("rescore-from")));
    check_rescore_file(*s.index, *s.rescore, "--rescore-from");
    prepare_rescore_file(*s.rescore);
  }
  // --device cuda puts an exhaustive search on the GPU too; auto moves only the encoder.
  const bool cuda = index_on_cuda(args.text("device", "auto"));
  const bool graph = s.index && s.index->has_hnsw && !s.exact;
  const bool ivf = s.index && s.index->ivf;
  const bool on_gpu = cuda && s.index && !graph && !ivf;
  CudaFlatOptions gpu;
  if (args.has("gpus")) {
    gpu.gpus = parse_gpus(args.required("gpus"));
    if (!on_gpu) {
      throw UsageError("--gpus applies to an exhaustive search with --device cuda (a flat "
                       "--index, or --exact)");
    }
  }
  if (cuda) require_cuda();
  if (cuda && (graph || ivf)) {
    std::fprintf(stderr, "searchr1-index: note: the %s is searched on the CPU "
                         "(--device cuda serves the encoder, and exhaustive search)\n",
                 ivf ? "IVF-PQ index" : "HNSW graph");
  }
  if (args.has("model") || args.has("reranker")) {
    s.backend = open_backend(args);  // sets the threads too
  } else {
    set_threads(args);
  }
  if (args.has("model")) s.encoder = BertEncoder::load(args.required("model"), *s.backend);
  if (args.has("reranker")) {
    const std::string dir = args.required("reranker");
    s.reranker = BertEncoder::load(dir, *s.backend, BertHead::SequenceClassification);
    if (s.reranker->config().num_labels != 1) {
      throw Error(dir + "/config.json: " + std::to_string(s.reranker->config().num_labels) +
                  " labels; a reranker scores a pair with one (as " +
                  "cross-encoder/ms-marco-MiniLM-L12-v2 does)");
    }
  }
  if (s.index && s.encoder && s.encoder->dim() != s.index->d) {
    throw Error(args.required("model") + " encodes vectors of d = " +
                std::to_string(s.encoder->dim()) + " but " + s.index->path +
                " holds vectors of d = " + std::to_string(s.index->d));
  }
  // On the GPU the vectors are fp16 whatever --fp16 says: no host copy is needed.
  if (on_gpu) {
    s.gpu = upload_flat_index(*s.index, gpu);
  } else if (args.flag("fp16")) {
    keep_fp16(*s.index);
  }
  if (graph || ivf) page_in(*s.index);  // before the first reply: no search waits on the disk
}

}  // namespace

int cmd_index_serve(const std::vector<std::string>& argv) {
  IndexSession s;
  const Args args(
      "searchr1-index serve",
      "Runs as the dense retriever: a faiss index (--index) and a BERT encoder (--model)\n"
      "in memory, JSON commands on stdin, one JSON reply per command on stdout (protocol:\n"
      "native/src/index/SERVE.md). It searches by token ids or by vectors, builds flat\n"
      "indexes from token ids into a file that a killed build resumes, and scores (query,\n"
      "passage) pairs with a BERT cross-encoder (--reranker).",
      concat({{"index", "FILE", "faiss index file to search"},
              {"model", "DIR", "BERT encoder (Hugging Face folder) for token ids"},
              {"reranker", "DIR",
               "cross-encoder (BertForSequenceClassification folder, one label)"},
              {"pooling", "mean|cls", "pool the encoder's last layer by mean (default) or [CLS]"},
              {"no-normalize", "", "leave embeddings as pooled (default: L2-normalised)"},
              {"ef-search", "N",
               "HNSW beam width (default " + std::to_string(kServeEfSearch) +
                   ", not the file's efSearch)"},
              {"nprobe", "N",
               "IVF lists probed (default the larger of " + std::to_string(kServeNprobe) +
                   " and nlist/8, not the file's nprobe)"},
              {"rescore-from", "FILE",
               "Flat file of the index's vectors: rescore each query's top candidates "
               "exactly from it"},
              {"rescore-candidates", "N",
               "with --rescore-from: rescore the index's top k*N (default " +
                   std::to_string(kRescoreCandidates) + "; " +
                   std::to_string(kIvfRescoreCandidates) + " for an IVF-PQ index)"},
              {"exact", "", "search an HNSW file's vectors exhaustively instead of its graph"},
              {"fp16", "", "search an fp16 copy held in memory (half the memory, rounded scores)"},
              {"batch-tokens", "N",
               "padded tokens per encoder micro-batch (default " +
                   std::to_string(s.batch_tokens) + ")"},
              {"gpus", "N|LIST", "with --device cuda: shard a flat index over the first N "
                                 "GPUs, or the listed ordinals (0,1) (default 1)"}},
             concat({{"device", "auto|cpu|cuda",
                      "auto (default): the encoder on cuda when usable, the index on the "
                      "CPU; cuda: the encoder, and a flat index (or --exact) in fp16, on the "
                      "GPU (HNSW graphs and IVF-PQ indexes stay on the CPU)"}},
                    {{"threads", "N", "CPU threads (default: all cores)"}})),
      argv,
      {"echo '{\"op\":\"info\",\"id\":1}' | searchr1-index serve --index data/e5_Flat.index "
       "--fp16"});
  if (print_help(args)) return 0;
  start(s, args);
  return serve_json_lines([&s](const std::string& op, const JsonFields& f) {
    return handle_command(s, op, f);
  });
}

}  // namespace sr1
