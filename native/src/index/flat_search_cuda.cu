// Exact flat search on CUDA GPUs (flat_search_cuda.h), in the style of the backend's kernels
// (backend/cuda): one operation per kernel, each naming the CPU code it stands for.
//
// Per shard (one GPU's contiguous rows) and per batch of at most kQueryBatch queries:
//   1. the queries to fp16 (f32_to_f16_kernel) and, for L2, their squared norms
//      (row_norms_kernel, from the fp32 queries as flat_search takes them);
//   2. for each block of rows: scores[nq, rows] = q16 · x16ᵀ, fp32 accumulation and output
//      (cuBLASLt, opened at run time as the backend's matmuls are: cublaslt_api.h);
//   3. the top k of each tile of the block's score rows (tile_topk_kernel), then the top k
//      of the tiles' lists and the running list (merge_topk_kernel), which so holds the
//      top k of every row seen so far;
//   4. the running list sorted best first (sort_keys_kernel) and downloaded; the host
//      merges the shards' lists and decodes them (merge_shards).
//
// Keys. A (score, row) pair travels as one uint64 that orders as the result must
// (topk.cuh's id_key): the high 32 bits are the score's bits turned into an unsigned
// integer of the same order (for L2 the negated distance, so that larger is always
// better), the low 32 bits 0xFFFFFFFF - id,
// so that of two equal scores the lower id is the larger key. Ids are unique, so keys are;
// key 0 is "no row" (an empty place; no real row's key is 0). The k largest keys are the
// exact top k, the lowest ids kept of rows tied at the k-th place; and as the order is
// total, the top k of a union is the top k of its parts' top k: tiles, blocks and shards
// merge exactly.
//
// Selection (select_top): backend/cuda/topk.cuh's radix select over the 64-bit keys, which
// stops within the 4 score bytes unless scores tie (sooner for small k); a last pass writes
// the keys above the prefix and the needed number equal to it. Each pass reads the keys
// again (a tile of scores stays in cache): no memory per key, and correct for any k.
//
// Sizes. The score matrix of a block holds at most kScoreBytes (256 MiB): block rows =
// 256 MiB / (4 nq), between 256 and kMaxBlockRows (1M), so that one query still scans 1M
// rows per matmul and 1024 queries 64K. Tiles are max(4096, 4k) rows, so a tile's list is
// at most a quarter of it: the tiles' lists take at most half the score matrix's bytes.
#include "index/flat_search_cuda.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>

#include "backend/cuda/cublaslt_api.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/reduce.cuh"
#include "backend/cuda/topk.cuh"

namespace sr1 {
namespace {

using cuda::check;
using cuda::check_launch;

constexpr int kThreads = 256;                          // per block of the selection kernels
constexpr int kQueryBatch = 1024;                      // queries per pass over the rows
constexpr size_t kScoreBytes = size_t(256) << 20;      // a block's [nq, rows] fp32 scores
constexpr int kMaxBlockRows = 1 << 20;
constexpr int kMinBlockRows = 256;
constexpr int kMinTileRows = 4096;
constexpr size_t kChunkBytes = size_t(64) << 20;       // fp32 rows per upload step
constexpr size_t kWorkspaceBytes = size_t(32) << 20;   // cuBLASLt's (Hopper's kernels want 32 MiB)
constexpr size_t kSearchReserve = size_t(512) << 20;   // left free at upload for the search buffers

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// ---------------------------------------------------------------------------------------
// Kernels

// dst = src rounded to fp16, to nearest even (CPU: keep_fp16's f32_to_f16). A result that
// is not finite (|x| > 65504, or an inf or NaN given) sets *bad: its scores would be inf or
// NaN, which no ranking can use.
__global__ void f32_to_f16_kernel(__half* dst, const float* src, size_t n, int* bad) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const __half h = __float2half_rn(src[i]);
    if ((__half_as_ushort(h) & 0x7c00u) == 0x7c00u) *bad = 1;  // exponent all ones
    dst[i] = h;
  }
}

void f32_to_f16(__half* dst, const float* src, size_t n, int* bad, cudaStream_t stream) {
  const size_t blocks = std::min<size_t>((n + 255) / 256, 8192);
  if (blocks == 0) return;
  f32_to_f16_kernel<<<unsigned(blocks), 256, 0, stream>>>(dst, src, n, bad);
  check_launch("f32_to_f16_kernel");
}

__device__ __forceinline__ float as_float(float x) { return x; }
__device__ __forceinline__ float as_float(__half x) { return __half2float(x); }

// norms[r] = Σ x[r, i]² in fp32, a warp per row (CPU: flat_search.cpp's squared_norm).
template <typename T>
__global__ void row_norms_kernel(float* norms, const T* x, int64_t rows, int d) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp: it shares the row
  const T* v = x + row * d;
  float sum = 0.0f;
  for (int i = threadIdx.x % 32; i < d; i += 32) {
    const float f = as_float(v[i]);
    sum += f * f;
  }
  sum = cuda::warp_sum(sum);
  if (threadIdx.x % 32 == 0) norms[row] = sum;
}

template <typename T>
void row_norms(float* norms, const T* x, int64_t rows, int d, cudaStream_t stream) {
  constexpr int kWarps = 8;
  if (rows == 0) return;
  row_norms_kernel<T><<<unsigned((rows + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(
      norms, x, rows, d);
  check_launch("row_norms_kernel");
}

// The key of a row (see the top of the file). `better` is the inner product, or the
// negated L2 distance; -0 counts as +0 so that equal scores have equal keys.
__device__ __forceinline__ uint64_t make_key(float better, uint32_t id) {
  uint32_t u = __float_as_uint(better);
  if ((u << 1) == 0) u = 0;
  return cuda::id_key(cuda::ordered_bits(__uint_as_float(u)), id);
}

// State of one block's select_top, in shared memory.
struct Select {
  cuda::RadixSelect<uint64_t> radix;
  int above, equal;  // write cursors of the last pass
};

// Writes the k largest of the keys key(0 .. n-1) to out[0, k) in no particular order, and
// key 0 to the places beyond n. Called by every thread of a block of kThreads.
template <typename KeyFn>
__device__ void select_top(const KeyFn& key, int n, int k, uint64_t* out, Select& s) {
  const int want = min(n, k);
  if (threadIdx.x == 0) {
    s.above = 0;
    s.equal = 0;
  }
  cuda::radix_select(key, n, want, s.radix);
  // The keys above the prefix are want - need in number; of those equal to it (one key,
  // or copies of key 0) `need` are taken.
  const uint64_t prefix = s.radix.prefix, mask = s.radix.mask;
  const int need = s.radix.need, above = want - need;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t v = key(i), bits = v & mask;
    if (bits > prefix) {
      out[atomicAdd(&s.above, 1)] = v;
    } else if (bits == prefix) {
      const int e = atomicAdd(&s.equal, 1);
      if (e < need) out[above + e] = v;
    }
  }
  for (int i = want + threadIdx.x; i < k; i += blockDim.x) out[i] = 0;
}

// The top k of each tile of a block's score rows: block (t, q) selects from scores[q,
// t*tile ..) and writes cand[q, t, 0..k) (CPU: flat_search.cpp's score_block turning
// inner products into L2 distances, and add_block's heap, which keeps the same rows).
template <bool kL2>
__global__ void __launch_bounds__(kThreads)
    tile_topk_kernel(uint64_t* cand, const float* scores, int rows, int tile, int k,
                     uint32_t id0, const float* xnorms, const float* qnorms) {
  __shared__ Select s;
  const int t = blockIdx.x, q = blockIdx.y;
  const int first = t * tile, n = min(tile, rows - first);
  const float* sc = scores + size_t(q) * rows + first;
  const uint32_t id = id0 + static_cast<uint32_t>(first);
  float qn = 0.0f;
  const float* xn = nullptr;
  if constexpr (kL2) {
    qn = qnorms[q];
    xn = xnorms + first;
  }
  const auto key = [&](int i) {
    float better = sc[i];
    if constexpr (kL2) {
      const float dis = qn + xn[i] - 2.0f * better;
      better = -(dis < 0.0f ? 0.0f : dis);  // round-off can take a row's distance to itself below 0
    }
    return make_key(better, id + static_cast<uint32_t>(i));
  };
  select_top(key, n, k, cand + (size_t(q) * gridDim.x + t) * k, s);
}

// Each query's running list (prev: the top k of the blocks before) and this block's m
// tile keys, down to the top k in next (CPU: the heap fed one block after another).
__global__ void __launch_bounds__(kThreads)
    merge_topk_kernel(uint64_t* next, const uint64_t* cand, int m, const uint64_t* prev, int k) {
  __shared__ Select s;
  const int q = blockIdx.x;
  const uint64_t* c = cand + size_t(q) * m;
  const uint64_t* p = prev + size_t(q) * k;
  const auto key = [&](int i) { return i < m ? c[i] : p[i - m]; };
  select_top(key, m + k, k, next + size_t(q) * k, s);
}

// Each query's k keys in descending order: a bitonic sort in shared memory over p places
// (the power of two >= k; the extra ones key 0, which sort last) (CPU: topk::reorder).
__global__ void sort_keys_kernel(uint64_t* keys, int k, int p) {
  extern __shared__ uint64_t v[];
  uint64_t* row = keys + size_t(blockIdx.x) * k;
  for (int i = threadIdx.x; i < p; i += blockDim.x) v[i] = i < k ? row[i] : 0;
  __syncthreads();
  cuda::sort_descending(v, p);
  for (int i = threadIdx.x; i < k; i += blockDim.x) row[i] = v[i];
}

// The score of a key (make_key's inverse), and -0 never comes back as a distance.
float key_score(uint64_t key, Metric metric) {
  const uint32_t o = static_cast<uint32_t>(key >> 32);
  const uint32_t u = (o & 0x80000000u) ? (o & 0x7fffffffu) : ~o;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return metric == Metric::L2 ? 0.0f - f : f;
}

// ---------------------------------------------------------------------------------------
// Host side

// Makes `gpu` current and restores the caller's device on exit, so that the encoder's
// backend, on its own device, never finds another one current.
class DeviceScope {
 public:
  explicit DeviceScope(int gpu) {
    cudaGetDevice(&saved_);
    cudaSetDevice(gpu);
  }
  ~DeviceScope() { cudaSetDevice(saved_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int saved_ = 0;
};

// Device memory on one GPU, freed there.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  // At least `bytes` (contents not kept) on `gpu`, which must be current.
  void reserve(size_t bytes, int gpu, const char* what) {
    if (p_ != nullptr && bytes <= bytes_) return;
    reset();
    if (cudaMalloc(&p_, std::max<size_t>(bytes, 1)) != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it so that later calls are not blamed
      p_ = nullptr;
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw Error("CUDA: cannot allocate " + mib(bytes) + " for " + what + " on GPU " +
                  std::to_string(gpu) + " (" + mib(free) + " free of " + mib(total) + ")");
    }
    bytes_ = bytes;
    gpu_ = gpu;
  }
  void reset() {
    if (p_ == nullptr) return;
    DeviceScope scope(gpu_);
    cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  int gpu_ = 0;
};

// Largest power of two, up to cuBLASLt's default assumption of 256, dividing the address.
uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

// scores[nq, rows] = q[nq, d] · x[rows, d]ᵀ with fp16 operands and fp32 accumulation and
// output, on cuBLASLt. As in the backend's matmul forward (matmul.cu), a row-major R x K
// matrix is cuBLASLt's column-major K x R, so it computes scoresᵀ (rows x nq, ld rows) =
// op_T(A) · B with A = x (d x rows) and B = q (d x nq). One per shard: a handle and its
// plans belong to one GPU.
class ScoreGemm {
 public:
  ScoreGemm() : lib_(cuda::load_cublaslt()) {
    if (lib_.api == nullptr) throw Error("--device cuda: " + lib_.error);
    check_lt(lib_.api->cublasLtCreate(&handle_), "cublasLtCreate", {});
  }
  ~ScoreGemm() {
    plans_.clear();
    lib_.api->cublasLtDestroy(handle_);
  }
  ScoreGemm(const ScoreGemm&) = delete;
  ScoreGemm& operator=(const ScoreGemm&) = delete;

  void run(float* scores, const __half* q, const __half* x, int nq, int rows, int d,
           void* workspace, cudaStream_t stream) {
    const Key key{nq, rows, d, alignment(x), alignment(q), alignment(scores)};
    const Plan& p = plan(key);
    const float alpha = 1.0f, beta = 0.0f;
    check_lt(lib_.api->cublasLtMatmul(handle_, p.desc, &alpha, x, p.a, q, p.b, &beta, scores,
                                      p.d, scores, p.d, &p.algo, workspace, kWorkspaceBytes,
                                      stream),
             "cublasLtMatmul", key);
  }

 private:
  struct Key {
    int nq = 0, rows = 0, d = 0;
    uint32_t align_x = 0, align_q = 0, align_scores = 0;
    auto tie() const { return std::tie(nq, rows, d, align_x, align_q, align_scores); }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
  };
  // The descriptors and algorithm of one Key, destroyed with it.
  struct Plan {
    explicit Plan(const cuda::CublasLt& api) : api(api) {}
    ~Plan() {
      for (cuda::cublasLtMatrixLayout_t l : {a, b, d}) {
        if (l != nullptr) api.cublasLtMatrixLayoutDestroy(l);
      }
      if (desc != nullptr) api.cublasLtMatmulDescDestroy(desc);
    }
    const cuda::CublasLt& api;
    cuda::cublasLtMatmulDesc_t desc = nullptr;
    cuda::cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cuda::cublasLtMatmulAlgo_t algo{};
  };

  void check_lt(cuda::cublasStatus_t status, const char* call, const Key& key) const {
    if (status == cuda::CUBLAS_STATUS_SUCCESS) return;
    const char* name = lib_.api->cublasLtGetStatusName(status);
    throw Error(std::string("cuBLASLt ") + call + " failed (status " + std::to_string(status) +
                (name ? std::string(", ") + name : "") + ") for the search's scores [" +
                std::to_string(key.nq) + " queries x " + std::to_string(key.rows) +
                " rows], d = " + std::to_string(key.d));
  }

  const Plan& plan(const Key& key) {
    const auto found = plans_.find(key);
    if (found != plans_.end()) return *found->second;
    const cuda::CublasLt& api = *lib_.api;
    auto p = std::make_unique<Plan>(api);
    check_lt(api.cublasLtMatmulDescCreate(&p->desc, cuda::CUBLAS_COMPUTE_32F, CUDA_R_32F),
             "cublasLtMatmulDescCreate", key);
    const int32_t trans_a = cuda::CUBLAS_OP_T, trans_b = cuda::CUBLAS_OP_N;
    check_lt(api.cublasLtMatmulDescSetAttribute(p->desc, cuda::CUBLASLT_MATMUL_DESC_TRANSA,
                                                &trans_a, sizeof trans_a),
             "cublasLtMatmulDescSetAttribute", key);
    check_lt(api.cublasLtMatmulDescSetAttribute(p->desc, cuda::CUBLASLT_MATMUL_DESC_TRANSB,
                                                &trans_b, sizeof trans_b),
             "cublasLtMatmulDescSetAttribute", key);
    const uint64_t d = key.d, rows = key.rows, nq = key.nq;
    check_lt(api.cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16F, d, rows, int64_t(d)),
             "cublasLtMatrixLayoutCreate", key);
    check_lt(api.cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16F, d, nq, int64_t(d)),
             "cublasLtMatrixLayoutCreate", key);
    check_lt(api.cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, rows, nq, int64_t(rows)),
             "cublasLtMatrixLayoutCreate", key);

    cuda::cublasLtMatmulPreference_t pref = nullptr;
    check_lt(api.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", key);
    const uint64_t workspace = kWorkspaceBytes;
    const std::pair<cuda::cublasLtMatmulPreferenceAttributes_t, const void*> prefs[] = {
        {cuda::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_x},
        {cuda::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_q},
        {cuda::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_scores},
        {cuda::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_scores}};
    cuda::cublasStatus_t status = api.cublasLtMatmulPreferenceSetAttribute(
        pref, cuda::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
    for (const auto& [attr, value] : prefs) {
      if (status == cuda::CUBLAS_STATUS_SUCCESS) {
        status = api.cublasLtMatmulPreferenceSetAttribute(pref, attr, value, sizeof(uint32_t));
      }
    }
    cuda::cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    if (status == cuda::CUBLAS_STATUS_SUCCESS) {
      status = api.cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->d, p->d,
                                                  pref, 1, &result, &returned);
    }
    api.cublasLtMatmulPreferenceDestroy(pref);
    check_lt(status, "cublasLtMatmulAlgoGetHeuristic", key);
    if (returned == 0) {
      throw Error("cuBLASLt has no fp16 algorithm for the search's scores [" +
                  std::to_string(key.nq) + " queries x " + std::to_string(key.rows) +
                  " rows], d = " + std::to_string(key.d));
    }
    p->algo = result.algo;
    return *plans_.emplace(key, std::move(p)).first->second;
  }

  const cuda::CublasLtLibrary& lib_;
  cuda::cublasLtHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

// One GPU's rows and everything a search of them needs there.
struct Shard {
  CudaShardInfo info;
  cudaStream_t stream = nullptr;
  std::unique_ptr<ScoreGemm> gemm;
  DeviceBuffer vectors, norms, workspace, flag;  // flag: a query not finite in fp16
  DeviceBuffer q32, q16, qnorms, scores, cand, lists[2];  // grown as searches need
  int result = 0;               // which of `lists` the last batch ended in
  std::vector<uint64_t> keys;   // the last batch's sorted lists, [nq, k]

  ~Shard() {
    if (stream == nullptr) return;
    DeviceScope scope(info.gpu);
    cudaStreamDestroy(stream);
  }
};

// Two pinned host buffers of fp32 rows: the host fills one from the file while the GPU
// copies the other. Portable: every GPU copies from them.
class PinnedPair {
 public:
  explicit PinnedPair(size_t bytes) {
    for (float*& b : buf) {
      if (cudaHostAlloc(reinterpret_cast<void**>(&b), bytes, cudaHostAllocPortable) !=
          cudaSuccess) {
        cudaGetLastError();
        b = nullptr;
        free();  // the destructor does not run for a constructor that throws
        throw Error("CUDA: cannot allocate " + mib(bytes) + " of pinned host memory");
      }
    }
  }
  ~PinnedPair() { free(); }
  PinnedPair(const PinnedPair&) = delete;
  PinnedPair& operator=(const PinnedPair&) = delete;
  float* buf[2] = {nullptr, nullptr};

 private:
  void free() {
    for (float*& b : buf) {
      if (b != nullptr) cudaFreeHost(b);
      b = nullptr;
    }
  }
};

// Progress lines on stderr, in tenths, for an upload over 1 GiB.
class Progress {
 public:
  explicit Progress(const FaissIndex& index)
      : path_(index.path),
        total_(index.ntotal),
        report_(uint64_t(index.ntotal) * index.d * sizeof(float) > (uint64_t{1} << 30)) {}
  void add(int64_t rows) {
    done_ += rows;
    const int64_t tenths = total_ > 0 ? 10 * done_ / total_ : 10;
    if (report_ && tenths > reported_) {
      reported_ = tenths;
      std::fprintf(stderr, "searchr1-index: fp16 upload of %s to the GPU: %d%%\n", path_.c_str(),
                   static_cast<int>(10 * tenths));
    }
  }

 private:
  std::string path_;
  int64_t total_, done_ = 0, reported_ = 0;
  bool report_;
};

class CudaFlat final : public CudaFlatIndex {
 public:
  CudaFlat(const FaissIndex& index, const CudaFlatOptions& options);
  TopK search(const float* queries, int nq, int k) override;
  const std::vector<CudaShardInfo>& shards() const override { return infos_; }

 private:
  void upload(Shard& s, const FaissIndex& index, PinnedPair& pinned, int64_t chunk_rows,
              Progress& progress);
  void enqueue(Shard& s, const float* queries, int nq, int k);
  void finish(Shard& s, int nq, int k);
  void merge_shards(int nq, int k, int64_t* ids, float* scores) const;

  int d_;
  Metric metric_;
  int block_rows_, tile_rows_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<CudaShardInfo> infos_;
};

CudaFlat::CudaFlat(const FaissIndex& index, const CudaFlatOptions& options)
    : d_(index.d),
      metric_(index.metric),
      block_rows_(options.block_rows),
      tile_rows_(options.tile_rows) {
  require_cuda();
  if (options.gpus.empty()) throw UsageError("--gpus: no GPU given");
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  for (const int g : options.gpus) {
    if (g < 0 || g >= count) {
      throw UsageError("--gpus: there is no GPU " + std::to_string(g) + " (" +
                       std::to_string(count) + " visible: 0 to " + std::to_string(count - 1) +
                       "; CUDA_VISIBLE_DEVICES chooses them)");
    }
  }
  if (index.ntotal >= int64_t{0xFFFFFFFF}) {
    throw Error(index.path + ": " + std::to_string(index.ntotal) +
                " rows; the GPU search numbers rows in 32 bits (at most 4294967294)");
  }
  const int64_t chunk_rows = std::max<int64_t>(1, kChunkBytes / (sizeof(float) * d_));
  PinnedPair pinned(size_t(chunk_rows) * d_ * sizeof(float));
  Progress progress(index);
  if (!index.converted()) {
    index.file->advise_sequential(index.vectors_offset, index.vectors.n * sizeof(float));
  }
  const int64_t n = static_cast<int64_t>(options.gpus.size());
  for (int64_t i = 0; i < n; i++) {
    const int64_t first = index.ntotal * i / n, last = index.ntotal * (i + 1) / n;
    if (last == first) continue;  // more GPUs than rows
    auto s = std::make_unique<Shard>();
    s->info.gpu = options.gpus[i];
    s->info.first = first;
    s->info.rows = last - first;
    upload(*s, index, pinned, chunk_rows, progress);
    infos_.push_back(s->info);
    shards_.push_back(std::move(s));
  }
}

// The shard's rows to fp16 on its GPU, a chunk at a time through the pinned pair, and for
// L2 their norms. The mapping's pages of each chunk are dropped once copied.
void CudaFlat::upload(Shard& s, const FaissIndex& index, PinnedPair& pinned,
                      int64_t chunk_rows, Progress& progress) {
  const int gpu = s.info.gpu;
  DeviceScope scope(gpu);
  const int64_t rows = s.info.rows, d = d_;
  const bool l2 = metric_ == Metric::L2;
  const uint64_t vector_bytes = uint64_t(rows) * d * sizeof(__half);
  s.info.bytes = vector_bytes + (l2 ? uint64_t(rows) * sizeof(float) : 0);
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, gpu), "cudaGetDeviceProperties");
  s.info.name = prop.name;
  const uint64_t staging = uint64_t(chunk_rows) * d * sizeof(float);
  const uint64_t needed = s.info.bytes + kWorkspaceBytes + staging + kSearchReserve;
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  if (free < needed) {
    throw Error("GPU " + std::to_string(gpu) + " (" + s.info.name + ") has " + mib(free) +
                " free of " + mib(total) + "; its shard of " + index.path + " (" +
                std::to_string(rows) + " rows in fp16) needs " + mib(needed) +
                " with the search's buffers: shard over more GPUs (--gpus) or search on "
                "the CPU (--device cpu)");
  }
  check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  s.gemm = std::make_unique<ScoreGemm>();
  s.workspace.reserve(kWorkspaceBytes, gpu, "cuBLASLt's workspace");
  s.flag.reserve(sizeof(int), gpu, "a flag");
  s.vectors.reserve(vector_bytes, gpu, "the fp16 vectors");
  if (l2) s.norms.reserve(rows * sizeof(float), gpu, "the vectors' norms");
  DeviceBuffer fp32;
  fp32.reserve(staging, gpu, "the upload's staging buffer");
  check(cudaMemsetAsync(s.flag.as<int>(), 0, sizeof(int), s.stream), "cudaMemsetAsync");

  cudaEvent_t copied[2] = {nullptr, nullptr};  // pinned.buf[b] may be refilled
  for (cudaEvent_t& e : copied) {
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }
  try {
    __half* x = s.vectors.as<__half>();
    for (int64_t r = 0, c = 0; r < rows; r += chunk_rows, c++) {
      const int64_t n = std::min(chunk_rows, rows - r), row = s.info.first + r;
      const int b = static_cast<int>(c % 2);
      if (c >= 2) check(cudaEventSynchronize(copied[b]), "uploading the vectors");
      index.copy_rows(row, n, pinned.buf[b]);
      if (!index.converted()) {
        index.file->release(index.vectors_offset + uint64_t(row) * d * sizeof(float),
                            uint64_t(n) * d * sizeof(float));
      }
      const size_t count = size_t(n) * d;
      check(cudaMemcpyAsync(fp32.as<float>(), pinned.buf[b], count * sizeof(float),
                            cudaMemcpyHostToDevice, s.stream),
            "cudaMemcpyAsync");
      f32_to_f16(x + size_t(r) * d, fp32.as<float>(), count, s.flag.as<int>(), s.stream);
      check(cudaEventRecord(copied[b], s.stream), "cudaEventRecord");
      progress.add(n);
    }
    if (l2) row_norms(s.norms.as<float>(), x, rows, d_, s.stream);
    int bad = 0;
    check(cudaMemcpyAsync(&bad, s.flag.as<int>(), sizeof bad, cudaMemcpyDeviceToHost, s.stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(s.stream), "uploading the vectors");
    if (bad) {
      throw Error(index.path + ": a vector component is inf, NaN or beyond fp16's range "
                  "(|x| > 65504), and the GPU holds the vectors in fp16 (use --device cpu)");
    }
  } catch (...) {
    for (cudaEvent_t e : copied) cudaEventDestroy(e);
    throw;
  }
  for (cudaEvent_t e : copied) cudaEventDestroy(e);
}

TopK CudaFlat::search(const float* queries, int nq, int k) {
  if (k < 1 || k > kCudaFlatMaxK) {
    throw Error("k = " + std::to_string(k) + ": a search on the GPU returns 1 to " +
                std::to_string(kCudaFlatMaxK) + " neighbours per query");
  }
  TopK r;
  r.nq = nq;
  r.k = k;
  r.ids.assign(size_t(nq) * k, -1);
  r.scores.assign(size_t(nq) * k, metric_ == Metric::L2 ? FLT_MAX : -FLT_MAX);
  for (int q0 = 0; q0 < nq; q0 += kQueryBatch) {
    const int n = std::min(kQueryBatch, nq - q0);
    // Every GPU's work is queued before any is waited for, so the shards run at once.
    for (auto& s : shards_) enqueue(*s, queries + size_t(q0) * d_, n, k);
    for (auto& s : shards_) finish(*s, n, k);
    merge_shards(n, k, r.ids.data() + size_t(q0) * k, r.scores.data() + size_t(q0) * k);
  }
  return r;
}

// Queues the search of one batch on a shard's stream; the result is sorted in
// s.lists[s.result].
void CudaFlat::enqueue(Shard& s, const float* queries, int nq, int k) {
  const int gpu = s.info.gpu;
  DeviceScope scope(gpu);
  const int64_t rows = s.info.rows;
  const bool l2 = metric_ == Metric::L2;
  const int tile = tile_rows_ > 0 ? tile_rows_ : std::max(kMinTileRows, 4 * k);
  int64_t block = block_rows_;
  if (block <= 0) {
    const int64_t fit = int64_t(kScoreBytes / (sizeof(float) * nq)) / 256 * 256;
    block = std::clamp<int64_t>(fit, kMinBlockRows, kMaxBlockRows);
  }
  block = std::min(block, rows);
  const int64_t tiles = (block + tile - 1) / tile;  // of a full block: the most any has
  if (tiles * k > (int64_t{1} << 30)) {
    throw Error("a block of " + std::to_string(block) + " rows in tiles of " +
                std::to_string(tile) + " leaves too many candidates: raise --tile-rows");
  }
  const size_t list_bytes = size_t(nq) * k * sizeof(uint64_t);
  s.q32.reserve(size_t(nq) * d_ * sizeof(float), gpu, "the queries");
  s.q16.reserve(size_t(nq) * d_ * sizeof(__half), gpu, "the fp16 queries");
  s.qnorms.reserve(size_t(nq) * sizeof(float), gpu, "the queries' norms");
  s.scores.reserve(size_t(nq) * block * sizeof(float), gpu, "the score matrix");
  s.cand.reserve(size_t(nq) * tiles * k * sizeof(uint64_t), gpu, "the tiles' top-k lists");
  for (DeviceBuffer& l : s.lists) l.reserve(list_bytes, gpu, "the running top-k lists");

  check(cudaMemcpyAsync(s.q32.as<float>(), queries, size_t(nq) * d_ * sizeof(float),
                        cudaMemcpyHostToDevice, s.stream),
        "cudaMemcpyAsync");
  check(cudaMemsetAsync(s.flag.as<int>(), 0, sizeof(int), s.stream), "cudaMemsetAsync");
  f32_to_f16(s.q16.as<__half>(), s.q32.as<float>(), size_t(nq) * d_, s.flag.as<int>(), s.stream);
  if (l2) row_norms(s.qnorms.as<float>(), s.q32.as<float>(), nq, d_, s.stream);
  check(cudaMemsetAsync(s.lists[0].as<uint64_t>(), 0, list_bytes, s.stream), "cudaMemsetAsync");
  int cur = 0;
  for (int64_t b0 = 0; b0 < rows; b0 += block) {
    const int nb = static_cast<int>(std::min(block, rows - b0));
    s.gemm->run(s.scores.as<float>(), s.q16.as<__half>(),
                s.vectors.as<__half>() + size_t(b0) * d_, nq, nb, d_, s.workspace.as<void>(),
                s.stream);
    const int nt = (nb + tile - 1) / tile;
    const dim3 grid(nt, nq);
    const uint32_t id0 = static_cast<uint32_t>(s.info.first + b0);
    if (l2) {
      tile_topk_kernel<true><<<grid, kThreads, 0, s.stream>>>(
          s.cand.as<uint64_t>(), s.scores.as<float>(), nb, tile, k, id0,
          s.norms.as<float>() + b0, s.qnorms.as<float>());
    } else {
      tile_topk_kernel<false><<<grid, kThreads, 0, s.stream>>>(
          s.cand.as<uint64_t>(), s.scores.as<float>(), nb, tile, k, id0, nullptr, nullptr);
    }
    check_launch("tile_topk_kernel");
    merge_topk_kernel<<<nq, kThreads, 0, s.stream>>>(s.lists[1 - cur].as<uint64_t>(),
                                                      s.cand.as<uint64_t>(), nt * k,
                                                      s.lists[cur].as<uint64_t>(), k);
    check_launch("merge_topk_kernel");
    cur = 1 - cur;
  }
  int p = 1;
  while (p < k) p *= 2;
  sort_keys_kernel<<<nq, std::clamp(p / 2, 32, 1024), p * sizeof(uint64_t), s.stream>>>(
      s.lists[cur].as<uint64_t>(), k, p);
  check_launch("sort_keys_kernel");
  s.result = cur;
}

// Waits for a shard's batch and downloads its lists.
void CudaFlat::finish(Shard& s, int nq, int k) {
  DeviceScope scope(s.info.gpu);
  s.keys.resize(size_t(nq) * k);
  int bad = 0;
  check(cudaMemcpyAsync(s.keys.data(), s.lists[s.result].as<uint64_t>(),
                        s.keys.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost, s.stream),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(&bad, s.flag.as<int>(), sizeof bad, cudaMemcpyDeviceToHost, s.stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(s.stream), "searching on the GPU");
  if (bad) {
    throw Error("a query component is inf, NaN or beyond fp16's range (|x| > 65504), and "
                "the GPU search is in fp16");
  }
}

// The shards' sorted lists merged best first (CPU: a k-way merge), keys decoded into ids
// and scores; for inner product each run of equal scores is then reversed, higher id first
// as faiss's heap lists them (the keys put the lower id first, which L2 keeps).
void CudaFlat::merge_shards(int nq, int k, int64_t* ids, float* scores) const {
  std::vector<size_t> head(shards_.size());
  for (int q = 0; q < nq; q++) {
    int64_t* id = ids + size_t(q) * k;
    float* score = scores + size_t(q) * k;
    const size_t row = size_t(q) * k;
    std::fill(head.begin(), head.end(), 0);
    int found = 0;
    for (; found < k; found++) {
      size_t best = 0;
      uint64_t key = 0;
      for (size_t s = 0; s < shards_.size(); s++) {
        const uint64_t v = shards_[s]->keys[row + head[s]];  // head[s] <= found < k
        if (s == 0 || v > key) {
          best = s;
          key = v;
        }
      }
      if (key == 0) break;  // only empty places are left: -1 and the worst score already
      head[best]++;
      id[found] = cuda::key_id(key);
      score[found] = key_score(key, metric_);
    }
    if (metric_ == Metric::L2) continue;
    for (int a = 0; a < found;) {
      int b = a + 1;
      while (b < found && score[b] == score[a]) b++;
      std::reverse(id + a, id + b);
      a = b;
    }
  }
}

}  // namespace

std::unique_ptr<CudaFlatIndex> upload_flat_index(const FaissIndex& index,
                                                 const CudaFlatOptions& options) {
  return std::make_unique<CudaFlat>(index, options);
}

}  // namespace sr1
