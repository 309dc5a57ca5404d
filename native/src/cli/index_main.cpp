// searchr1-index: faiss index files without faiss (native/src/index/). `info` describes a
// file, `search` runs a batch of queries through it (exact for flat indexes, faiss's HNSW
// search for HNSW ones), `write` makes an IndexFlatIP/IndexFlatL2 file faiss reads. Queries
// and results travel in safetensors files, as the trainer's batches do.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "backend/sgemm.h"
#include "cli/args.h"
#include "cli/common.h"
#include "index/faiss_io.h"
#include "index/flat_search.h"
#include "index/hnsw_search.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/json.h"

namespace sr1 {
namespace {

const char* kUsage =
    "Usage: searchr1-index <command> [options]\n"
    "\n"
    "Reads and writes faiss index files (IndexFlatIP 'IxFI', IndexFlatL2 'IxF2',\n"
    "IndexHNSWFlat 'IHNf') as they are, memory-mapped, without faiss.\n"
    "\n"
    "Commands:\n"
    "  info    the file's type, metric, dimension, size and HNSW parameters, as JSON\n"
    "  search  top-k ids and scores of a batch of query vectors\n"
    "  write   an IndexFlatIP / IndexFlatL2 file from a safetensors matrix of vectors\n"
    "\n"
    "Run 'searchr1-index <command> --help' for a command's options.\n"
    "\n"
    "Examples:\n"
    "  $ searchr1-index info --index data/e5_Flat.index\n"
    "  $ searchr1-index search --index data/e5_HNSW64.index --queries q.safetensors --k 3 "
    "--out top3.safetensors --ef-search 128\n";

const char* type_name(const FaissIndex& index) {
  if (index.has_hnsw) return "IndexHNSWFlat";
  return index.metric == Metric::L2 ? "IndexFlatL2" : "IndexFlatIP";
}

void set_threads(const Args& args) {
  if (!args.has("threads")) return;
  const int n = static_cast<int>(args.integer("threads", 0, 1));
  omp_set_num_threads(n);
  set_sgemm_threads(n);
}

// The one F32/F16/BF16 matrix [n, d] of a safetensors file (`name`, or its only tensor).
std::vector<float> read_matrix(const SafetensorsFile& file, const std::string& name,
                               int64_t* rows, int64_t* cols) {
  const TensorView* t = file.find(name);
  if (t == nullptr && file.tensors().size() == 1) t = &file.tensors()[0];
  if (t == nullptr) {
    throw Error(file.path() + ": no tensor '" + name + "' (and not exactly one tensor)");
  }
  if (t->shape.size() != 2) {
    throw Error(file.path() + ": tensor '" + t->name + "' has shape " + shape_str(t->shape) +
                "; expected [n, d]");
  }
  *rows = t->shape[0];
  *cols = t->shape[1];
  std::vector<float> out(static_cast<size_t>(t->numel()));
  read_f32(*t, t->shape, out.data());
  return out;
}

json::Value info_json(const FaissIndex& index) {
  json::Value::Object o = {{"path", index.path},
                           {"type", type_name(index)},
                           {"fourcc", index.fourcc},
                           {"metric", metric_name(index.metric)},
                           {"d", index.d},
                           {"ntotal", index.ntotal},
                           {"bytes", static_cast<int64_t>(index.file->size())},
                           {"vectors_offset", static_cast<int64_t>(index.vectors_offset)}};
  if (index.has_hnsw) {
    const HnswGraph& g = index.hnsw;
    const int levels = static_cast<int>(g.cum_nneighbor_per_level.size()) - 1;
    o.push_back({"hnsw", json::Value::object({{"M", g.neighbor_slots(1)},
                                              {"level0_slots", g.neighbor_slots(0)},
                                              {"levels", levels},
                                              {"max_level", g.max_level},
                                              {"entry_point", g.entry_point},
                                              {"ef_construction", g.ef_construction},
                                              {"ef_search", g.ef_search}})});
  }
  return json::Value::object(o);
}

int cmd_info(const std::vector<std::string>& argv) {
  const Args args("searchr1-index info",
                  "Validates a faiss index file and prints one JSON line: path, type, fourcc,\n"
                  "metric, d, ntotal, bytes, vectors_offset and, for HNSW, its parameters.",
                  {{"index", "FILE", "faiss index file (required)"}}, argv,
                  {"searchr1-index info --index data/e5_Flat.index"});
  if (print_help(args)) return 0;
  const FaissIndex index = open_faiss_index(args.required("index"));
  std::printf("%s\n", info_json(index).dump().c_str());
  return 0;
}

int cmd_search(const std::vector<std::string>& argv) {
  const Args args(
      "searchr1-index search",
      "Writes OUT with 'ids' (I64 [nq, k], row numbers, -1 where fewer than k) and 'scores'\n"
      "(F32 [nq, k]: inner products best first, or squared L2 distances best first), as\n"
      "faiss's index.search returns them. Flat indexes are searched exactly; HNSW ones\n"
      "with faiss's algorithm and efSearch (the file's unless --ef-search). Prints one\n"
      "JSON line with the seconds the search took.",
      {{"index", "FILE", "faiss index file (required)"},
       {"queries", "IN", "safetensors with 'queries' (or one tensor), [nq, d] float (required)"},
       {"k", "N", "results per query (default 10)"},
       {"out", "OUT", "output safetensors file (required)"},
       {"ef-search", "N", "HNSW beam width (default: the efSearch stored in the file)"},
       {"exact", "", "search an HNSW file's vectors exhaustively instead of its graph"},
       {"threads", "N", "CPU threads (default: all cores)"}},
      argv,
      {"searchr1-index search --index data/e5_Flat.index --queries q.safetensors --k 3 "
       "--out top3.safetensors"});
  if (print_help(args)) return 0;
  set_threads(args);
  const FaissIndex index = open_faiss_index(args.required("index"));
  const std::string out = args.required("out");
  const int k = static_cast<int>(args.integer("k", 10, 1));
  const int ef = static_cast<int>(args.integer("ef-search", 0, 1));
  if (args.has("ef-search") && !index.has_hnsw) {
    throw UsageError("--ef-search applies to HNSW indexes; " + index.path + " is " +
                     type_name(index));
  }
  const auto file = SafetensorsFile::open(args.required("queries"));
  int64_t nq = 0, d = 0;
  const std::vector<float> queries = read_matrix(*file, "queries", &nq, &d);
  if (d != index.d) {
    throw Error(file->path() + ": queries have d = " + std::to_string(d) + " but " + index.path +
                " holds vectors of d = " + std::to_string(index.d));
  }
  const auto start = std::chrono::steady_clock::now();
  const TopK r = index.has_hnsw && !args.flag("exact")
                     ? hnsw_search(index, queries.data(), static_cast<int>(nq), k, ef)
                     : flat_search(index, queries.data(), static_cast<int>(nq), k);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<int64_t> shape = {nq, k};
  write_safetensors(out, {{"ids", DType::I64, shape, r.ids.data()},
                          {"scores", DType::F32, shape, r.scores.data()}});
  std::printf("%s\n", json::Value::object({{"nq", nq}, {"k", k}, {"seconds", seconds}})
                          .dump()
                          .c_str());
  return 0;
}

int cmd_write(const std::vector<std::string>& argv) {
  const Args args(
      "searchr1-index write",
      "Writes an IndexFlatIP (or IndexFlatL2) file of the rows of a safetensors matrix,\n"
      "byte for byte as faiss.write_index writes it, at a temporary name renamed into place.",
      {{"vectors", "IN", "safetensors with 'vectors' (or one tensor), [n, d] float (required)"},
       {"out", "FILE", "output index file (required)"},
       {"metric", "ip|l2", "inner product (IndexFlatIP, default) or L2 (IndexFlatL2)"},
       {"overwrite", "", "replace an existing output file"}},
      argv, {"searchr1-index write --vectors embeddings.safetensors --out data/e5_Flat.index"});
  if (print_help(args)) return 0;
  const std::string out = args.required("out"), metric = args.text("metric", "ip");
  if (metric != "ip" && metric != "l2") {
    throw UsageError("--metric must be ip or l2, not " + metric);
  }
  if (std::filesystem::exists(out) && !args.flag("overwrite")) {
    throw UsageError(out + ": already exists; pass --overwrite to replace it");
  }
  const auto file = SafetensorsFile::open(args.required("vectors"));
  int64_t n = 0, d = 0;
  const std::vector<float> vectors = read_matrix(*file, "vectors", &n, &d);
  FlatIndexWriter writer(out, static_cast<int>(d),
                         metric == "l2" ? Metric::L2 : Metric::InnerProduct);
  writer.append(vectors.data(), n);
  writer.commit();
  return 0;
}

}  // namespace
}  // namespace sr1

int main(int argc, char** argv) {
  sr1::ensure_passive_openmp(argv);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(sr1::kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> rest(argv + 2, argv + argc);
  try {
    if (command == "info") return sr1::cmd_info(rest);
    if (command == "search") return sr1::cmd_search(rest);
    if (command == "write") return sr1::cmd_write(rest);
    throw sr1::UsageError("unknown command '" + command + "' (info, search, write)");
  } catch (const sr1::UsageError& e) {
    std::fprintf(stderr, "searchr1-index: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "searchr1-index: error: %s\n", e.what());
    return 1;
  }
}
