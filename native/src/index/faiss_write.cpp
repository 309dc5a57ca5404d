#include "index/faiss_write.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include "index/hnsw_build.h"
#include "util/error.h"

namespace sr1 {

FactorySpec parse_factory(const std::string& text, const std::string& flag) {
  const auto refuse = [&](const std::string& why) -> FactorySpec {
    throw UsageError(flag + " " + text + ": " + why +
                     " (searchr1 builds Flat, HNSW{M}, HNSW{M},Flat, SQ8, SQfp16, "
                     "HNSW{M},SQ8 and HNSW{M},SQfp16, e.g. HNSW64)");
  };
  FactorySpec spec;
  spec.text = text;
  std::string storage = text;
  if (text.rfind("HNSW", 0) == 0) {
    const size_t comma = text.find(',');
    const std::string m = text.substr(4, comma == std::string::npos ? std::string::npos : comma - 4);
    if (m.empty() || m.size() > 4 || !std::all_of(m.begin(), m.end(), ::isdigit)) {
      return refuse("HNSW needs its M, a number (HNSW32)");
    }
    spec.hnsw_m = std::stoi(m);
    if (spec.hnsw_m < 2 || spec.hnsw_m > 1024) return refuse("M must be in 2..1024");
    storage = comma == std::string::npos ? "Flat" : text.substr(comma + 1);
  }
  if (storage == "Flat") {
    spec.storage = FactorySpec::Storage::Flat;
  } else if (storage == "SQ8") {
    spec.storage = FactorySpec::Storage::SQ8;
  } else if (storage == "SQfp16") {
    spec.storage = FactorySpec::Storage::SQfp16;
  } else if (storage.rfind("IVF", 0) == 0) {
    return refuse("IVF indexes are not built by searchr1 yet");
  } else {
    return refuse("unknown index_factory string");
  }
  return spec;
}

namespace {

// A file written at `<out>.partial-<pid>` and renamed to `out` by commit(); removed if
// destroyed before.
class OutFile {
 public:
  explicit OutFile(std::string out)
      : out_(std::move(out)), partial_(out_ + ".partial-" + std::to_string(getpid())) {
    f_ = std::fopen(partial_.c_str(), "wb");
    if (f_ == nullptr) throw Error(partial_ + ": cannot create (" + std::strerror(errno) + ")");
  }
  ~OutFile() {
    if (f_ != nullptr) {
      std::fclose(f_);
      std::remove(partial_.c_str());
    }
  }
  void bytes(const void* p, size_t n) {
    if (n > 0 && std::fwrite(p, 1, n, f_) != n) fail();
    written_ += n;
  }
  template <class T>
  void put(T v) {
    bytes(&v, sizeof v);
  }
  // WRITEVECTOR: the element count as a u64, then the elements.
  template <class T>
  void vec(const T* p, uint64_t n) {
    put<uint64_t>(n);
    bytes(p, n * sizeof(T));
  }
  uint64_t written() const { return written_; }
  void commit() {
    const bool ok = std::fflush(f_) == 0 && fsync(fileno(f_)) == 0;
    const int err = errno;
    const bool closed = std::fclose(f_) == 0;
    f_ = nullptr;
    if (!ok || !closed || std::rename(partial_.c_str(), out_.c_str()) != 0) {
      const int why = ok ? errno : err;
      std::remove(partial_.c_str());
      throw Error(out_ + ": cannot write (" + std::strerror(why) + ")");
    }
  }

 private:
  [[noreturn]] void fail() { throw Error(partial_ + ": cannot write (" + std::strerror(errno) + ")"); }
  std::string out_, partial_;
  FILE* f_ = nullptr;
  uint64_t written_ = 0;
};

// write_index_header: d, ntotal, two dummies, is_trained, metric_type (inner product).
void header(OutFile& f, int d, int64_t ntotal) {
  f.put<int32_t>(d);
  f.put<int64_t>(ntotal);
  f.put<int64_t>(int64_t{1} << 20);
  f.put<int64_t>(int64_t{1} << 20);
  f.put<uint8_t>(1);
  f.put<int32_t>(static_cast<int32_t>(Metric::InnerProduct));
}

void write_graph(OutFile& f, const HnswGraphData& g) {
  f.vec(g.assign_probas.data(), g.assign_probas.size());
  f.vec(g.cum_nneighbor_per_level.data(), g.cum_nneighbor_per_level.size());
  f.vec(g.levels.data(), g.levels.size());
  f.vec(g.offsets.data(), g.offsets.size());
  f.vec(g.neighbors.data(), g.neighbors.size());
  f.put<int32_t>(g.entry_point);
  f.put<int32_t>(g.max_level);
  f.put<int32_t>(g.ef_construction);
  f.put<int32_t>(g.ef_search);
  f.put<int32_t>(1);  // upper_beam, deprecated: faiss writes 1
}

constexpr int64_t kChunkRows = 16384;

// IxFI: the flat file's vectors copied as they are.
void write_flat(OutFile& f, const FaissIndex& flat) {
  f.bytes("IxFI", 4);
  header(f, flat.d, flat.ntotal);
  f.put<uint64_t>(flat.vectors.n);
  std::vector<float> rows;
  for (int64_t r = 0; r < flat.ntotal; r += kChunkRows) {
    const int64_t n = std::min(kChunkRows, flat.ntotal - r);
    rows.resize(size_t(n) * flat.d);
    flat.copy_rows(r, n, rows.data());
    f.bytes(rows.data(), rows.size() * sizeof(float));
  }
}

void write_sq(OutFile& f, const ScalarQuantizer& sq, int64_t ntotal,
              const std::vector<uint8_t>& codes) {
  f.bytes("IxSQ", 4);
  header(f, sq.d, ntotal);
  f.put<int32_t>(static_cast<int32_t>(sq.qtype));
  f.put<int32_t>(sq.rangestat);
  f.put<float>(sq.rangestat_arg);
  f.put<uint64_t>(uint64_t(sq.d));
  f.put<uint64_t>(sq.code_size());
  f.vec(sq.trained.data(), sq.trained.size());
  f.vec(codes.data(), codes.size());
}

// Rows of the flat file, where they lie.
class FlatRows : public RowSource {
 public:
  explicit FlatRows(const FaissIndex& flat) : flat_(flat) {}
  int64_t rows() const override { return flat_.ntotal; }
  int dim() const override { return flat_.d; }
  const float* row(int64_t i, float* scratch) const override {
    const float* r = flat_.mapped_rows(i);
    if (r != nullptr) return r;
    flat_.copy_rows(i, 1, scratch);
    return scratch;
  }

 private:
  const FaissIndex& flat_;
};

// Rows decoded from scalar-quantizer codes, as faiss's IndexHNSWSQ builds on them.
class CodeRows : public RowSource {
 public:
  CodeRows(const ScalarQuantizer& sq, const std::vector<uint8_t>& codes, int64_t n)
      : sq_(sq), codes_(codes), n_(n) {}
  int64_t rows() const override { return n_; }
  int dim() const override { return sq_.d; }
  const float* row(int64_t i, float* scratch) const override {
    sq_.decode(codes_.data() + uint64_t(i) * sq_.code_size(), scratch);
    return scratch;
  }

 private:
  const ScalarQuantizer& sq_;
  const std::vector<uint8_t>& codes_;
  int64_t n_;
};

// Trains (SQ8: min and max per dimension over every vector, as Search-R1 trains on all its
// embeddings) and encodes every vector.
std::vector<uint8_t> quantize(const FaissIndex& flat, ScalarQuantizer& sq,
                              const BuildIndexOptions& options) {
  const int64_t n = flat.ntotal;
  std::vector<float> rows;
  if (sq.qtype == SqType::QT_8bit) {
    for (int64_t r = 0; r < n; r += kChunkRows) {
      const int64_t m = std::min(kChunkRows, n - r);
      rows.resize(size_t(m) * flat.d);
      flat.copy_rows(r, m, rows.data());
      sq.observe(rows.data(), m);
      if (options.progress) options.progress("training", r + m, n);
    }
    if (n == 0) sq.trained.assign(size_t(2) * flat.d, 0.f);
    sq.finish_training();
  }
  std::vector<uint8_t> codes(uint64_t(n) * sq.code_size());
  for (int64_t r = 0; r < n; r += kChunkRows) {
    const int64_t m = std::min(kChunkRows, n - r);
#pragma omp parallel
    {
      std::vector<float> row(flat.d);
#pragma omp for schedule(static)
      for (int64_t i = r; i < r + m; i++) {
        flat.copy_rows(i, 1, row.data());
        sq.encode(row.data(), codes.data() + uint64_t(i) * sq.code_size());
      }
    }
    if (options.progress) options.progress("encoding", r + m, n);
  }
  return codes;
}

}  // namespace

BuiltIndex build_faiss_index(const FaissIndex& flat, const FactorySpec& spec,
                             const std::string& out, const BuildIndexOptions& options) {
  if (flat.has_hnsw || flat.metric != Metric::InnerProduct) {
    throw Error(flat.path + ": is " + index_type_name(flat) +
                "; the vectors to build from must be an IndexFlatIP file");
  }
  BuiltIndex built;
  ScalarQuantizer sq;
  sq.d = flat.d;
  std::vector<uint8_t> codes;
  const bool quantized = spec.storage != FactorySpec::Storage::Flat;
  if (quantized) {
    sq.qtype = spec.storage == FactorySpec::Storage::SQfp16 ? SqType::QT_fp16 : SqType::QT_8bit;
    codes = quantize(flat, sq, options);
  }
  HnswGraphData graph;
  if (spec.hnsw_m > 0) {
    HnswBuildOptions h;
    h.M = spec.hnsw_m;
    h.ef_construction = options.ef_construction > 0 ? options.ef_construction
                                                    : kDefaultEfConstruction;
    h.ef_search = options.ef_search;
    if (options.progress) {
      h.progress = [&](int64_t done, int64_t total) { options.progress("graph", done, total); };
    }
    const auto start = std::chrono::steady_clock::now();
    if (quantized) {
      graph = build_hnsw(CodeRows(sq, codes, flat.ntotal), h);
    } else {
      graph = build_hnsw(FlatRows(flat), h);
    }
    built.graph_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    built.max_level = graph.max_level;
  }
  OutFile f(out);
  if (spec.hnsw_m > 0) {
    f.bytes(quantized ? "IHNs" : "IHNf", 4);
    header(f, flat.d, flat.ntotal);
    write_graph(f, graph);
  }
  if (quantized) {
    write_sq(f, sq, flat.ntotal, codes);
  } else {
    write_flat(f, flat);
  }
  built.bytes = f.written();
  f.commit();
  built.type = spec.hnsw_m > 0 ? (quantized ? "IndexHNSWSQ" : "IndexHNSWFlat")
               : quantized     ? "IndexScalarQuantizer"
                               : "IndexFlatIP";
  return built;
}

}  // namespace sr1
