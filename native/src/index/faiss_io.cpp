#include "index/faiss_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "index/ivf_pq.h"
#include "io/safetensors.h"
#include "util/error.h"

namespace sr1 {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "faiss files are little-endian; this reader copies bytes as they are");

const char* metric_name(Metric m) { return m == Metric::L2 ? "l2" : "inner_product"; }

// ---------------------------------------------------------------------------------------
// MappedFile

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(path + ": cannot memory-map (" + std::strerror(err) + ")");
    }
    f->data_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  return f;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<unsigned char*>(data_), size_);
}

// madvise wants a page-aligned start: round it down.
static void advise(const unsigned char* base, uint64_t offset, uint64_t len, int advice) {
  if (base == nullptr || len == 0) return;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  madvise(const_cast<unsigned char*>(base) + start, len + (offset - start), advice);
}
void MappedFile::advise_sequential(uint64_t offset, uint64_t len) const {
  advise(data_, offset, len, MADV_SEQUENTIAL);
}
void MappedFile::advise_random(uint64_t offset, uint64_t len) const {
  advise(data_, offset, len, MADV_RANDOM);
}
// Rounding the start down drops a page of what precedes too: harmless, it is file-backed.
void MappedFile::release(uint64_t offset, uint64_t len) const {
  advise(data_, offset, len, MADV_DONTNEED);
}

void MappedFile::populate(uint64_t offset, uint64_t len,
                          const std::function<void(uint64_t done)>& progress) const {
  if (data_ == nullptr || len == 0) return;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  constexpr uint64_t kChunk = uint64_t{1} << 28;
  for (uint64_t done = 0; done < len; done += kChunk) {
    const uint64_t at = offset + done, n = std::min(kChunk, len - done);
#ifdef MADV_POPULATE_READ
    const bool populated = [&] {
      const uint64_t start = at / page * page;
      return madvise(const_cast<unsigned char*>(data_) + start, n + (at - start),
                     MADV_POPULATE_READ) == 0;
    }();
#else
    const bool populated = false;
#endif
    if (!populated) {  // an older kernel: touch each page
      volatile unsigned char sink = 0;
      for (uint64_t p = at / page * page; p < at + n; p += page) sink = sink + data_[p];
    }
    progress(done + n);
  }
}

// ---------------------------------------------------------------------------------------
// Reading: a cursor over the mapped bytes that names the field it failed on.

namespace {

std::string fourcc_text(const unsigned char* p) {
  std::string s;
  for (int i = 0; i < 4; i++) {
    if (p[i] >= 0x20 && p[i] < 0x7f) {
      s += static_cast<char>(p[i]);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", p[i]);
      s += hex;
    }
  }
  return s;
}

class Cursor {
 public:
  explicit Cursor(const MappedFile& f) : f_(f) {}
  uint64_t pos() const { return pos_; }
  [[noreturn]] void fail(const std::string& what) const { throw Error(f_.path() + ": " + what); }

  // The next `bytes` bytes, or a "truncated" error naming `field`.
  const unsigned char* take(uint64_t bytes, const std::string& field) {
    if (bytes > f_.size() - pos_) {
      fail("truncated: " + field + " needs " + std::to_string(bytes) + " bytes at byte " +
           std::to_string(pos_) + ", but the file ends at byte " + std::to_string(f_.size()));
    }
    const unsigned char* p = f_.data() + pos_;
    pos_ += bytes;
    return p;
  }
  template <class T>
  T read(const std::string& field) {
    T v;
    std::memcpy(&v, take(sizeof(T), field), sizeof(T));
    return v;
  }
  std::string fourcc(const std::string& field) { return fourcc_text(take(4, field)); }

  // faiss's WRITEVECTOR: a u64 element count, then the elements.
  template <class T>
  UnalignedArray<T> array(const std::string& field) {
    const uint64_t n = read<uint64_t>(field + " length");
    if (n > (f_.size() - pos_) / sizeof(T)) {
      fail("truncated: " + field + " has " + std::to_string(n) + " elements of " +
           std::to_string(sizeof(T)) + " bytes at byte " + std::to_string(pos_) +
           ", but the file ends at byte " + std::to_string(f_.size()));
    }
    return {take(n * sizeof(T), field), n};
  }
  // n elements with no length before them.
  template <class T>
  UnalignedArray<T> raw(uint64_t n, const std::string& field) {
    if (n > (f_.size() - pos_) / sizeof(T)) {
      fail("truncated: " + field + " need " + std::to_string(n * sizeof(T)) + " bytes from byte " +
           std::to_string(pos_) + ", but the file ends at byte " + std::to_string(f_.size()));
    }
    return {take(n * sizeof(T), field), n};
  }
  template <class T>
  std::vector<T> vector(const std::string& field) {
    const UnalignedArray<T> a = array<T>(field);
    std::vector<T> v(a.n);
    a.copy(0, a.n, v.data());
    return v;
  }

 private:
  const MappedFile& f_;
  uint64_t pos_ = 0;
};

struct Header {
  int d = 0;
  int64_t ntotal = 0;
  Metric metric = Metric::InnerProduct;
};

// write_index_header: d, ntotal, two dummies, is_trained, metric (+ metric_arg if > 1).
Header read_header(Cursor& c, const std::string& what) {
  Header h;
  const int32_t d = c.read<int32_t>(what + " d");
  const int64_t ntotal = c.read<int64_t>(what + " ntotal");
  c.read<int64_t>(what + " header");
  c.read<int64_t>(what + " header");
  c.read<uint8_t>(what + " is_trained");
  const int32_t metric = c.read<int32_t>(what + " metric_type");
  if (metric > 1) c.read<float>(what + " metric_arg");
  if (d <= 0 || d > (1 << 20)) {
    c.fail(what + " dimension d = " + std::to_string(d) + " is out of range (1 to 1048576)");
  }
  if (ntotal < 0) c.fail(what + " ntotal = " + std::to_string(ntotal) + " is negative");
  if (metric != 0 && metric != 1) {
    c.fail(what + " metric_type " + std::to_string(metric) +
           " is not supported (0 = inner product, 1 = L2)");
  }
  h.d = d;
  h.ntotal = ntotal;
  h.metric = metric == 1 ? Metric::L2 : Metric::InnerProduct;
  return h;
}

// An IxFI / IxF2 block after its fourcc: header, float count, the vectors.
void read_flat(Cursor& c, const std::string& fourcc, FaissIndex& index) {
  const Header h = read_header(c, "the index header's");
  const Metric want = fourcc == "IxF2" ? Metric::L2 : Metric::InnerProduct;
  if (h.metric != want) {
    c.fail(fourcc + " (IndexFlat" + (want == Metric::L2 ? "L2" : "IP") +
           ") must have metric_type " + std::to_string(static_cast<int>(want)) + ", not " +
           std::to_string(static_cast<int>(h.metric)));
  }
  const uint64_t count = c.read<uint64_t>("the vectors' float count");
  const uint64_t expected = static_cast<uint64_t>(h.ntotal) * static_cast<uint64_t>(h.d);
  if (count != expected) {
    c.fail("the header says ntotal = " + std::to_string(h.ntotal) + " vectors of d = " +
           std::to_string(h.d) + " (" + std::to_string(expected) + " floats) but the data holds " +
           std::to_string(count) + " floats");
  }
  index.vectors_offset = c.pos();
  index.vectors = c.raw<float>(
      count, std::to_string(h.ntotal) + " vectors of d = " + std::to_string(h.d));
  index.d = h.d;
  index.ntotal = h.ntotal;
  index.metric = h.metric;
}


// write_HNSW: assign_probas, cum_nneighbor_per_level, levels, offsets, neighbors, then
// entry_point, max_level, efConstruction, efSearch and the deprecated upper_beam.
HnswGraph read_hnsw_graph(Cursor& c) {
  HnswGraph g;
  g.assign_probas = c.vector<double>("HNSW assign_probas");
  g.cum_nneighbor_per_level = c.vector<int32_t>("HNSW cum_nneighbor_per_level");
  g.levels = c.array<int32_t>("HNSW levels");
  g.offsets = c.array<uint64_t>("HNSW offsets");
  g.neighbors = c.array<int32_t>("HNSW neighbors");
  g.entry_point = c.read<int32_t>("HNSW entry_point");
  g.max_level = c.read<int32_t>("HNSW max_level");
  g.ef_construction = c.read<int32_t>("HNSW efConstruction");
  g.ef_search = c.read<int32_t>("HNSW efSearch");
  c.read<int32_t>("HNSW upper_beam");
  return g;
}

// What faiss's validate_HNSW checks, but for neighbour ids (checked as search reads them).
// O(ntotal) reads of levels and offsets: a fraction of a second for 21M nodes.
void validate_hnsw(const Cursor& c, const HnswGraph& g, int64_t ntotal) {
  const std::vector<int32_t>& cum = g.cum_nneighbor_per_level;
  if (cum.size() < 2 || cum[0] != 0) {
    c.fail("HNSW cum_nneighbor_per_level must start with 0 and have at least 2 entries");
  }
  for (size_t l = 1; l < cum.size(); l++) {
    if (cum[l] < cum[l - 1]) c.fail("HNSW cum_nneighbor_per_level is not increasing");
  }
  const uint64_t n = static_cast<uint64_t>(ntotal);
  if (g.levels.n != n || g.offsets.n != n + 1) {
    c.fail("HNSW graph has " + std::to_string(g.levels.n) + " levels and " +
           std::to_string(g.offsets.n) + " offsets for ntotal = " + std::to_string(ntotal) +
           " (expected ntotal and ntotal + 1)");
  }
  if (g.offsets[0] != 0 || g.offsets[n] != g.neighbors.n) {
    c.fail("HNSW offsets must run from 0 to the neighbour count " +
           std::to_string(g.neighbors.n));
  }
  for (uint64_t i = 0; i < n; i++) {
    const int32_t level = g.levels[i];
    if (level < 1 || static_cast<size_t>(level) >= cum.size()) {
      c.fail("HNSW levels[" + std::to_string(i) + "] = " + std::to_string(level) +
             " is out of range [1, " + std::to_string(cum.size() - 1) + "]");
    }
    if (g.offsets[i + 1] != g.offsets[i] + static_cast<uint64_t>(cum[level])) {
      c.fail("HNSW offsets[" + std::to_string(i + 1) + "] does not follow from node " +
             std::to_string(i) + "'s level");
    }
  }
  if (ntotal > 0 && (g.entry_point < 0 || g.entry_point >= ntotal)) {
    c.fail("HNSW entry_point " + std::to_string(g.entry_point) + " is not a node");
  }
  // The descent starts at the entry point on max_level: the node must have that level.
  if (ntotal > 0 && (g.max_level < 0 || g.max_level + 1 > g.levels[g.entry_point])) {
    c.fail("HNSW max_level " + std::to_string(g.max_level) +
           " is above the entry point's level");
  }
  if (g.ef_search < 1) c.fail("HNSW efSearch " + std::to_string(g.ef_search) + " must be >= 1");
}

// An IxSQ block after its fourcc (write_ScalarQuantizer, then the codes): QT_8bit with
// RS_minmax and QT_fp16, the types index_factory's SQ8 and SQfp16 make.
void read_sq(Cursor& c, FaissIndex& index) {
  const Header h = read_header(c, "the index header's");
  auto sq = std::make_shared<ScalarQuantizer>();
  const int32_t qtype = c.read<int32_t>("the scalar quantizer's qtype");
  if (qtype != static_cast<int32_t>(SqType::QT_8bit) &&
      qtype != static_cast<int32_t>(SqType::QT_fp16)) {
    c.fail("scalar quantizer qtype " + std::to_string(qtype) +
           " is not supported (searchr1 reads QT_8bit (0) and QT_fp16 (4): SQ8 and SQfp16)");
  }
  sq->qtype = static_cast<SqType>(qtype);
  sq->rangestat = c.read<int32_t>("the scalar quantizer's rangestat");
  sq->rangestat_arg = c.read<float>("the scalar quantizer's rangestat_arg");
  const uint64_t d = c.read<uint64_t>("the scalar quantizer's d");
  const uint64_t code_size = c.read<uint64_t>("the scalar quantizer's code_size");
  const std::vector<float> trained = c.vector<float>("the scalar quantizer's trained");
  if (d != static_cast<uint64_t>(h.d)) {
    c.fail("the scalar quantizer's d = " + std::to_string(d) + " is not the index's " +
           std::to_string(h.d));
  }
  sq->d = h.d;
  sq->trained = trained;
  if (code_size != sq->code_size()) {
    c.fail("the scalar quantizer's code_size = " + std::to_string(code_size) + ", not " +
           std::to_string(sq->code_size()) + " for d = " + std::to_string(h.d));
  }
  const uint64_t want_trained = sq->qtype == SqType::QT_8bit ? 2 * d : 0;
  if (trained.size() != want_trained) {
    c.fail("the scalar quantizer holds " + std::to_string(trained.size()) +
           " trained values, not " + std::to_string(want_trained));
  }
  index.codes = c.array<uint8_t>("the codes");
  index.vectors_offset = c.pos() - index.codes.n;
  if (index.codes.n != static_cast<uint64_t>(h.ntotal) * code_size) {
    c.fail("the header says ntotal = " + std::to_string(h.ntotal) + " codes of " +
           std::to_string(code_size) + " bytes but the data holds " +
           std::to_string(index.codes.n) + " bytes");
  }
  index.sq = std::move(sq);
  index.d = h.d;
  index.ntotal = h.ntotal;
  index.metric = h.metric;
}

// IHNf / IHNs after its fourcc: header, graph, then the storage (an IxFI / IxF2 block, or
// for IHNs an IxSQ one).
void read_hnsw(Cursor& c, FaissIndex& index) {
  const Header h = read_header(c, "the index header's");
  index.hnsw = read_hnsw_graph(c);
  index.has_hnsw = true;
  const std::string storage = c.fourcc("the HNSW storage's fourcc");
  if (storage == "null") {
    c.fail("the HNSW index was written without its vectors (IO_FLAG_SKIP_STORAGE)");
  }
  if (index.fourcc == "IHNs") {
    if (storage != "IxSQ") {
      c.fail("the IndexHNSWSQ storage is '" + storage + "', not a scalar quantizer (IxSQ)");
    }
    read_sq(c, index);
  } else {
    if (storage != "IxFI" && storage != "IxF2") {
      c.fail("the HNSW storage is '" + storage + "', not a flat index (IxFI or IxF2)");
    }
    read_flat(c, storage, index);
  }
  if (index.d != h.d || index.ntotal != h.ntotal || index.metric != h.metric) {
    c.fail("the HNSW storage (d = " + std::to_string(index.d) + ", ntotal = " +
           std::to_string(index.ntotal) + ", " + metric_name(index.metric) +
           ") disagrees with the index header (d = " + std::to_string(h.d) + ", ntotal = " +
           std::to_string(h.ntotal) + ", " + metric_name(h.metric) + ")");
  }
  validate_hnsw(c, index.hnsw, index.ntotal);
}

// IwPQ after its fourcc (faiss's read_ivfpq): write_ivf_header (the index header, nlist,
// nprobe, the coarse quantizer as an index of its own, the direct map), by_residual,
// code_size, the ProductQuantizer (d, M, nbits, centroids), then the inverted lists.
void read_ivfpq(Cursor& c, FaissIndex& index) {
  const Header h = read_header(c, "the index header's");
  auto ivf = std::make_shared<IvfPq>();
  const uint64_t nlist = c.read<uint64_t>("the IVF nlist");
  const uint64_t nprobe = c.read<uint64_t>("the IVF nprobe");
  if (nlist < 1 || nlist > (uint64_t{1} << 31)) {
    c.fail("IVF nlist = " + std::to_string(nlist) + " is out of range (1 to 2^31)");
  }
  if (nprobe < 1) c.fail("IVF nprobe = 0 (faiss's search refuses it too)");
  ivf->nlist = static_cast<int64_t>(nlist);
  ivf->nprobe = static_cast<int64_t>(std::min<uint64_t>(nprobe, INT32_MAX));
  FaissIndex& q = ivf->quantizer;
  q.path = index.path;
  q.file = index.file;
  q.fourcc = c.fourcc("the IVF quantizer's fourcc");
  if (q.fourcc != "IxFI" && q.fourcc != "IxF2") {
    c.fail("the IVF coarse quantizer is '" + q.fourcc + "', not a flat index (IxFI or IxF2, "
           "the quantizer index_factory's IVF{nlist} makes)");
  }
  read_flat(c, q.fourcc, q);
  if (q.ntotal != ivf->nlist || q.d != h.d) {
    c.fail("the IVF quantizer holds " + std::to_string(q.ntotal) + " centroids of d = " +
           std::to_string(q.d) + ", not nlist = " + std::to_string(nlist) + " of d = " +
           std::to_string(h.d));
  }
  // read_direct_map: its type (0 none, 1 array, 2 hash table), an array, and for a hash
  // table its (id, offset) pairs; searches do not use it.
  const uint8_t direct_map = c.read<uint8_t>("the IVF direct map's type");
  if (direct_map > 2) c.fail("IVF direct map type " + std::to_string(direct_map) + " is unknown");
  c.array<int64_t>("the IVF direct map");
  if (direct_map == 2) {
    const uint64_t pairs = c.read<uint64_t>("the IVF direct map's hash table length");
    if (pairs > index.file->size()) c.fail("truncated: the IVF direct map's hash table");
    c.raw<int64_t>(2 * pairs, "the IVF direct map's hash table");
  }
  ivf->by_residual = c.read<uint8_t>("by_residual") != 0;
  const uint64_t code_size = c.read<uint64_t>("the IVFPQ code_size");
  ProductQuantizer& pq = ivf->pq;
  const uint64_t pq_d = c.read<uint64_t>("the PQ's d");
  const uint64_t pq_m = c.read<uint64_t>("the PQ's M");
  const uint64_t nbits = c.read<uint64_t>("the PQ's nbits");
  if (pq_d != static_cast<uint64_t>(h.d)) {
    c.fail("the PQ's d = " + std::to_string(pq_d) + " is not the index's " + std::to_string(h.d));
  }
  if (pq_m < 1 || h.d % pq_m != 0) {
    c.fail("the PQ's M = " + std::to_string(pq_m) + " does not divide d = " + std::to_string(h.d));
  }
  if (nbits < 1 || nbits > 8) {
    c.fail("the PQ's nbits = " + std::to_string(nbits) +
           " is not supported (1 to 8, what faiss 1.7.3's IndexIVFPQ builds)");
  }
  pq.d = h.d;
  pq.M = static_cast<int>(pq_m);
  pq.nbits = static_cast<int>(nbits);
  pq.centroids = c.vector<float>("the PQ centroids");
  if (pq.centroids.size() != size_t(pq.d) * pq.ksub()) {
    c.fail("the PQ holds " + std::to_string(pq.centroids.size()) +
           " centroid floats, not d x 2^nbits = " + std::to_string(size_t(pq.d) * pq.ksub()));
  }
  if (code_size != pq.code_size()) {
    c.fail("the IVFPQ code_size = " + std::to_string(code_size) + ", not " +
           std::to_string(pq.code_size()) + " for M = " + std::to_string(pq.M) + " and nbits = " +
           std::to_string(pq.nbits));
  }
  pq.prepare();
  // read_InvertedLists: "ilar", nlist, code_size, the sizes ("full": one per list; "sprs":
  // (list, size) pairs of the non-empty ones), then each non-empty list's codes and ids.
  const std::string lists = c.fourcc("the inverted lists' fourcc");
  if (lists == "il00") c.fail("the IVF index was written without its inverted lists (il00)");
  if (lists != "ilar") {
    c.fail("inverted lists of type '" + lists + "' are not supported (searchr1 reads faiss's "
           "array lists, 'ilar', as write_index writes them)");
  }
  if (c.read<uint64_t>("the inverted lists' nlist") != nlist ||
      c.read<uint64_t>("the inverted lists' code_size") != code_size) {
    c.fail("the inverted lists' nlist or code_size is not the index's");
  }
  const std::string list_type = c.fourcc("the inverted lists' size layout");
  const std::vector<uint64_t> sizes = c.vector<uint64_t>("the inverted lists' sizes");
  ivf->sizes.assign(nlist, 0);
  if (list_type == "full") {
    if (sizes.size() != nlist) {
      c.fail("the inverted lists hold " + std::to_string(sizes.size()) + " sizes for nlist = " +
             std::to_string(nlist));
    }
    for (uint64_t i = 0; i < nlist; i++) ivf->sizes[i] = static_cast<int64_t>(sizes[i]);
  } else if (list_type == "sprs") {
    if (sizes.size() % 2 != 0) {
      c.fail("the inverted lists' sparse sizes are not (list, size) pairs");
    }
    for (size_t i = 0; i < sizes.size(); i += 2) {
      if (sizes[i] >= nlist) {
        c.fail("the inverted lists' sparse sizes name list " + std::to_string(sizes[i]));
      }
      ivf->sizes[sizes[i]] = static_cast<int64_t>(sizes[i + 1]);
    }
  } else {
    c.fail("the inverted lists' size layout '" + list_type + "' is neither 'full' nor 'sprs'");
  }
  ivf->codes.assign(nlist, nullptr);
  ivf->ids.assign(nlist, nullptr);
  ivf->lists_offset = c.pos();
  uint64_t total = 0;
  for (uint64_t i = 0; i < nlist; i++) {
    const uint64_t n = static_cast<uint64_t>(ivf->sizes[i]);
    if (n == 0) continue;
    const std::string what = "inverted list " + std::to_string(i);
    if (n > index.file->size()) c.fail(what + ": size " + std::to_string(n) + " exceeds the file");
    ivf->codes[i] = c.raw<uint8_t>(n * code_size, what + "'s codes").bytes;
    ivf->ids[i] = c.raw<int64_t>(n, what + "'s ids").bytes;
    total += n;
  }
  ivf->lists_bytes = c.pos() - ivf->lists_offset;
  if (total != static_cast<uint64_t>(h.ntotal)) {
    c.fail("the inverted lists hold " + std::to_string(total) +
           " entries but the header says ntotal = " + std::to_string(h.ntotal));
  }
  // Ids are the rows a search returns (corpus rows): each must be one of 0..ntotal-1.
  for (uint64_t i = 0; i < nlist; i++) {
    for (int64_t j = 0; j < ivf->sizes[i]; j++) {
      const int64_t id = ivf->id_at(static_cast<int64_t>(i), j);
      if (id < 0 || id >= h.ntotal) {
        c.fail("inverted list " + std::to_string(i) + " entry " + std::to_string(j) + ": id " +
               std::to_string(id) + " is not a row number (0.." + std::to_string(h.ntotal - 1) +
               "): searchr1 serves the ids add() gives, not add_with_ids()'s");
      }
    }
  }
  index.d = h.d;
  index.ntotal = h.ntotal;
  index.metric = h.metric;
  index.vectors_offset = ivf->lists_offset;
  index.ivf = std::move(ivf);
}

}  // namespace

FaissIndex open_faiss_index(const std::string& path) {
  FaissIndex index;
  index.path = path;
  index.file = MappedFile::open(path);
  Cursor c(*index.file);
  if (index.file->size() < 4) {
    c.fail("not a faiss index (" + std::to_string(index.file->size()) + " bytes)");
  }
  index.fourcc = c.fourcc("the fourcc");
  if (index.fourcc == "IxFI" || index.fourcc == "IxF2") {
    read_flat(c, index.fourcc, index);
  } else if (index.fourcc == "IxSQ") {
    read_sq(c, index);
  } else if (index.fourcc == "IHNf" || index.fourcc == "IHNs") {
    read_hnsw(c, index);
  } else if (index.fourcc == "IwPQ") {
    read_ivfpq(c, index);
  } else {
    c.fail("unsupported faiss index type '" + index.fourcc +
           "' (searchr1 reads IndexFlatIP 'IxFI', IndexFlatL2 'IxF2', IndexScalarQuantizer "
           "'IxSQ', IndexHNSWFlat 'IHNf', IndexHNSWSQ 'IHNs' and IndexIVFPQ 'IwPQ')");
  }
  if (c.pos() != index.file->size()) {
    c.fail(std::to_string(index.file->size() - c.pos()) + " unexpected bytes after the index (it "
           "ends at byte " + std::to_string(c.pos()) + ")");
  }
  if (index.has_hnsw) {
    index.file->advise_random(0, index.file->size());
  } else if (!index.ivf) {
    index.file->advise_sequential(index.vectors_offset,
                                  index.sq ? index.codes.n : index.vectors.n * sizeof(float));
  }
  return index;
}

const char* index_type_name(const FaissIndex& index) {
  if (index.ivf) return "IndexIVFPQ";
  if (index.has_hnsw) return index.sq ? "IndexHNSWSQ" : "IndexHNSWFlat";
  if (index.sq) return "IndexScalarQuantizer";
  return index.metric == Metric::L2 ? "IndexFlatL2" : "IndexFlatIP";
}

json::Value index_info_json(const FaissIndex& index) {
  json::Value::Object o = {{"path", index.path},
                           {"type", index_type_name(index)},
                           {"fourcc", index.fourcc},
                           {"metric", metric_name(index.metric)},
                           {"d", index.d},
                           {"ntotal", index.ntotal},
                           {"bytes", static_cast<int64_t>(index.file->size())},
                           {"vectors_offset", static_cast<int64_t>(index.vectors_offset)}};
  if (index.sq) {
    o.push_back({"scalar_quantizer", json::Value::object({{"type", index.sq->factory_name()},
                                                          {"code_size", static_cast<int64_t>(
                                                                            index.sq->code_size())}})});
  }
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
  if (index.ivf) {
    const IvfPq& ivf = *index.ivf;
    o.push_back({"ivf", json::Value::object({{"nlist", ivf.nlist},
                                             {"nprobe", ivf.nprobe},
                                             {"quantizer", index_type_name(ivf.quantizer)},
                                             {"by_residual", ivf.by_residual}})});
    const int64_t code_size = static_cast<int64_t>(ivf.pq.code_size());
    o.push_back({"pq", json::Value::object(
                           {{"M", ivf.pq.M}, {"nbits", ivf.pq.nbits}, {"code_size", code_size}})});
  }
  return json::Value::object(o);
}

// ---------------------------------------------------------------------------------------
// fp16 copy

void f16_to_f32_array(const uint16_t* src, uint64_t n, float* dst) {
  uint64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; i++) dst[i] = f16_to_f32(src[i]);
}

namespace {

// n floats at an arbitrary (unaligned) address to fp16, rounding to nearest even.
void f32_to_f16_array(const unsigned char* src, uint64_t n, uint16_t* dst) {
  uint64_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(reinterpret_cast<const float*>(src + i * sizeof(float)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; i++) {
    float v;
    std::memcpy(&v, src + i * sizeof(float), sizeof v);
    dst[i] = f32_to_f16(v);
  }
}

}  // namespace

void keep_fp16(FaissIndex& index) {
  if (index.ivf) {
    throw UsageError("--fp16 applies to float vectors; " + index.path +
                     " is IndexIVFPQ (PQ codes)");
  }
  if (index.sq) {
    throw UsageError("--fp16 applies to float vectors; " + index.path + " is " +
                     index_type_name(index) + " (" + index.sq->factory_name() + " codes)");
  }
  const uint64_t n = index.vectors.n;
  std::shared_ptr<uint16_t[]> half(new uint16_t[n]);  // uninitialised: first touched in parallel
  // Converted a chunk at a time, each chunk's fp32 pages released before the next, so the
  // process never holds the file and its copy at once.
  constexpr uint64_t kChunk = uint64_t{1} << 26, kBlock = uint64_t{1} << 16;  // floats
  const bool report = n * sizeof(float) >= (uint64_t{1} << 30);
  uint64_t reported = 0;
  for (uint64_t first = 0; first < n; first += kChunk) {
    const uint64_t count = std::min(kChunk, n - first);
    const int64_t blocks = static_cast<int64_t>((count + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
      const uint64_t at = first + static_cast<uint64_t>(b) * kBlock;
      f32_to_f16_array(index.vectors.bytes + at * sizeof(float),
                       std::min(kBlock, first + count - at), half.get() + at);
    }
    index.file->release(index.vectors_offset + first * sizeof(float), count * sizeof(float));
    const uint64_t tenths = 10 * (first + count) / n;
    if (report && tenths > reported) {
      reported = tenths;
      std::fprintf(stderr, "searchr1-index: fp16 copy of %s: %d%%\n", index.path.c_str(),
                   static_cast<int>(10 * tenths));
    }
  }
  index.vectors_f16 = std::move(half);
}

namespace {

// /proc/meminfo's MemAvailable in bytes (0 where unknown).
uint64_t memory_available() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return static_cast<uint64_t>(kib) * 1024;
}

}  // namespace

bool page_in(const FaissIndex& index) {
  if (!index.has_hnsw && !index.ivf) return false;
  // The vectors come last in an IHNf file; an fp16 copy replaces them.
  const uint64_t bytes = index.vectors_f16 ? index.vectors_offset : index.file->size();
  const uint64_t available = memory_available();
  constexpr double kGiB = 1 << 30;
  if (available > 0 && bytes > available) {
    std::fprintf(stderr,
                 "searchr1-index: note: %s: %.1f GiB to page in but %.1f GiB of memory "
                 "available; searches will read pages from the disk as they need them\n",
                 index.path.c_str(), bytes / kGiB, available / kGiB);
    return false;
  }
  const bool report = bytes >= (uint64_t{1} << 30);
  // Read in order with the kernel's readahead (from the disk 13x faster than MADV_WILLNEED
  // under the random advice searches want), then advised random again.
  index.file->advise_sequential(0, bytes);
  index.file->populate(0, bytes, [&](uint64_t done) {
    if (report) {
      std::fprintf(stderr, "searchr1-index: paging in %s: %d%%\n", index.path.c_str(),
                   static_cast<int>(100 * done / bytes));
    }
  });
  index.file->advise_random(0, index.file->size());
  return true;
}

// ---------------------------------------------------------------------------------------
// Writing

namespace {

constexpr long kNtotalOffset = 8;   // int64 ntotal after fourcc and d
constexpr long kCountOffset = 37;   // u64 float count after the header
constexpr long kHeaderBytes = 45;   // where the vectors start

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// fourcc, write_index_header (ntotal filled in at commit), the float count.
std::string flat_header(int d, Metric metric, int64_t ntotal) {
  std::string h = metric == Metric::L2 ? "IxF2" : "IxFI";
  put<int32_t>(h, d);
  put<int64_t>(h, ntotal);
  put<int64_t>(h, int64_t{1} << 20);  // two dummies faiss writes and ignores
  put<int64_t>(h, int64_t{1} << 20);
  put<uint8_t>(h, 1);  // is_trained: a flat index always is
  put<int32_t>(h, static_cast<int32_t>(metric));
  put<uint64_t>(h, static_cast<uint64_t>(ntotal) * static_cast<uint64_t>(d));
  return h;
}

}  // namespace

FlatIndexWriter::FlatIndexWriter(std::string path, int d, Metric metric)
    : FlatIndexWriter(path + ".partial-" + std::to_string(getpid()), d, metric, false) {
  path_ = std::move(path);
}

std::unique_ptr<FlatIndexWriter> FlatIndexWriter::resume(const std::string& partial, int d,
                                                         Metric metric) {
  return std::unique_ptr<FlatIndexWriter>(new FlatIndexWriter(partial, d, metric, true));
}

FlatIndexWriter::FlatIndexWriter(std::string partial, int d, Metric metric, bool resumable)
    : partial_(std::move(partial)), d_(d), metric_(metric), resumable_(resumable) {
  if (d <= 0 || d > (1 << 20)) {
    throw Error(partial_ + ": dimension " + std::to_string(d) + " is out of range");
  }
  if (resumable_) {
    f_ = std::fopen(partial_.c_str(), "r+b");
    if (f_ == nullptr && errno != ENOENT) {
      throw Error(partial_ + ": cannot open (" + std::strerror(errno) + ")");
    }
    if (f_ != nullptr) {
      reopen();
      return;
    }
  }
  f_ = std::fopen(partial_.c_str(), "wb");
  if (f_ == nullptr) throw Error(partial_ + ": cannot create (" + std::strerror(errno) + ")");
  const std::string h = flat_header(d_, metric_, 0);
  if (std::fwrite(h.data(), 1, h.size(), f_) != h.size()) {
    throw Error(partial_ + ": cannot write (" + std::strerror(errno) + ")");
  }
}

// An existing partial file: its header must be ours; the rows after it are counted, a torn
// last row (a kill in the middle of a write) is cut away, and a header a cut-short commit
// patched is set back to ntotal 0. A file shorter than the header that starts as ours (a
// kill before the header reached the disk) starts again.
void FlatIndexWriter::reopen() {
  const auto fail = [&](const std::string& what) {
    std::fclose(f_);
    f_ = nullptr;
    throw Error(partial_ + ": " + what);
  };
  struct stat st;
  if (fstat(fileno(f_), &st) != 0) {
    fail(std::string("cannot stat (") + std::strerror(errno) + ")");
  }
  const std::string want = flat_header(d_, metric_, 0);
  std::string got(want.size(), '\0');
  const size_t have = std::fread(got.data(), 1, got.size(), f_);
  const auto same = [&](size_t at, size_t n) { return got.compare(at, n, want, at, n) == 0; };
  if (have < want.size()) {
    if (!same(0, have)) {
      fail(std::to_string(have) + " bytes that do not start a partial flat index of d = " +
           std::to_string(d_));
    }
    got = want;
  }
  const std::string fourcc = got.substr(0, 4);
  if (fourcc != "IxFI" && fourcc != "IxF2") {
    fail("not a flat faiss index (fourcc '" +
         fourcc_text(reinterpret_cast<const unsigned char*>(got.data())) + "')");
  }
  if (!same(0, 4)) {
    fail("holds " + std::string(fourcc == "IxF2" ? "l2" : "inner_product") + " vectors, not " +
         metric_name(metric_));
  }
  int32_t d;
  int64_t ntotal;
  uint64_t count;
  std::memcpy(&d, got.data() + 4, sizeof d);
  std::memcpy(&ntotal, got.data() + kNtotalOffset, sizeof ntotal);
  std::memcpy(&count, got.data() + kCountOffset, sizeof count);
  if (d != d_) fail("holds vectors of d = " + std::to_string(d) + ", not " + std::to_string(d_));
  if (!same(16, 21)) fail("its header (bytes 16 to 36) is not the one searchr1-index writes");
  const uint64_t row_bytes = static_cast<uint64_t>(d_) * sizeof(float);
  const uint64_t size = have < want.size() ? want.size() : static_cast<uint64_t>(st.st_size);
  const int64_t rows = static_cast<int64_t>((size - want.size()) / row_bytes);
  const uint64_t whole = want.size() + static_cast<uint64_t>(rows) * row_bytes;
  const bool committed = ntotal == rows && count == static_cast<uint64_t>(rows) * d_ &&
                         whole == size;
  if ((ntotal != 0 || count != 0) && !committed) {
    fail("its header says ntotal = " + std::to_string(ntotal) + " but it holds " +
         std::to_string(rows) + " rows: not a partial index");
  }
  if (ftruncate(fileno(f_), static_cast<off_t>(whole)) != 0 ||
      std::fseek(f_, 0, SEEK_SET) != 0 ||
      std::fwrite(want.data(), 1, want.size(), f_) != want.size() ||
      std::fseek(f_, 0, SEEK_END) != 0) {
    fail(std::string("cannot write (") + std::strerror(errno) + ")");
  }
  ntotal_ = rows;
}

FlatIndexWriter::~FlatIndexWriter() {
  if (f_ == nullptr) return;
  std::fclose(f_);
  if (!resumable_) std::remove(partial_.c_str());
}

void FlatIndexWriter::append(const float* rows, int64_t n) {
  const size_t count = static_cast<size_t>(n) * static_cast<size_t>(d_);
  if (std::fwrite(rows, sizeof(float), count, f_) != count) {
    throw Error(partial_ + ": cannot write (" + std::strerror(errno) + ")");
  }
  ntotal_ += n;
}

void FlatIndexWriter::sync() {
  if (std::fflush(f_) != 0 || fdatasync(fileno(f_)) != 0) {
    throw Error(partial_ + ": cannot write (" + std::strerror(errno) + ")");
  }
}

uint64_t FlatIndexWriter::bytes() const {
  return static_cast<uint64_t>(kHeaderBytes) +
         static_cast<uint64_t>(ntotal_) * static_cast<uint64_t>(d_) * sizeof(float);
}

void FlatIndexWriter::commit(const std::string& out) {
  const std::string h = flat_header(d_, metric_, ntotal_);
  bool ok = std::fseek(f_, kNtotalOffset, SEEK_SET) == 0 &&
            std::fwrite(h.data() + kNtotalOffset, 8, 1, f_) == 1 &&
            std::fseek(f_, kCountOffset, SEEK_SET) == 0 &&
            std::fwrite(h.data() + kCountOffset, 8, 1, f_) == 1 && std::fflush(f_) == 0 &&
            fsync(fileno(f_)) == 0;
  const int err = errno;
  ok = std::fclose(f_) == 0 && ok;
  f_ = nullptr;
  if (!ok || std::rename(partial_.c_str(), out.c_str()) != 0) {
    const int why = ok ? errno : err;
    if (!resumable_) std::remove(partial_.c_str());
    throw Error(out + ": cannot write (" + std::strerror(why) + ")");
  }
}

}  // namespace sr1
