#include "index/faiss_write.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include "index/hnsw_build.h"
#include "index/ivf_pq_build.h"
#include "util/error.h"

namespace sr1 {

namespace {

// faiss's parse_nlist: digits, then k (x 1024) or M (x 1048576); 0 where malformed or
// beyond 2^31 - 1.
int parse_nlist(const std::string& s) {
  std::string digits = s;
  int64_t multiplier = 1;
  if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'M')) {
    multiplier = digits.back() == 'k' ? 1024 : 1024 * 1024;
    digits.pop_back();
  }
  if (digits.empty() || digits.size() > 10 ||
      !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
    return 0;
  }
  const int64_t n = std::stoll(digits) * multiplier;
  return n >= 1 && n < (int64_t{1} << 31) ? static_cast<int>(n) : 0;
}

// "PQ{M}" or "PQ{M}x{nbits}": M and nbits, or false.
bool parse_pq(const std::string& s, int& m, int& nbits) {
  if (s.rfind("PQ", 0) != 0) return false;
  const size_t x = s.find('x', 2);
  const std::string ms = s.substr(2, x == std::string::npos ? std::string::npos : x - 2);
  const std::string bs = x == std::string::npos ? "8" : s.substr(x + 1);
  const auto number = [](const std::string& t) {
    return !t.empty() && t.size() <= 5 && std::all_of(t.begin(), t.end(), ::isdigit);
  };
  if (!number(ms) || !number(bs)) return false;
  m = std::stoi(ms);
  nbits = std::stoi(bs);
  return true;
}

}  // namespace

FactorySpec parse_factory(const std::string& text, const std::string& flag) {
  const auto refuse = [&](const std::string& why) -> FactorySpec {
    throw UsageError(flag + " " + text + ": " + why +
                     " (searchr1 builds Flat, HNSW{M}, HNSW{M},Flat, SQ8, SQfp16, "
                     "HNSW{M},SQ8, HNSW{M},SQfp16 and IVF{nlist},PQ{M}[x{nbits}], e.g. HNSW64 "
                     "or IVF4096,PQ64)");
  };
  FactorySpec spec;
  spec.text = text;
  spec.flag = flag;
  std::string storage = text;
  if (text.rfind("IVF", 0) == 0) {
    const size_t comma = text.find(',');
    spec.ivf_nlist = parse_nlist(text.substr(3, comma == std::string::npos ? std::string::npos
                                                                           : comma - 3));
    if (spec.ivf_nlist == 0) {
      return refuse("IVF needs its number of lists, from 1 to 2^31 - 1 (IVF4096, IVF4k)");
    }
    const std::string code = comma == std::string::npos ? "" : text.substr(comma + 1);
    if (!parse_pq(code, spec.pq_m, spec.pq_nbits)) {
      return refuse("an IVF index is built with PQ codes only (IVF{nlist},PQ{M}[x{nbits}])");
    }
    if (spec.pq_m < 1) return refuse("PQ needs at least one sub-quantizer (PQ64)");
    if (spec.pq_nbits < 1 || spec.pq_nbits > 8) {
      return refuse("PQ codes of 1 to 8 bits are supported (faiss 1.7.3's IndexIVFPQ builds "
                    "no more), not " + std::to_string(spec.pq_nbits));
    }
    spec.storage = FactorySpec::Storage::PQ;
    return spec;
  }
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

// IwPQ (write_index's IndexIVFPQ case): write_ivf_header (the header, nlist, nprobe 1 as
// faiss leaves it, the quantizer as an IxFI index, a direct map of type 0 with an empty
// array), by_residual, code_size, write_ProductQuantizer (d, M, nbits, centroids), and
// write_InvertedLists: "ilar", nlist, code_size, the sizes ("full", one per list, when more
// than half the lists hold entries; else "sprs", (list, size) pairs of the non-empty ones),
// then each non-empty list's codes and ids (int64), its entries in row order.
void write_ivfpq(OutFile& f, const IvfPqBuilt& b) {
  const uint64_t code_size = b.pq.code_size();
  f.bytes("IwPQ", 4);
  header(f, b.d, b.ntotal);
  f.put<uint64_t>(uint64_t(b.nlist));
  f.put<uint64_t>(1);  // nprobe
  f.bytes("IxFI", 4);
  header(f, b.d, b.nlist);
  f.vec(b.centroids.data(), b.centroids.size());
  f.put<uint8_t>(0);  // DirectMap::NoMap
  f.put<uint64_t>(0);
  f.put<uint8_t>(1);  // by_residual
  f.put<uint64_t>(code_size);
  f.put<uint64_t>(uint64_t(b.d));
  f.put<uint64_t>(uint64_t(b.pq.M));
  f.put<uint64_t>(uint64_t(b.pq.nbits));
  f.vec(b.pq.centroids.data(), b.pq.centroids.size());
  // Rows bucketed by list, each bucket in row order (a stable counting sort).
  std::vector<uint64_t> sizes(b.nlist, 0);
  for (const int32_t l : b.list) sizes[l]++;
  std::vector<uint64_t> start(b.nlist + 1, 0);
  for (int l = 0; l < b.nlist; l++) start[l + 1] = start[l] + sizes[l];
  std::vector<int64_t> order(static_cast<size_t>(b.ntotal));
  {
    std::vector<uint64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < b.ntotal; i++) order[next[b.list[i]]++] = i;
  }
  f.bytes("ilar", 4);
  f.put<uint64_t>(uint64_t(b.nlist));
  f.put<uint64_t>(code_size);
  const int64_t non_empty =
      std::count_if(sizes.begin(), sizes.end(), [](uint64_t n) { return n > 0; });
  if (non_empty > b.nlist / 2) {
    f.bytes("full", 4);
    f.vec(sizes.data(), sizes.size());
  } else {
    f.bytes("sprs", 4);
    std::vector<uint64_t> pairs;
    for (int l = 0; l < b.nlist; l++) {
      if (sizes[l] > 0) pairs.insert(pairs.end(), {uint64_t(l), sizes[l]});
    }
    f.vec(pairs.data(), pairs.size());
  }
  std::vector<uint8_t> codes;
  for (int l = 0; l < b.nlist; l++) {
    if (sizes[l] == 0) continue;
    const int64_t* ids = order.data() + start[l];
    codes.resize(sizes[l] * code_size);
    for (uint64_t j = 0; j < sizes[l]; j++) {
      std::memcpy(codes.data() + j * code_size, b.codes.data() + uint64_t(ids[j]) * code_size,
                  code_size);
    }
    f.bytes(codes.data(), codes.size());
    f.bytes(ids, sizes[l] * sizeof(int64_t));
  }
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
  if (flat.has_hnsw || flat.ivf || flat.metric != Metric::InnerProduct) {
    throw Error(flat.path + ": is " + index_type_name(flat) +
                "; the vectors to build from must be an IndexFlatIP file");
  }
  BuiltIndex built;
  if (spec.storage == FactorySpec::Storage::PQ) {
    IvfPqShape shape;
    shape.nlist = spec.ivf_nlist;
    shape.M = spec.pq_m;
    shape.nbits = spec.pq_nbits;
    const IvfPqBuilt b = build_ivfpq(flat, shape, spec.flag + " " + spec.text, options.progress);
    OutFile f(out);
    write_ivfpq(f, b);
    built.bytes = f.written();
    f.commit();
    built.type = "IndexIVFPQ";
    return built;
  }
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
