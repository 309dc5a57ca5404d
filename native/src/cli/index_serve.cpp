// searchr1-index serve: the dense retriever's long-lived process. It holds a faiss index
// (memory-mapped, its fp16 copy, or with --device cuda a flat index's fp16 copy on the
// GPU(s): index/flat_search_cuda.h) and a BERT encoder, reads JSON commands one per line
// on stdin and writes one reply line per command on stdout: searches by token ids or by
// vectors, and builds of a flat index from token ids into a file that survives a kill.
// The protocol is in index/SERVE.md.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/sgemm.h"
#include "cli/args.h"
#include "cli/common.h"
#include "index/faiss_io.h"
#include "index/flat_search.h"
#include "index/flat_search_cuda.h"
#include "index/hnsw_search.h"
#include "model/bert.h"
#include "util/error.h"
#include "util/json_fields.h"

namespace sr1 {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Server {
  std::unique_ptr<FaissIndex> index;
  std::unique_ptr<CudaFlatIndex> gpu;  // the index's vectors on the GPU(s), --device cuda
  std::unique_ptr<Backend> backend;  // declared before the encoder, which releases into it
  std::unique_ptr<BertEncoder> encoder;
  std::string pooling_name;
  Pooling pooling = Pooling::Mean;
  bool normalize = true;
  int ef_search = 0;  // 0: the file's
  bool exact = false;
  int64_t batch_tokens = 16384;
  std::unique_ptr<FlatIndexWriter> build;  // the file of build_open, until build_commit

  const FaissIndex& searched() const {
    if (!index) throw Error("no index is open (start serve with --index)");
    return *index;
  }
  BertEncoder& bert() const {
    if (!encoder) throw Error("no encoder is loaded (start serve with --model)");
    return *encoder;
  }
};

using TokenRows = std::vector<std::vector<int32_t>>;

// `key`: a list of non-empty lists of token ids, each one a text the encoder can take.
TokenRows read_token_rows(const JsonFields& f, const char* key, const BertConfig& c) {
  const json::Value& v = f.required(key);
  if (!v.is_array()) throw Error(std::string("'") + key + "' must be a list of lists of token ids");
  TokenRows rows;
  rows.reserve(v.as_array().size());
  for (size_t i = 0; i < v.as_array().size(); i++) {
    const json::Value& row = v.as_array()[i];
    const std::string at = key + ("[" + std::to_string(i) + "]");
    if (!row.is_array()) throw Error(at + ": must be a list of token ids");
    const json::Value::Array& ids = row.as_array();
    if (ids.empty()) throw Error(at + ": no tokens");
    if (ids.size() > static_cast<size_t>(c.max_position_embeddings)) {
      throw Error(at + ": " + std::to_string(ids.size()) + " tokens, more than the encoder's " +
                  "max_position_embeddings (" + std::to_string(c.max_position_embeddings) + ")");
    }
    std::vector<int32_t>& out = rows.emplace_back();
    out.reserve(ids.size());
    for (size_t j = 0; j < ids.size(); j++) {
      const std::string here = at + "[" + std::to_string(j) + "]";
      if (!ids[j].is_integer()) throw Error(here + ": not an integer token id");
      const int64_t id = ids[j].as_int();
      if (id < 0 || id >= c.vocab_size) {
        throw Error(here + ": token id " + std::to_string(id) + " outside the vocabulary (0.." +
                    std::to_string(c.vocab_size - 1) + ")");
      }
      out.push_back(static_cast<int32_t>(id));
    }
  }
  return rows;
}

// `vectors`: a list of lists of d numbers, returned as one row-major matrix.
std::vector<float> read_vectors(const JsonFields& f, int d) {
  const json::Value& v = f.required("vectors");
  if (!v.is_array()) throw Error("'vectors' must be a list of lists of numbers");
  std::vector<float> out;
  out.reserve(v.as_array().size() * static_cast<size_t>(d));
  for (size_t i = 0; i < v.as_array().size(); i++) {
    const json::Value& row = v.as_array()[i];
    const std::string at = "vectors[" + std::to_string(i) + "]";
    if (!row.is_array()) throw Error(at + ": must be a list of numbers");
    if (row.as_array().size() != static_cast<size_t>(d)) {
      throw Error(at + ": " + std::to_string(row.as_array().size()) +
                  " numbers, but the index holds vectors of d = " + std::to_string(d));
    }
    for (size_t j = 0; j < row.as_array().size(); j++) {
      const json::Value& x = row.as_array()[j];
      if (!x.is_number()) throw Error(at + "[" + std::to_string(j) + "]: not a number");
      out.push_back(static_cast<float>(x.as_number()));
    }
  }
  return out;
}

// Embeddings [rows, dim] of token rows. The rows, sorted by length, are cut into
// micro-batches of at most batch_tokens padded tokens (one row at least), so that short
// texts are not padded to long ones and the encoder's activations stay bounded; each
// embedding goes back to its row's place.
std::vector<float> encode_rows(const Server& s, const TokenRows& rows) {
  BertEncoder& bert = s.bert();
  const size_t dim = static_cast<size_t>(bert.dim());
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return rows[a].size() < rows[b].size(); });
  std::vector<float> out(rows.size() * dim), pooled;
  std::vector<int32_t> ids, mask;
  for (size_t first = 0, last = 0; first < order.size(); first = last) {
    // Rows only grow longer: the last one taken sets the batch's width.
    last = first + 1;
    while (last < order.size() &&
           static_cast<int64_t>((last + 1 - first) * rows[order[last]].size()) <= s.batch_tokens) {
      last++;
    }
    const int B = static_cast<int>(last - first);
    const size_t T = rows[order[last - 1]].size();
    ids.assign(B * T, 0);
    mask.assign(B * T, 0);
    for (int b = 0; b < B; b++) {
      const std::vector<int32_t>& row = rows[order[first + b]];
      std::copy(row.begin(), row.end(), ids.begin() + b * T);
      std::fill_n(mask.begin() + b * T, row.size(), 1);
    }
    pooled.resize(B * dim);
    bert.encode(ids.data(), mask.data(), B, static_cast<int>(T), s.pooling, s.normalize,
                pooled.data());
    for (int b = 0; b < B; b++) {
      std::copy_n(pooled.data() + b * dim, dim, out.data() + order[first + b] * dim);
    }
  }
  return out;
}

json::Value info(const Server& s) {
  json::Value encoder;
  if (s.encoder) {
    const BertConfig& c = s.encoder->config();
    encoder = json::Value::object({{"dim", s.encoder->dim()},
                                   {"vocab_size", c.vocab_size},
                                   {"max_position_embeddings", c.max_position_embeddings},
                                   {"pooling", s.pooling_name},
                                   {"normalize", s.normalize}});
  }
  json::Value r = json::Value::object(
      {{"index", s.index ? index_info_json(*s.index) : json::Value()},
       {"encoder", encoder},
       {"fp16", s.index && (s.index->vectors_f16 != nullptr || s.gpu != nullptr)}});
  if (s.gpu) {  // only then, so that the reply of a CPU index stays as it was
    json::Value gpus = json::Value::array();
    for (const CudaShardInfo& shard : s.gpu->shards()) {
      gpus.push(json::Value::object({{"gpu", shard.gpu},
                                     {"name", shard.name},
                                     {"first", shard.first},
                                     {"rows", shard.rows},
                                     {"bytes", static_cast<int64_t>(shard.bytes)}}));
    }
    r.set("index_device", "cuda");
    r.set("gpus", gpus);
  }
  return r;
}

json::Value search(const Server& s, const JsonFields& f) {
  const FaissIndex& index = s.searched();
  const int64_t k = f.integer("k");
  if (k < 1) throw Error("'k' must be >= 1");
  if (!f.has("input_ids") && !f.has("vectors")) throw Error("'input_ids' or 'vectors' is missing");
  if (f.has("input_ids") && f.has("vectors")) {
    throw Error("'input_ids' and 'vectors' exclude each other (texts to encode, or their vectors)");
  }
  std::vector<float> queries;
  double encode_seconds = 0;
  if (f.has("input_ids")) {
    const TokenRows rows = read_token_rows(f, "input_ids", s.bert().config());
    const auto start = Clock::now();
    queries = encode_rows(s, rows);
    encode_seconds = seconds_since(start);
  } else {
    queries = read_vectors(f, index.d);
  }
  const int nq = static_cast<int>(queries.size() / index.d);
  // Places beyond ntotal would only be empty ones, which the reply leaves out.
  const int kept = static_cast<int>(std::min<int64_t>(k, index.ntotal));
  const auto start = Clock::now();
  TopK r;
  if (s.gpu && kept > kCudaFlatMaxK) {
    throw Error("'k' must be <= " + std::to_string(kCudaFlatMaxK) + " with the index on the GPU");
  }
  if (nq > 0 && kept > 0) {
    r = s.gpu                         ? s.gpu->search(queries.data(), nq, kept)
        : index.has_hnsw && !s.exact ? hnsw_search(index, queries.data(), nq, kept, s.ef_search)
                                      : flat_search(index, queries.data(), nq, kept);
  }
  const double search_seconds = seconds_since(start);
  json::Value ids = json::Value::array(), scores = json::Value::array();
  for (int q = 0; q < nq; q++) {
    json::Value qi = json::Value::array(), qs = json::Value::array();
    for (int j = 0; j < kept; j++) {
      const size_t at = static_cast<size_t>(q) * kept + j;
      if (r.ids[at] < 0) break;  // empty places (an HNSW beam too narrow) come last
      qi.push(r.ids[at]);
      qs.push(static_cast<double>(r.scores[at]));
    }
    ids.push(std::move(qi));
    scores.push(std::move(qs));
  }
  return json::Value::object({{"ids", ids},
                              {"scores", scores},
                              {"encode_seconds", encode_seconds},
                              {"search_seconds", search_seconds}});
}

json::Value build_open(Server& s, const JsonFields& f) {
  const int dim = s.bert().dim();
  const std::string path = f.text("path"), metric = f.text("metric", "ip");
  if (metric != "ip" && metric != "l2") {
    throw Error("'metric' must be \"ip\" or \"l2\", got \"" + metric + "\"");
  }
  s.build.reset();  // a build left open is closed (its file stays) before this one opens
  s.build = FlatIndexWriter::resume(path, dim, metric == "l2" ? Metric::L2 : Metric::InnerProduct);
  s.build->sync();
  return json::Value::object({{"rows", s.build->ntotal()}});
}

json::Value build_append(Server& s, const JsonFields& f) {
  if (!s.build) throw Error("no build is open (send build_open first)");
  const auto start = Clock::now();
  const TokenRows rows = read_token_rows(f, "input_ids", s.bert().config());
  const std::vector<float> embeddings = encode_rows(s, rows);
  try {
    s.build->append(embeddings.data(), static_cast<int64_t>(rows.size()));
    s.build->sync();
  } catch (const Error& e) {
    // The file may now end inside a row the writer has not counted: start again from it.
    s.build.reset();
    throw Error(std::string(e.what()) +
                "; the build is closed (build_open resumes it from its whole rows)");
  }
  return json::Value::object({{"rows", s.build->ntotal()}, {"seconds", seconds_since(start)}});
}

json::Value build_commit(Server& s, const JsonFields& f) {
  if (!s.build) throw Error("no build is open (send build_open first)");
  const std::string out = f.text("out");
  const std::unique_ptr<FlatIndexWriter> build = std::move(s.build);  // closed either way
  build->commit(out);
  return json::Value::object(
      {{"rows", build->ntotal()}, {"bytes", static_cast<int64_t>(build->bytes())}});
}

// Each op's fields besides "op" and "id": anything else is refused, so that a misspelt
// field never goes unnoticed.
const std::vector<std::pair<std::string, std::vector<std::string>>> kOps = {
    {"info", {}},
    {"search", {"k", "input_ids", "vectors"}},
    {"build_open", {"path", "metric"}},
    {"build_append", {"input_ids"}},
    {"build_commit", {"out"}},
    {"shutdown", {}}};

void check_fields(const std::string& op, const JsonFields& f) {
  std::string list;
  for (const auto& [name, fields] : kOps) {
    if (name == op) {
      std::vector<std::string> known = {"op", "id"};
      known.insert(known.end(), fields.begin(), fields.end());
      f.only(known);
      return;
    }
    list += (list.empty() ? "" : ", ") + name;
  }
  throw Error("unknown op '" + op + "' (" + list + ")");
}

json::Value handle(Server& s, const std::string& op, const JsonFields& f) {
  check_fields(op, f);
  if (op == "info") return info(s);
  if (op == "search") return search(s, f);
  if (op == "build_open") return build_open(s, f);
  if (op == "build_append") return build_append(s, f);
  return build_commit(s, f);
}

// Opens the index and the encoder the command line names; the usage is checked before
// anything slow starts.
void start(Server& s, const Args& args) {
  s.ef_search = static_cast<int>(args.integer("ef-search", 0, 1));
  s.exact = args.flag("exact");
  s.batch_tokens = args.integer("batch-tokens", s.batch_tokens, 1);
  s.normalize = !args.flag("no-normalize");
  s.pooling_name = args.text("pooling", "mean");
  s.pooling = parse_pooling(s.pooling_name);
  if (args.has("index")) {
    s.index = std::make_unique<FaissIndex>(open_faiss_index(args.required("index")));
  }
  if (args.has("ef-search") && !(s.index && s.index->has_hnsw)) {
    throw UsageError("--ef-search applies to HNSW indexes; " +
                     (s.index ? s.index->path + " is " + index_type_name(*s.index)
                              : std::string("no --index was given")));
  }
  if (args.flag("fp16") && !s.index) throw UsageError("--fp16 applies to an --index");
  // --device cuda puts an exhaustive search on the GPU too; auto moves only the encoder.
  const bool cuda = index_on_cuda(args.text("device", "auto"));
  const bool graph = s.index && s.index->has_hnsw && !s.exact;
  const bool on_gpu = cuda && s.index && !graph;
  CudaFlatOptions gpu;
  if (args.has("gpus")) {
    gpu.gpus = parse_gpus(args.required("gpus"));
    if (!on_gpu) {
      throw UsageError("--gpus applies to an exhaustive search with --device cuda (a flat "
                       "--index, or --exact)");
    }
  }
  if (cuda) require_cuda();
  if (cuda && graph) {
    std::fprintf(stderr, "searchr1-index: note: the HNSW graph is searched on the CPU "
                         "(--device cuda serves the encoder, and exhaustive search)\n");
  }
  if (args.has("model")) {
    s.backend = open_backend(args);  // sets the threads too
    s.encoder = BertEncoder::load(args.required("model"), *s.backend);
  } else if (args.has("threads")) {
    const int n = static_cast<int>(args.integer("threads", 0, 1));
    omp_set_num_threads(n);
    set_sgemm_threads(n);
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
  if (graph) page_in(*s.index);  // before the first reply: no search waits on the disk
}

}  // namespace

int cmd_index_serve(const std::vector<std::string>& argv) {
  const Args args(
      "searchr1-index serve",
      "Runs as the dense retriever: a faiss index (--index) and a BERT encoder (--model)\n"
      "in memory, JSON commands on stdin, one JSON reply per command on stdout (protocol:\n"
      "native/src/index/SERVE.md). It searches by token ids or by vectors, and builds flat\n"
      "indexes from token ids into a file that a killed build resumes.",
      concat({{"index", "FILE", "faiss index file to search"},
              {"model", "DIR", "BERT encoder (Hugging Face folder) for token ids"},
              {"pooling", "mean|cls", "pool the encoder's last layer by mean (default) or [CLS]"},
              {"no-normalize", "", "leave embeddings as pooled (default: L2-normalised)"},
              {"ef-search", "N", "HNSW beam width (default: the efSearch stored in the file)"},
              {"exact", "", "search an HNSW file's vectors exhaustively instead of its graph"},
              {"fp16", "", "search an fp16 copy held in memory (half the memory, rounded scores)"},
              {"batch-tokens", "N", "padded tokens per encoder micro-batch (default 16384)"},
              {"gpus", "N|LIST", "with --device cuda: shard a flat index over the first N "
                                 "GPUs, or the listed ordinals (0,1) (default 1)"}},
             concat({{"device", "auto|cpu|cuda",
                      "auto (default): the encoder on cuda when usable, the index on the "
                      "CPU; cuda: the encoder, and a flat index (or --exact) in fp16, on the "
                      "GPU (HNSW graphs stay on the CPU)"}},
                    {{"threads", "N", "CPU threads (default: all cores)"}})),
      argv,
      {"echo '{\"op\":\"info\",\"id\":1}' | searchr1-index serve --index data/e5_Flat.index "
       "--fp16"});
  if (print_help(args)) return 0;
  Server s;
  start(s, args);
  return serve_json_lines([&s](const std::string& op, const JsonFields& f) {
    return handle(s, op, f);
  });
}

}  // namespace sr1
