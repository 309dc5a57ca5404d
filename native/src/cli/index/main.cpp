// searchr1-index: faiss index files without faiss (native/src/index/). `info` describes a
// file, `search` runs a batch of queries through it (exact for flat indexes, faiss's HNSW
// search for HNSW ones, faiss's IVF-PQ search for IVF ones), `write` makes an
// IndexFlatIP/IndexFlatL2 file faiss reads, `build` makes other index types from one, and
// `encode` embeds tokenized texts with a BERT-family encoder (model/bert.h) as the dense
// retriever does. Queries, token ids and results travel in safetensors files, as the
// trainer's batches do.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/common.h"
#include "index/faiss_io.h"
#include "index/faiss_write.h"
#include "index/flat_search.h"
#include "index/flat_search_cuda.h"
#include "index/hnsw_search.h"
#include "index/ivf_pq.h"
#include "index/session.h"
#include "io/safetensors.h"
#include "model/bert.h"
#include "util/error.h"
#include "util/json.h"

namespace sr1 {
namespace {

const char* kUsage =
    "Usage: searchr1-index <command> [options]\n"
    "\n"
    "Reads and writes faiss index files (IndexFlatIP 'IxFI', IndexFlatL2 'IxF2',\n"
    "IndexScalarQuantizer 'IxSQ', IndexHNSWFlat 'IHNf', IndexHNSWSQ 'IHNs', IndexIVFPQ\n"
    "'IwPQ') as they are, memory-mapped, without faiss.\n"
    "\n"
    "Commands:\n"
    "  info    the file's type, metric, dimension, size and HNSW parameters, as JSON\n"
    "  search  top-k ids and scores of a batch of query vectors\n"
    "  write   an IndexFlatIP / IndexFlatL2 file from a safetensors matrix of vectors\n"
    "  build   an HNSW / scalar-quantizer / IVF-PQ index (index_factory strings) from a flat file\n"
    "  encode  embeddings of tokenized texts with a BERT encoder (e5-base-v2's architecture)\n"
    "  serve   a long-lived process for searching, encoding and building over JSON lines\n"
    "\n"
    "Run 'searchr1-index <command> --help' for a command's options.\n"
    "\n"
    "Examples:\n"
    "  $ searchr1-index info --index data/e5_Flat.index\n"
    "  $ searchr1-index search --index data/e5_HNSW64.index --queries q.safetensors --k 3 "
    "--out top3.safetensors --ef-search 128\n"
    "  $ searchr1-index build --from data/e5_Flat.index --type HNSW64 "
    "--out data/e5_HNSW64.index\n"
    "  $ searchr1-index encode --model models/e5-base-v2 --input ids.safetensors "
    "--out emb.safetensors\n";

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

int cmd_info(const std::vector<std::string>& argv) {
  const Args args("searchr1-index info",
                  "Validates a faiss index file and prints one JSON line: path, type, fourcc,\n"
                  "metric, d, ntotal, bytes, vectors_offset and, for HNSW and IVF-PQ, their\n"
                  "parameters.",
                  {{"index", "FILE", "faiss index file (required)"}}, argv,
                  {"searchr1-index info --index data/e5_Flat.index"});
  if (print_help(args)) return 0;
  const FaissIndex index = open_faiss_index(args.required("index"));
  std::printf("%s\n", index_info_json(index).dump().c_str());
  return 0;
}

int cmd_search(const std::vector<std::string>& argv) {
  const Args args(
      "searchr1-index search",
      "Writes OUT with 'ids' (I64 [nq, k], row numbers, -1 where fewer than k) and 'scores'\n"
      "(F32 [nq, k]: inner products best first, or squared L2 distances best first), as\n"
      "faiss's index.search returns them. Flat indexes are searched exactly; HNSW ones\n"
      "with faiss's algorithm and efSearch (the file's unless --ef-search); IVF-PQ ones\n"
      "with faiss's, probing nprobe lists (the file's unless --nprobe). With --device\n"
      "cuda an exhaustive search runs on the GPU(s) with the vectors in fp16, as faiss's\n"
      "GPU index with useFloat16 (Search-R1's --faiss_gpu). Prints one JSON line with the\n"
      "seconds the search took (and the upload's, on the GPU).",
      {{"index", "FILE", "faiss index file (required)"},
       {"queries", "IN", "safetensors with 'queries' (or one tensor), [nq, d] float (required)"},
       {"k", "N", "results per query (default 10)"},
       {"out", "OUT", "output safetensors file (required)"},
       {"ef-search", "N", "HNSW beam width (default: the efSearch stored in the file)"},
       {"nprobe", "N", "IVF lists probed (default: the nprobe stored in the file)"},
       {"exact", "", "search an HNSW file's vectors exhaustively instead of its graph"},
       {"fp16", "", "search an fp16 copy held in memory (half the memory, rounded scores)"},
       {"device", "auto|cpu|cuda",
        "cuda: a flat index (or --exact) searched on the GPU in fp16; HNSW graphs stay on "
        "the CPU (default auto: the CPU)"},
       {"gpus", "N|LIST", "with --device cuda: shard over the first N GPUs, or the listed "
                          "ordinals (0,1) (default 1)"},
       {"block-rows", "N", "with --device cuda: rows per matmul (default: a 256 MiB score "
                           "matrix, at most 1M)"},
       {"tile-rows", "N", "with --device cuda: rows per top-k tile (default max(4096, 4k))"},
       {"threads", "N", "CPU threads (default: all cores)"}},
      argv,
      {"searchr1-index search --index data/e5_Flat.index --queries q.safetensors --k 3 "
       "--out top3.safetensors"});
  if (print_help(args)) return 0;
  set_threads(args);
  const bool cuda = index_on_cuda(args.text("device", "auto"));
  CudaFlatOptions gpu;
  if (args.has("gpus")) gpu.gpus = parse_gpus(args.required("gpus"));
  gpu.block_rows = static_cast<int>(args.integer("block-rows", 0, 1));
  gpu.tile_rows = static_cast<int>(args.integer("tile-rows", 0, 1));
  FaissIndex index = open_faiss_index(args.required("index"));
  const std::string out = args.required("out");
  const int k = static_cast<int>(args.integer("k", 10, 1));
  const int ef = static_cast<int>(args.integer("ef-search", 0, 1));
  const int nprobe = static_cast<int>(args.integer("nprobe", 0, 1));
  check_search_options(&index, args.has("ef-search"), args.has("nprobe"), args.flag("exact"));
  const bool graph = index.has_hnsw && !args.flag("exact");
  const bool on_gpu = cuda && !graph && !index.ivf;
  for (const char* option : {"gpus", "block-rows", "tile-rows"}) {
    if (args.has(option) && !on_gpu) {
      throw UsageError(std::string("--") + option + " applies to an exhaustive search with "
                       "--device cuda (a flat index, or --exact)");
    }
  }
  if (on_gpu && k > kCudaFlatMaxK) {
    throw UsageError("--k " + std::to_string(k) + ": --device cuda returns at most " +
                     std::to_string(kCudaFlatMaxK) + " neighbours per query");
  }
  if (cuda) require_cuda();
  if (cuda && !on_gpu) {
    std::fprintf(stderr, "searchr1-index: note: the %s is searched on the CPU "
                         "(--device cuda serves exhaustive search: a flat index, or --exact)\n",
                 index.ivf ? "IVF-PQ index" : "HNSW graph");
  }
  // On the GPU the vectors are fp16 whatever --fp16 says: no host copy is needed.
  if (args.flag("fp16") && !on_gpu) keep_fp16(index);
  const auto file = SafetensorsFile::open(args.required("queries"));
  int64_t nq = 0, d = 0;
  const std::vector<float> queries = read_matrix(*file, "queries", &nq, &d);
  if (d != index.d) {
    throw Error(file->path() + ": queries have d = " + std::to_string(d) + " but " + index.path +
                " holds vectors of d = " + std::to_string(index.d));
  }
  const auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  auto start = std::chrono::steady_clock::now();
  std::unique_ptr<CudaFlatIndex> gpu_index;
  if (on_gpu) gpu_index = upload_flat_index(index, gpu);
  const double upload_seconds = since(start);
  start = std::chrono::steady_clock::now();
  const TopK r = gpu_index   ? gpu_index->search(queries.data(), static_cast<int>(nq), k)
                 : index.ivf ? ivfpq_search(index, queries.data(), static_cast<int>(nq), k, nprobe)
                 : graph     ? hnsw_search(index, queries.data(), static_cast<int>(nq), k, ef)
                             : flat_search(index, queries.data(), static_cast<int>(nq), k);
  const double seconds = since(start);
  const std::vector<int64_t> shape = {nq, k};
  write_safetensors(out, {{"ids", DType::I64, shape, r.ids.data()},
                          {"scores", DType::F32, shape, r.scores.data()}});
  json::Value report = json::Value::object({{"nq", nq}, {"k", k}, {"seconds", seconds}});
  if (gpu_index) {
    report.set("device", "cuda");
    report.set("upload_seconds", upload_seconds);
  }
  std::printf("%s\n", report.dump().c_str());
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

int cmd_build(const std::vector<std::string>& argv) {
  const Args args(
      "searchr1-index build",
      "Builds the faiss index that index_factory(d, TYPE, METRIC_INNER_PRODUCT) makes, over\n"
      "the vectors of an IndexFlatIP file (row i keeps id i), and writes it in faiss's format\n"
      "at a temporary name renamed into place: Flat, HNSW{M} (IndexHNSWFlat), SQ8 / SQfp16\n"
      "(IndexScalarQuantizer), HNSW{M},SQ8 / HNSW{M},SQfp16 (IndexHNSWSQ), IVF{nlist},PQ{M}\n"
      "[x{nbits}] (IndexIVFPQ: k-means and PQ training on faiss's samples, every vector\n"
      "added). Graphs and IVF codes are made with faiss's algorithms on all threads. Progress\n"
      "lines on stderr; one JSON line on stdout: type, ntotal, bytes, max_level and the\n"
      "seconds the graph and the whole took.",
      {{"from", "FILE", "IndexFlatIP file with the vectors (required)"},
       {"type", "TYPE",
        "index_factory string: Flat, HNSW64, SQ8, HNSW32,SQ8, IVF4096,PQ64, ... (required)"},
       {"out", "FILE", "output index file (required)"},
       {"ef-construction", "N",
        "HNSW build beam (default " + std::to_string(kDefaultEfConstruction) + ")"},
       {"ef-search", "N", "HNSW search beam stored in the file (default 16, faiss's)"},
       {"overwrite", "", "replace an existing output file"},
       {"threads", "N", "CPU threads (default: all cores)"}},
      argv,
      {"searchr1-index build --from data/e5_Flat.index --type HNSW64 --out data/e5_HNSW64.index"});
  if (print_help(args)) return 0;
  set_threads(args);
  const FactorySpec spec = parse_factory(args.required("type"), "--type");
  const std::string out = args.required("out");
  BuildIndexOptions options;
  options.ef_construction = static_cast<int>(args.integer("ef-construction", 0, 1));
  options.ef_search = static_cast<int>(args.integer("ef-search", 16, 1));
  for (const char* option : {"ef-construction", "ef-search"}) {
    if (args.has(option) && spec.hnsw_m == 0) {
      throw UsageError(std::string("--") + option + " applies to HNSW types; " + spec.text +
                       " has no graph");
    }
  }
  if (std::filesystem::exists(out) && !args.flag("overwrite")) {
    throw UsageError(out + ": already exists; pass --overwrite to replace it");
  }
  const FaissIndex flat = open_faiss_index(args.required("from"));
  const auto start = std::chrono::steady_clock::now();
  int reported = -1;
  std::string stage;
  options.progress = [&](const std::string& what, int64_t done, int64_t total) {
    const int percent = total > 0 ? static_cast<int>(100 * done / total) : 100;
    if (what == stage && percent == reported) return;
    stage = what, reported = percent;
    std::fprintf(stderr, "searchr1-index: build %s: %s %lld/%lld (%d%%)\n", spec.text.c_str(),
                 what.c_str(), static_cast<long long>(done), static_cast<long long>(total),
                 percent);
  };
  const BuiltIndex built = build_faiss_index(flat, spec, out, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s\n", json::Value::object({{"type", built.type},
                                           {"factory", spec.text},
                                           {"ntotal", flat.ntotal},
                                           {"bytes", static_cast<int64_t>(built.bytes)},
                                           {"max_level", built.max_level},
                                           {"graph_seconds", built.graph_seconds},
                                           {"seconds", seconds}})
                          .dump()
                          .c_str());
  return 0;
}

// A [B, T] integer tensor of the encode input, as int32 (the caller checks the values).
std::vector<int32_t> read_tokens(const SafetensorsFile& file, const TensorView& t, int64_t B,
                                 int64_t T) {
  if (t.dtype != DType::I32 && t.dtype != DType::I64) {
    throw Error(file.path() + ": tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) +
                "; expected I32 or I64");
  }
  if (t.shape.size() != 2 || (B >= 0 && (t.shape[0] != B || t.shape[1] != T))) {
    throw Error(file.path() + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) +
                "; expected " + (B >= 0 ? shape_str({B, T}) : std::string("[B, T]")));
  }
  const std::vector<int64_t> wide = read_i64(t);
  std::vector<int32_t> out(wide.size());
  for (size_t i = 0; i < wide.size(); i++) {
    // Clamped only so that the narrowing is defined: the range checks still see a bad value.
    out[i] = static_cast<int32_t>(std::clamp<int64_t>(wide[i], INT32_MIN, INT32_MAX));
  }
  return out;
}

int cmd_encode(const std::vector<std::string>& argv) {
  const Args args(
      "searchr1-index encode",
      "Embeds tokenized texts with a BERT-family encoder (e5-base-v2's architecture) as\n"
      "Search-R1's dense retriever does: the model's last hidden state, mean-pooled over the\n"
      "attention mask (or its [CLS] row), then L2-normalised. IN holds 'input_ids' (I32 or\n"
      "I64 [B, T], as the model's tokenizer makes them: [CLS] text [SEP], padded) and\n"
      "optionally 'attention_mask' (the same shape, 1 for a token and 0 for padding; all\n"
      "ones when absent). Writes OUT with 'embeddings' (F32 [B, d]) and prints one JSON\n"
      "line: rows, dim and the seconds the encoding took (loading the model excluded).",
      concat({{"model", "DIR", "Hugging Face BERT model folder (required)"},
              {"input", "IN", "safetensors with 'input_ids' and 'attention_mask' (required)"},
              {"out", "OUT", "output safetensors file (required)"},
              {"pooling", "mean|cls", "masked mean of the tokens (default, e5's) or the [CLS] row"},
              {"no-normalize", "", "leave the pooled vectors as they are (no L2 normalisation)"},
              {"batch-size", "N", "rows per forward pass (default 64): bounds the memory"}},
             device_options()),
      argv,
      {"searchr1-index encode --model models/e5-base-v2 --input ids.safetensors "
       "--out emb.safetensors --pooling mean --threads 2"});
  if (print_help(args)) return 0;
  const std::string model_dir = args.required("model"), out = args.required("out");
  const Pooling pooling = parse_pooling(args.text("pooling", "mean"));
  const bool normalize = !args.flag("no-normalize");
  const int chunk = static_cast<int>(args.integer("batch-size", 64, 1));
  const auto file = SafetensorsFile::open(args.required("input"));
  const std::unique_ptr<Backend> backend = open_backend(args);
  const std::unique_ptr<BertEncoder> encoder = BertEncoder::load(model_dir, *backend);
  const BertConfig& c = encoder->config();

  const TensorView* ids_t = file->find("input_ids");
  if (ids_t == nullptr) throw Error(file->path() + ": tensor 'input_ids' is missing");
  const std::vector<int32_t> ids = read_tokens(*file, *ids_t, -1, -1);
  const int64_t B = ids_t->shape[0], T = ids_t->shape[1];
  if (T < 1) throw Error(file->path() + ": tensor 'input_ids' has no columns");
  if (T > c.max_position_embeddings) {
    throw Error(file->path() + ": tensor 'input_ids' has " + std::to_string(T) +
                " tokens per row, more than the max_position_embeddings (" +
                std::to_string(c.max_position_embeddings) + ") of " + model_dir +
                "/config.json; truncate when tokenizing");
  }
  std::vector<int32_t> mask(ids.size(), 1);
  if (const TensorView* m = file->find("attention_mask")) mask = read_tokens(*file, *m, B, T);
  for (int64_t b = 0; b < B; b++) {
    bool any = false;
    for (int64_t t = 0; t < T; t++) {
      const size_t i = static_cast<size_t>(b * T + t);
      const auto at = [&] { return " at [" + std::to_string(b) + ", " + std::to_string(t) + "]"; };
      if (mask[i] != 0 && mask[i] != 1) {
        throw Error(file->path() + ": tensor 'attention_mask' holds " + std::to_string(mask[i]) +
                    at() + "; expected 0 or 1");
      }
      if (mask[i] == 1 && (ids[i] < 0 || ids[i] >= c.vocab_size)) {
        throw Error(file->path() + ": tensor 'input_ids' holds token " + std::to_string(ids[i]) +
                    at() + ", outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                    ") of " + model_dir);
      }
      any |= mask[i] == 1;
    }
    if (!any) {
      throw Error(file->path() + ": row " + std::to_string(b) +
                  " of 'attention_mask' is all 0 (a text has at least [CLS] and [SEP])");
    }
  }

  const int d = encoder->dim();
  std::vector<float> embeddings(static_cast<size_t>(B) * d);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t b0 = 0; b0 < B; b0 += chunk) {
    const int n = static_cast<int>(std::min<int64_t>(chunk, B - b0));
    const size_t at = static_cast<size_t>(b0 * T);
    encoder->encode(ids.data() + at, mask.data() + at, n, static_cast<int>(T), pooling,
                    normalize, embeddings.data() + static_cast<size_t>(b0) * d);
  }
  backend->synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  write_safetensors(out, {{"embeddings", DType::F32, {B, d}, embeddings.data()}});
  std::printf("%s\n", json::Value::object({{"rows", B}, {"dim", d}, {"seconds", seconds}})
                          .dump()
                          .c_str());
  return 0;
}

}  // namespace

int cmd_index_serve(const std::vector<std::string>& argv);  // cli/index/serve.cpp

}  // namespace sr1

int main(int argc, char** argv) {
  sr1::ensure_thread_policy(argv, /*blas_threads_sleep=*/true);
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
    if (command == "build") return sr1::cmd_build(rest);
    if (command == "encode") return sr1::cmd_encode(rest);
    if (command == "serve") return sr1::cmd_index_serve(rest);
    throw sr1::UsageError("unknown command '" + command + "' (info, search, write, build, encode, serve)");
  } catch (const sr1::UsageError& e) {
    std::fprintf(stderr, "searchr1-index: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "searchr1-index: error: %s\n", e.what());
    return 1;
  }
}
