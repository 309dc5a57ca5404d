// Exact flat search on CUDA GPUs, as faiss's GPU index in Search-R1's --faiss_gpu mode
// (GpuMultipleClonerOptions useFloat16 = True, shard = True, index_cpu_to_all_gpus): the
// vectors are held on the GPU(s) in fp16, sharded by contiguous row ranges, and every
// query is scored against all of them with fp32 accumulation. The CPU reference is
// flat_search (flat_search.h), whose conventions this follows:
//   inner product: scores q·x, best first = descending;
//   L2: |q|² + |x|² - 2 q·x clamped at 0 (|x|² of the fp16 row, |q|² of the fp32 query),
//       best first = ascending;
//   ties (bitwise-equal scores): equal scores are listed higher id first for inner
//       product, lower id first for L2, as flat_search and faiss's CPU search list them;
//       of rows tied at the k-th place the lowest ids are kept (faiss's CPU heap keeps a
//       set that depends on the order the rows came in, not always the same one);
//   k > ntotal: id -1 and the worst score (-FLT_MAX, or FLT_MAX for L2) in the places left.
// Scores differ from flat_search's fp32 ones by fp16 rounding of the vectors and queries
// (each component keeps 11 significant bits) and by the matmul's summation order, so
// neighbours whose scores are that close may swap. An HNSW graph is always searched on
// the CPU; only exhaustive search (a flat index, or an HNSW file's vectors with --exact)
// runs here.
//
// Memory per GPU: 2·d bytes per row of its shard (+4 per row for L2's norms), cuBLASLt's
// 32 MiB workspace and, while searching, a [queries, block] fp32 score matrix of at most
// 256 MiB with the top-k lists of its tiles (flat_search_cuda.cu says how they are sized).
// The upload streams the rows from the memory-mapped file through 2 x 64 MiB of pinned host
// memory, dropping the file's pages as it goes, so the host never holds the whole file.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "index/faiss_io.h"
#include "index/flat_search.h"
#include "util/error.h"

namespace sr1 {

// Largest k a GPU search returns (its final sort keeps a query's k keys in shared memory).
constexpr int kCudaFlatMaxK = 2048;

struct CudaFlatOptions {
  // CUDA device ordinals, one shard each (rows split evenly, in order). A device named twice
  // holds two shards, which only serves to test the merge on a single GPU.
  std::vector<int> gpus = {0};
  int block_rows = 0;  // database rows per matmul (0: auto, see flat_search_cuda.cu)
  int tile_rows = 0;   // rows per top-k tile (0: auto)
};

// One shard as it was placed.
struct CudaShardInfo {
  int gpu = 0;
  std::string name;         // the device's name
  int64_t first = 0, rows = 0;  // rows [first, first + rows) of the index
  uint64_t bytes = 0;       // GPU memory its vectors (and norms) take
};

class CudaFlatIndex {
 public:
  virtual ~CudaFlatIndex() = default;
  // queries: nq rows of d floats; 1 <= k <= kCudaFlatMaxK. The result as flat_search's.
  virtual TopK search(const float* queries, int nq, int k) = 0;
  virtual const std::vector<CudaShardInfo>& shards() const = 0;
};

// --device for the index: "cuda" searches flat indexes on the GPU; "auto" and "cpu" keep the
// index on the CPU (auto moves only the encoder). UsageError for anything else.
inline bool index_on_cuda(const std::string& device) {
  if (device != "auto" && device != "cpu" && device != "cuda") {
    throw UsageError("--device: unknown device '" + device + "' (expected auto, cpu or cuda)");
  }
  return device == "cuda";
}

// UsageError "--device cuda: <why>" where the CUDA backend is unusable (cuda_status).
inline void require_cuda() {
  const CudaStatus s = cuda_status();
  if (!s.available) throw UsageError("--device cuda: " + s.reason);
}

// --gpus: a count N (the first N visible GPUs: 0 .. N-1) or a comma-separated list of device
// ordinals ("0,1"; "0,0" puts two shards on GPU 0). Whether they exist is checked on upload.
inline std::vector<int> parse_gpus(const std::string& text) {
  const auto bad = [&]() {
    return UsageError("--gpus: '" + text + "' is neither a count (2) nor a list of GPU ordinals (0,1)");
  };
  std::vector<int> numbers;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string part = text.substr(at, end - at);
    if (part.empty() || part.size() > 4 || part.find_first_not_of("0123456789") != std::string::npos) {
      throw bad();
    }
    numbers.push_back(std::stoi(part));
    at = end + 1;
  }
  if (numbers.size() > 1) return numbers;
  if (numbers[0] < 1) throw UsageError("--gpus must be >= 1");
  std::vector<int> first(numbers[0]);
  for (int i = 0; i < numbers[0]; i++) first[i] = i;
  return first;
}

// Copies the index's vectors to the GPU(s) as fp16 (progress lines on stderr for a file
// over 1 GiB). Reads them through index.copy_rows, so keep_fp16's copy serves as well as
// the mapping; the mapping's pages are released as they are uploaded. Throws UsageError
// where CUDA is unusable or a named GPU does not exist, Error where a GPU lacks the memory
// or a component is not finite in fp16 (|x| > 65504).
#ifdef SR1_HAVE_CUDA
std::unique_ptr<CudaFlatIndex> upload_flat_index(const FaissIndex& index,
                                                 const CudaFlatOptions& options);
#else
inline std::unique_ptr<CudaFlatIndex> upload_flat_index(const FaissIndex&, const CudaFlatOptions&) {
  require_cuda();  // always throws: this build has no CUDA backend
  return nullptr;
}
#endif

}  // namespace sr1
