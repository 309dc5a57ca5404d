// The CUDA backend: bf16 activations and compute weights with fp32 accumulation; fp32
// master weights, gradients and AdamW state. Matmuls go through cuBLASLt (loaded at run
// time, matmul.h), everything else through our own kernels (kernels.h). All work is queued
// on one stream; the host waits only where a value comes back (download, sum_squares).
//
// By default every operation runs a path that has passed on a GPU; each newer kernel is
// opt-in through an environment variable until a GPU run confirms it (make_cuda_backend;
// docs/gpu-status.md says what ran where and when).
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/matmul.h"
#include "util/error.h"

namespace sr1 {

namespace cuda {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(status));
  }
}

void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

}  // namespace cuda

namespace {

using cuda::bf16;
using cuda::check;

bf16* X(XPtr p) { return static_cast<bf16*>(p.p); }

// A captured stream's work, instantiated once, launched on the stream by replay().
class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(cudaGraph_t graph, cudaStream_t stream) : graph_(graph), stream_(stream) {
    const cudaError_t status = cudaGraphInstantiate(&exec_, graph_, 0);
    if (status != cudaSuccess) {
      cudaGraphDestroy(graph_);
      check(status, "cudaGraphInstantiate");
    }
  }
  ~CudaGraph() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  void replay() override { check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch"); }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_ = nullptr;
  cudaStream_t stream_;
};

// CUDA events recorded on the stream around each operation: the device's own time for it,
// without waiting for the GPU between operations. Events are created once and reused.
class CudaTimer final : public DeviceTimer {
 public:
  explicit CudaTimer(cudaStream_t stream) : stream_(stream) {}
  ~CudaTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void begin() override { record(); }
  void end() override { record(); }
  std::vector<double> read() override {
    std::vector<double> ms;
    if (used_ > 0) check(cudaEventSynchronize(events_[used_ - 1]), "cudaEventSynchronize");
    for (size_t i = 0; i + 1 < used_; i += 2) {
      float t = 0;
      check(cudaEventElapsedTime(&t, events_[i], events_[i + 1]), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    used_ = 0;
    return ms;
  }

 private:
  void record() {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    check(cudaEventRecord(events_[used_++], stream_), "cudaEventRecord");
  }

  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// The opt-in kernels the environment turned on (make_cuda_backend); all off by default.
struct OptIn {
  bool attention_mma = false;  // attention_mma.cu's attention instead of the WMMA kernels
  // The engine's fused decode kernels: add_rmsnorm_forward in one kernel, the keys and values
  // stored by the rotary kernel, and the gate/up GEMV ending in SwiGLU.
  bool fused_decode = false;
  bool device_filter = false;  // top-k/top-p/min-p cut and drawn on the device
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::unique_ptr<cuda::Matmul> matmul, OptIn opt_in)
      : mm_(std::move(matmul)), opt_in_(opt_in) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    workspace_ = raw(cuda::Matmul::kWorkspaceBytes);
    partials_ = static_cast<double*>(raw(cuda::sum_squares_partials() * sizeof(double)));
  }
  ~CudaBackend() override {
    // Destructors must not throw: errors here are reported by the next CUDA call, if any.
    for (void* p : {workspace_, static_cast<void*>(partials_), scratch_,
                    static_cast<void*>(sample_rows_), static_cast<void*>(sample_out_)}) {
      if (p != nullptr) cudaFree(p);
    }
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  std::unique_ptr<DeviceTimer> timer() const override {
    return std::make_unique<CudaTimer>(stream_);
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  bool can_capture() const override { return true; }
  void begin_capture() override {
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
  }
  std::unique_ptr<DeviceGraph> end_capture() override {
    cudaGraph_t graph = nullptr;
    check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    return std::make_unique<CudaGraph>(graph, stream_);
  }

  size_t x_elem() const override { return sizeof(bf16); }
  size_t free_bytes() const override {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return free;
  }
  size_t total_bytes() const override {
    size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return total;
  }
  float* alloc(size_t n) override { return static_cast<float*>(raw(n * sizeof(float))); }
  int32_t* alloc_i32(size_t n) override { return static_cast<int32_t*>(raw(n * sizeof(int32_t))); }
  XPtr alloc_x(size_t n) override { return XPtr{raw(n * sizeof(bf16)), sizeof(bf16)}; }
  void release(void* p) override {
    track_release(p);
    cudaFree(p);
  }
  // Mapped: with unified addressing (every 64-bit CUDA system) the kernels take the host
  // pointer itself (zero-copy); portable: any context may use it.
  void* alloc_host(size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, std::max<size_t>(bytes, 1),
                        cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc (page-locked host memory)");
    return p;
  }
  void release_host(void* p) override { cudaFreeHost(p); }
  // Host buffers may be reused as soon as these return, so they wait for the copy.
  void upload(float* dst, const float* src, size_t n) override {
    copy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice);
  }
  void upload_i32(int32_t* dst, const int32_t* src, size_t n) override {
    copy(dst, src, n * sizeof(int32_t), cudaMemcpyHostToDevice);
  }
  void download(float* dst, const float* src, size_t n) override {
    copy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost);
  }
  void upload_bytes(void* dst, const void* src, size_t bytes) override {
    copy(dst, src, bytes, cudaMemcpyHostToDevice);
  }
  void download_bytes(void* dst, const void* src, size_t bytes) override {
    copy(dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  void zero(float* p, size_t n) override {
    check(cudaMemsetAsync(p, 0, n * sizeof(float), stream_), "cudaMemsetAsync");
  }
  void zero_x(XPtr p, size_t n) override {
    check(cudaMemsetAsync(p.p, 0, n * sizeof(bf16), stream_), "cudaMemsetAsync");  // +0.0
  }
  void to_x(XPtr dst, const float* src, size_t n) override {
    cuda::f32_to_bf16(X(dst), src, n, stream_);
  }

  void download_x(float* dst, XPtr src, size_t n) override {
    std::vector<uint16_t> raw_bits(n);
    copy(raw_bits.data(), src.p, n * sizeof(bf16), cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++) {
      const uint32_t bits = static_cast<uint32_t>(raw_bits[i]) << 16;
      std::memcpy(dst + i, &bits, sizeof(float));
    }
  }

  void embedding_forward(XPtr out, const int32_t* ids, XPtr wte, int N, int C) override {
    cuda::embedding_forward(X(out), ids, X(wte), N, C, stream_);
  }
  void embedding_backward(float* dwte, XPtr dout, const int32_t* ids, int N, int C) override {
    cuda::embedding_backward(dwte, X(dout), ids, N, C, stream_);
  }
  void rmsnorm_forward(XPtr out, float* rstd, XPtr inp, XPtr w, int N, int C,
                       float eps) override {
    cuda::rmsnorm_forward(X(out), rstd, X(inp), X(w), N, C, eps, stream_);
  }
  void rmsnorm_backward(XPtr dinp, float* dw, XPtr dout, XPtr inp, XPtr w, const float* rstd,
                        int N, int C) override {
    cuda::rmsnorm_backward(X(dinp), dw, X(dout), X(inp), X(w), rstd, N, C, stream_);
  }
  void matmul_forward(XPtr out, XPtr inp, XPtr w, XPtr bias, int N, int C, int OC) override {
    mm_->forward(X(out), X(inp), X(w), X(bias), N, C, OC, workspace_, stream_);
  }
  void matmul_backward(XPtr dinp, float* dw, float* dbias, XPtr dout, XPtr inp, XPtr w, int N,
                       int C, int OC, bool accumulate_dinp) override {
    mm_->backward(X(dinp), dw, dbias, X(dout), X(inp), X(w), N, C, OC, accumulate_dinp,
                  workspace_, stream_);
  }
  void rope_forward(XPtr qkv, const int32_t* pos, const AttentionShape& s,
                    float theta) override {
    cuda::rope(X(qkv), pos, s, theta, 1.0f, stream_);
  }
  void rope_backward(XPtr dqkv, const int32_t* pos, const AttentionShape& s,
                     float theta) override {
    cuda::rope(X(dqkv), pos, s, theta, -1.0f, stream_);  // a rotation's transpose is its inverse
  }
  // The one check of the trainer's and the engine's CUDA attention (cuda::attention_supports).
  void require_head_dim(int head_dim) const override {
    if (!cuda::attention_supports(head_dim)) {
      throw Error("the CUDA attention kernels support head_dim 16, 32, 64 and 128; this model "
                  "has head_dim " + std::to_string(head_dim) + " (use --device cpu)");
    }
  }
  void attention_forward(XPtr out, float* lse, XPtr qkv, const int32_t* key_mask,
                         const AttentionShape& s) override {
    require_head_dim(s.head_dim);
    cuda::attention_forward(X(out), lse, X(qkv), key_mask, s,
                            scratch(attention_forward_scratch(s)), opt_in_.attention_mma,
                            stream_);
  }
  void attention_backward(XPtr dqkv, XPtr dout, XPtr qkv, XPtr out, const float* lse,
                          const int32_t* key_mask, const AttentionShape& s) override {
    require_head_dim(s.head_dim);
    cuda::attention_backward(X(dqkv), X(dout), X(qkv), X(out), lse, key_mask, s,
                             scratch(attention_backward_scratch(s)),
                             opt_in_.attention_mma, stream_);
  }
  void rope_kv_store(XPtr qkv, const int32_t* pos, XPtr k, XPtr v, const int32_t* slots,
                     const PagedShape& s, float theta) override {
    const AttentionShape rows{1, s.rows, s.num_heads, s.num_kv_heads, s.head_dim};
    if (!opt_in_.fused_decode) {
      cuda::rope(X(qkv), pos, rows, theta, 1.0f, stream_);
      cuda::kv_store(X(k), X(v), X(qkv), slots, s, stream_);
      return;
    }
    const cuda::KvStore store{X(k), X(v), slots, s.block_size};
    cuda::rope(X(qkv), pos, rows, theta, 1.0f, stream_, &store);
  }
  void paged_attention(XPtr out, XPtr qkv, XPtr k, XPtr v, const int32_t* block_tables,
                       const int32_t* seq, const int32_t* pos, const PagedShape& s) override {
    require_head_dim(s.head_dim);
    cuda::paged_attention(X(out), X(qkv), X(k), X(v), block_tables, seq, pos, s, stream_);
  }
  void swiglu_forward(XPtr out, XPtr gu, int N, int I) override {
    cuda::swiglu_forward(X(out), X(gu), N, I, stream_);
  }
  void matmul_swiglu_forward(XPtr act, XPtr gu, XPtr inp, XPtr w, int N, int C,
                             int I) override {
    if (!opt_in_.fused_decode ||
        !mm_->forward_swiglu(X(act), X(gu), X(inp), X(w), N, C, I, workspace_, stream_)) {
      Backend::matmul_swiglu_forward(act, gu, inp, w, N, C, I);
    }
  }
  void swiglu_backward(XPtr dgu, XPtr dout, XPtr gu, int N, int I) override {
    cuda::swiglu_backward(X(dgu), X(dout), X(gu), N, I, stream_);
  }
  void add(XPtr out, XPtr a, XPtr b, size_t n) override {
    cuda::add(X(out), X(a), X(b), n, stream_);
  }
  void add_rmsnorm_forward(XPtr sum, XPtr out, float* rstd, XPtr a, XPtr b, XPtr w, int N,
                           int C, float eps) override {
    if (!opt_in_.fused_decode) {
      Backend::add_rmsnorm_forward(sum, out, rstd, a, b, w, N, C, eps);
      return;
    }
    cuda::add_rmsnorm_forward(X(sum), X(out), rstd, X(a), X(b), X(w), N, C, eps, stream_);
  }
  void scale(XPtr x, float s, size_t n) override { cuda::scale(X(x), s, n, stream_); }
  void copy_columns(XPtr dst, int ld_dst, XPtr src, int ld_src, int rows, int cols,
                    bool accumulate) override {
    cuda::copy_columns(X(dst), ld_dst, X(src), ld_src, rows, cols, accumulate, stream_);
  }
  void layernorm_forward(XPtr out, XPtr inp, XPtr w, XPtr bias, int N, int C,
                         float eps) override {
    cuda::layernorm_forward(X(out), X(inp), X(w), X(bias), N, C, eps, stream_);
  }
  void gelu_forward(XPtr out, XPtr inp, size_t n) override {
    cuda::gelu_forward(X(out), X(inp), n, stream_);
  }
  void gather_rows(XPtr out, XPtr in, const int32_t* rows, int n, int C) override {
    cuda::gather_rows(X(out), X(in), rows, n, C, stream_);
  }
  void scatter_rows(XPtr out, XPtr in, const int32_t* rows, int n, int C) override {
    cuda::scatter_rows(X(out), X(in), rows, n, C, stream_);
  }
  void logprob_forward(float* logprob, float* entropy, XPtr logits, const int32_t* targets,
                       int n, int V) override {
    cuda::logprob_forward(logprob, entropy, X(logits), targets, n, V, stream_);
  }
  void logprob_backward(XPtr logits, const int32_t* targets, const float* coef,
                        const float* ent_coef, int n,
                        int V) override {
    cuda::logprob_backward(X(logits), targets, coef, ent_coef, n, V, stream_);
  }
  // The rows go up and the draws come back with the step's one wait for the GPU. Unless
  // SEARCHR1_FILTERED_SAMPLING=device, filtered rows are left undone (token -1), which
  // Backend::sample_tokens allows: the caller samples them on the host from their logits.
  void sample_tokens(TokenDraw* out, XPtr logits, const SampleRow* rows, int n,
                     int V) override {
    if (n == 0) return;
    if (n > sample_capacity_) {
      for (void* p : {static_cast<void*>(sample_rows_), static_cast<void*>(sample_out_)}) {
        if (p != nullptr) release(p);
      }
      sample_rows_ = nullptr;
      sample_out_ = nullptr;
      sample_capacity_ = 0;
      sample_rows_ = static_cast<SampleRow*>(raw(static_cast<size_t>(n) * sizeof(SampleRow)));
      sample_out_ = static_cast<TokenDraw*>(raw(static_cast<size_t>(n) * sizeof(TokenDraw)));
      sample_capacity_ = n;
    }
    const SampleRow* device = opt_in_.device_filter ? rows : unfiltered(rows, n, V);
    check(cudaMemcpyAsync(sample_rows_, device, static_cast<size_t>(n) * sizeof(SampleRow),
                          cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync");
    cuda::sample_tokens(sample_out_, X(logits), sample_rows_, n, V,
                        scratch(cuda::sample_tokens_scratch(n)), stream_);
    copy(out, sample_out_, static_cast<size_t>(n) * sizeof(TokenDraw), cudaMemcpyDeviceToHost);
    if (!opt_in_.device_filter) leave_filtered_undone(out, rows, n, V);
  }
  double sum_squares(const float* x, size_t n) override {
    return cuda::sum_squares(x, n, partials_, stream_);
  }
  void accumulate(float* dst, const float* src, size_t n) override {
    cuda::accumulate(dst, src, n, stream_);
  }
  void adamw_update(float* p, const float* g, float* m, float* v, size_t n,
                    const AdamWParams& a) override {
    cuda::adamw_update(p, g, m, v, n, a, stream_);
  }

 private:
  void* raw(size_t bytes) {
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (status != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw Error("CUDA: cannot allocate " + mib(bytes) + " of GPU memory (" + mib(free) +
                  " free of " + mib(total) + ", this process holds " + mib(live_bytes()) +
                  "): try --recompute, a smaller --micro-batch-size or --logits-chunk");
    }
    track_alloc(p, bytes);
    return p;
  }

  // rows with each filtered one made greedy (in unfiltered_rows_), so that the device's
  // filtered kernel, not yet run on a GPU, finds no row to cut: it returns at once.
  const SampleRow* unfiltered(const SampleRow* rows, int n, int V) {
    unfiltered_rows_.assign(rows, rows + n);
    for (SampleRow& row : unfiltered_rows_) {
      if (row.filtered(V)) row = SampleRow{};
    }
    return unfiltered_rows_.data();
  }

  // Marks the draws of filtered rows undone (their greedy tokens from unfiltered dropped).
  static void leave_filtered_undone(TokenDraw* out, const SampleRow* rows, int n, int V) {
    for (int r = 0; r < n; r++) {
      if (rows[r].filtered(V)) out[r].token = -1;
    }
  }

  void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    check(cudaMemcpyAsync(dst, src, bytes, kind, stream_), "cudaMemcpyAsync");
    synchronize();
  }

  // The scratch of the attention and sampling calls (kernels.h), grown to the most bytes
  // asked for. Work queued on the stream may still use the old buffer: release()'s cudaFree
  // waits for it.
  void* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_ != nullptr) release(scratch_);
      scratch_ = nullptr;  // raw() may throw; never leave a dangling pointer behind
      scratch_ = raw(bytes);
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  std::unique_ptr<cuda::Matmul> mm_;
  OptIn opt_in_;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
  double* partials_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  SampleRow* sample_rows_ = nullptr;  // sample_tokens' rows and draws on the device
  TokenDraw* sample_out_ = nullptr;
  int sample_capacity_ = 0;
  std::vector<SampleRow> unfiltered_rows_;  // sample_tokens' rows, filtered ones made greedy
};

// Why the runtime found no device, in words a user can act on.
std::string no_device_reason(cudaError_t status) {
  if (status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice) {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver == nullptr) return "no NVIDIA driver was found (libcuda.so.1)";
    dlclose(driver);
  }
  if (status == cudaErrorInsufficientDriver) {
    return "the NVIDIA driver is older than the CUDA " + std::to_string(CUDART_VERSION / 1000) +
           " runtime this binary was built with (update the driver, or rebuild with an older "
           "nvcc: CUDACXX=/path/to/nvcc npm run build:native)";
  }
  return std::string("no CUDA GPU is visible (") + cudaGetErrorString(status) + ")";
}

CudaStatus probe() {
  CudaStatus s;
  s.built = true;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    s.reason = no_device_reason(status == cudaSuccess ? cudaErrorNoDevice : status);
    return s;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  s.gpu = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
          std::to_string(prop.minor) + ")";
  if (prop.major < 8) {
    s.reason = s.gpu + " has no bf16 tensor cores; the CUDA backend needs sm_80 or newer";
    return s;
  }
  std::string why;
  const std::unique_ptr<cuda::Matmul> matmul = cuda::Matmul::open(&why);
  if (!matmul) {
    s.reason = why;
    return s;
  }
  s.cublaslt = matmul->library();
  s.available = true;
  return s;
}

// The value of a choice the environment may make (the first of `allowed` when unset); any
// other value is refused, naming the variable.
std::string env_choice(const char* name, std::initializer_list<const char*> allowed) {
  const char* set = std::getenv(name);
  const std::string value = set != nullptr ? set : *allowed.begin();
  std::string listed;
  for (const char* a : allowed) {
    if (value == a) return value;
    listed += (listed.empty() ? "" : ", ") + std::string(a);
  }
  throw Error(std::string(name) + " must be one of " + listed + " (it is '" + value + "')");
}

}  // namespace

CudaStatus cuda_status() {
  static const CudaStatus status = probe();
  return status;
}

// Each variable's first value is its default: the path that has passed on a GPU; the others
// are opt-in until a GPU run (the CUDA tests and bench/gpu.sh, which run both) confirms them.
std::unique_ptr<Backend> make_cuda_backend() {
  std::string why;
  std::unique_ptr<cuda::Matmul> matmul = cuda::Matmul::open(&why);
  if (!matmul) throw Error("--device cuda: " + why);
  const std::string gemv = env_choice("SEARCHR1_GEMV", {"off", "auto", "on"});
  matmul->set_gemv(gemv == "off"    ? cuda::Matmul::Gemv::kNever
                   : gemv == "auto" ? cuda::Matmul::Gemv::kTimed
                                    : cuda::Matmul::Gemv::kAlways);
  matmul->set_tuning(env_choice("SEARCHR1_MATMUL_TUNING", {"off", "on"}) == "on");
  OptIn opt_in;
  opt_in.attention_mma = env_choice("SEARCHR1_ATTENTION", {"wmma", "mma"}) == "mma";
  opt_in.fused_decode = env_choice("SEARCHR1_FUSED_DECODE", {"off", "on"}) == "on";
  opt_in.device_filter = env_choice("SEARCHR1_FILTERED_SAMPLING", {"host", "device"}) == "device";
  return std::make_unique<CudaBackend>(std::move(matmul), opt_in);
}

}  // namespace sr1
