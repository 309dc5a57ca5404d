// faiss index files, read as they are and written as faiss writes them
// (faiss faiss/impl/index_read.cpp, read_index and read_index_header; index_write.cpp,
// write_index and write_index_header; io_macros.h, READVECTOR, WRITEVECTOR, WRITEXBVECTOR).
//
// Read: IndexFlatIP (`IxFI`), IndexFlatL2 (`IxF2`), IndexScalarQuantizer (`IxSQ`, QT_8bit
// and QT_fp16: scalar_quantizer.h), IndexHNSWFlat (`IHNf`) / IndexHNSWSQ (`IHNs`) over
// one of those, and IndexIVFPQ (`IwPQ` over an IndexFlat quantizer with "ilar" array lists:
// read_ivfpq, read_ivf_header, read_direct_map, read_ProductQuantizer, read_InvertedLists;
// ivf_pq.h). The file is memory-mapped and never copied: Search-R1's e5_Flat.index is 64.6 GB.
// Nothing in a faiss file is aligned (a flat index's floats start at byte 45), so every
// value is read through memcpy (UnalignedArray), which compilers turn into plain unaligned
// loads on x86 and ARM while staying correct C++. Everything is little-endian, as faiss
// writes it on every machine it runs on.
//
// Write: IndexFlatIP / IndexFlatL2 files from a stream of vectors (FlatIndexWriter), at a
// temporary name renamed into place when complete, byte-identical to faiss.write_index.
//
// fp16: keep_fp16 replaces the mapped vectors by a half-size copy in memory for search.
//
// Errors are sr1::Error with one line naming the file and what is wrong with it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "index/scalar_quantizer.h"
#include "util/json.h"

namespace sr1 {

enum class Metric { InnerProduct = 0, L2 = 1 };  // faiss's METRIC_INNER_PRODUCT, METRIC_L2
const char* metric_name(Metric m);  // "inner_product", "l2"

// A read-only memory map of a whole file.
class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::string& path() const { return path_; }
  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Hints the kernel about the access pattern of [offset, offset+len) (madvise).
  void advise_sequential(uint64_t offset, uint64_t len) const;
  void advise_random(uint64_t offset, uint64_t len) const;
  // Drops the pages of [offset, offset+len) from this process (MADV_DONTNEED); reading
  // them again faults them back in from the file.
  void release(uint64_t offset, uint64_t len) const;
  // Maps every page of [offset, offset+len) into this process now, reading from the disk
  // what the page cache lacks (MADV_POPULATE_READ, or a read of each page on kernels before
  // 5.14; advise_sequential first for readahead); `progress` gets the bytes done after each
  // 256 MiB.
  void populate(uint64_t offset, uint64_t len,
                const std::function<void(uint64_t done)>& progress) const;

 private:
  MappedFile() = default;
  std::string path_;
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

// n values of type T stored at an arbitrary byte address.
template <class T>
struct UnalignedArray {
  const unsigned char* bytes = nullptr;
  uint64_t n = 0;
  T operator[](uint64_t i) const {
    T v;
    std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
    return v;
  }
  void copy(uint64_t first, uint64_t count, T* dst) const {
    std::memcpy(dst, bytes + first * sizeof(T), count * sizeof(T));
  }
};

// The graph of an IndexHNSW (faiss/impl/HNSW.h), pointing into the mapped file. Node i's
// neighbours at level l are neighbors[offsets[i] + cum_nneighbor_per_level[l] ..
// offsets[i] + cum_nneighbor_per_level[l+1]), -1 marking an empty slot; levels[i] is the
// node's top level + 1.
struct HnswGraph {
  std::vector<double> assign_probas;
  std::vector<int32_t> cum_nneighbor_per_level;
  UnalignedArray<int32_t> levels;
  UnalignedArray<uint64_t> offsets;
  UnalignedArray<int32_t> neighbors;
  int32_t entry_point = -1, max_level = -1, ef_construction = 0, ef_search = 0;
  int neighbor_slots(int level) const {
    return cum_nneighbor_per_level[level + 1] - cum_nneighbor_per_level[level];
  }
};

// n fp16 values to fp32 (F16C instructions where the build targets them).
void f16_to_f32_array(const uint16_t* src, uint64_t n, float* dst);

// Element i of a row that may be unaligned (FaissIndex::mapped_rows): a memcpy load.
inline float row_element(const float* row, int64_t i) {
  float v;
  std::memcpy(&v, row + i, sizeof v);
  return v;
}

struct IvfPq;  // ivf_pq.h

// An opened index: the flat vectors or codes (row i has id i) and, for IHNf / IHNs, the
// graph over them; or, for IwPQ, the inverted lists of PQ codes (`ivf`: no rows by id).
struct FaissIndex {
  std::string path;
  std::string fourcc;  // "IxFI", "IxF2", "IxSQ", "IHNf", "IHNs" or "IwPQ"
  Metric metric = Metric::InnerProduct;
  int d = 0;
  int64_t ntotal = 0;
  UnalignedArray<float> vectors;  // ntotal * d floats, row-major (empty for IxSQ storage)
  uint64_t vectors_offset = 0;    // byte offset of the vectors (or codes) in the file
  std::shared_ptr<ScalarQuantizer> sq;  // IxSQ storage: its quantizer, and the codes
  UnalignedArray<uint8_t> codes;        // ntotal * code_size bytes
  bool has_hnsw = false;
  HnswGraph hnsw;
  std::shared_ptr<MappedFile> file;  // keeps the mapping alive
  std::shared_ptr<uint16_t[]> vectors_f16;  // keep_fp16's copy, read instead of `vectors`
  std::shared_ptr<const IvfPq> ivf;  // IwPQ: searched by ivfpq_search, never by rows

  // Row `first` and those after it where they lie in the mapped file (unaligned: read them
  // with memcpy loads, as dots.h does), or nullptr where searches read the fp16 copy.
  const float* mapped_rows(int64_t first) const {
    if (converted()) return nullptr;
    return reinterpret_cast<const float*>(vectors.bytes +
                                          static_cast<uint64_t>(first) * d * sizeof(float));
  }
  // True where rows are decoded (scalar-quantizer codes, or keep_fp16's copy), not read
  // where they are mapped.
  bool converted() const { return sq != nullptr || vectors_f16 != nullptr; }
  // Copies rows [first, first+count) into dst (aligned, count*d floats), decoded from the
  // codes or converted from the fp16 copy where there is one.
  void copy_rows(int64_t first, int64_t count, float* dst) const {
    const uint64_t at = static_cast<uint64_t>(first) * d, n = static_cast<uint64_t>(count) * d;
    if (sq) {
      const uint64_t size = sq->code_size();
      for (int64_t i = 0; i < count; i++) {
        sq->decode(codes.bytes + static_cast<uint64_t>(first + i) * size, dst + i * d);
      }
    } else if (vectors_f16) {
      f16_to_f32_array(vectors_f16.get() + at, n, dst);
    } else {
      vectors.copy(at, n, dst);
    }
  }
};

// Maps `path` and validates it: fourcc, header (d, ntotal, metric), every vector's
// length and, for HNSW, the graph's sizes and offsets (neighbour ids are checked when
// search reads them, so that opening a 20M-node graph does not read all of it).
FaissIndex open_faiss_index(const std::string& path);

// "IndexFlatIP", "IndexFlatL2", "IndexScalarQuantizer", "IndexHNSWFlat", "IndexHNSWSQ" or
// "IndexIVFPQ".
const char* index_type_name(const FaissIndex& index);
// What `searchr1-index info` prints: path, type, fourcc, metric, d, ntotal, bytes,
// vectors_offset and, for HNSW, IVF and PQ, their parameters.
json::Value index_info_json(const FaissIndex& index);

// Replaces the vectors read by search with an fp16 copy in memory, converted in parallel
// (progress lines on stderr for a file over 1 GiB), and drops the mapping's pages of the
// fp32 vectors as it goes: the process then holds about half the vectors' bytes. Scores
// differ from faiss's fp32 ones by fp16 rounding (each component keeps 11 significant
// bits), as with faiss's GPU index with useFloat16 (Search-R1's --faiss_gpu); neighbours
// whose scores are that close may swap, and an HNSW walk may take another turn.
void keep_fp16(FaissIndex& index);

// Maps the pages an HNSW or IVF search reads (the graph, and the vectors unless keep_fp16
// replaced them; an IVF file's lists) before the first search, as faiss's read_index reads
// the file whole: a walk reads rows at random, a probe any list, and each first touch of a
// page would otherwise be a fault (a 4 KiB disk read when the file is not cached, readahead
// being off for a graph's file). Progress lines on stderr
// for more than 1 GiB. Skipped, with a note, when the bytes exceed the memory available
// (MemAvailable): the searches then fault pages in as they go. Returns true when paged in;
// a flat or SQ index (scanned in order, read ahead by the kernel) is left as it is (false).
bool page_in(const FaissIndex& index);

// Writes an IndexFlatIP / IndexFlatL2 file: header with ntotal = 0, then the vectors as
// they come, then ntotal and the float count patched in and the file renamed into place.
//  - FlatIndexWriter(path, d, metric) writes `<path>.partial-<pid>`, renamed to `path` by
//    commit() and removed if the writer is destroyed before.
//  - resume(partial, d, metric) writes a file of the caller's naming that outlives the
//    writer, so that a build killed half-way goes on where it stopped. An existing file
//    must have our header for this d and metric with ntotal 0 (or ntotal equal to its
//    rows: a commit cut short before its rename); its whole rows are kept and a torn last
//    row cut away. commit(out) renames it to `out`; if that fails the file stays.
// One writer per file: nothing locks it against a second process.
class FlatIndexWriter {
 public:
  FlatIndexWriter(std::string path, int d, Metric metric);
  static std::unique_ptr<FlatIndexWriter> resume(const std::string& partial, int d,
                                                 Metric metric);
  ~FlatIndexWriter();
  FlatIndexWriter(const FlatIndexWriter&) = delete;
  FlatIndexWriter& operator=(const FlatIndexWriter&) = delete;
  // Appends n rows of d floats.
  void append(const float* rows, int64_t n);
  // Flushes and fdatasyncs: the rows appended so far survive a crash.
  void sync();
  int64_t ntotal() const { return ntotal_; }
  uint64_t bytes() const;  // of the file: header and rows
  void commit() { commit(path_); }
  void commit(const std::string& out);

 private:
  FlatIndexWriter(std::string partial, int d, Metric metric, bool resumable);
  void reopen();
  std::string path_, partial_;
  int d_;
  Metric metric_;
  bool resumable_;
  int64_t ntotal_ = 0;
  FILE* f_ = nullptr;
};

}  // namespace sr1
