// Row-major to column-major: a row-major R x K matrix is, to cuBLASLt, a column-major K x R
// matrix with ld K, so each product below is computed as its transpose.
//   forward   out^T[OC,N] = w^T . inp^T    A = w (C x OC, op T), B = inp (C x N), k = C;
//             then add_bias_kernel adds bias[output feature] to every row of out. Up to
//             kGemvRows rows may go to gemv.cu instead (SEARCHR1_GEMV=auto or on:
//             Matmul::gemv_faster).
//   dinp      dinp^T[C,N] = w . dout^T      A = w (C x OC), B = dout (OC x N), k = OC
//   dw        dw^T[C,OC] = inp^T . dout     A = inp (C x N), B = dout (OC x N, op T), k = N;
//             fp32 C = D = dw with beta 1 accumulates.
#include "backend/cuda/matmul.h"

#include <algorithm>
#include <utility>

#include "util/error.h"

namespace sr1::cuda {
namespace {

// dbias[col] += sum over rows of dout[row, col]. Each block owns kCols columns outright, so
// no atomics: its kRows thread rows each sum a strided share of the rows, then one thread per
// column adds the partials in a fixed order, which keeps the result deterministic.
constexpr int kCols = 32, kRows = 32;

__global__ void bias_backward_kernel(float* dbias, const bf16* dout, int N, int OC) {
  __shared__ float partial[kRows][kCols];
  const int col = blockIdx.x * kCols + threadIdx.x;
  float sum = 0.0f;
  if (col < OC) {
    for (int row = threadIdx.y; row < N; row += kRows) {
      sum += __bfloat162float(dout[size_t(row) * OC + col]);
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < OC) {
    for (int r = 1; r < kRows; r++) sum += partial[r][threadIdx.x];
    dbias[col] += sum;
  }
}

// out[row, col] += bias[col], in fp32, rounded once more to bf16.
__global__ void add_bias_kernel(bf16* out, const bf16* bias, size_t N, int OC) {
  const size_t total = N * OC;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(__bfloat162float(out[i]) + __bfloat162float(bias[i % OC]));
  }
}

// Milliseconds that kRuns calls of `call` (a bool: it was queued) take on `stream`, after one
// untimed call; -1 when a call fails.
template <typename Call>
float time_ms(cudaStream_t stream, const Call& call) {
  constexpr int kRuns = 3;
  if (!call()) return -1;
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  bool ok = true;
  for (int r = 0; r < kRuns && ok; r++) ok = call();
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ok ? ms : -1;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &status), "cudaStreamIsCapturing");
  return status != cudaStreamCaptureStatusNone;
}

// Largest power of two, up to cuBLASLt's default assumption of 256, that divides the address.
uint32_t alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && address % align != 0) align /= 2;
  return align;
}

// "status 15, CUBLAS_STATUS_NOT_SUPPORTED"
std::string status_text(const CublasLt& api, cublasStatus_t status) {
  const char* name = api.cublasLtGetStatusName(status);
  return "status " + std::to_string(status) + (name ? std::string(", ") + name : "");
}

// A cuBLASLt object, destroyed with its owner.
template <typename T>
struct Owned {
  T handle = nullptr;
  cublasStatus_t (*destroy)(T) = nullptr;
  explicit Owned(cublasStatus_t (*d)(T)) : destroy(d) {}
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (handle) destroy(handle);
  }
};

}  // namespace

struct Matmul::Plan {
  explicit Plan(const CublasLt& api)
      : desc(api.cublasLtMatmulDescDestroy),
        a(api.cublasLtMatrixLayoutDestroy),
        b(api.cublasLtMatrixLayoutDestroy),
        d(api.cublasLtMatrixLayoutDestroy) {}
  Owned<cublasLtMatmulDesc_t> desc;
  Owned<cublasLtMatrixLayout_t> a, b, d;  // C shares D's layout (and memory)
  cublasLtMatmulAlgo_t algo{};
};

Matmul::Matmul(const CublasLt& api, std::string library, cublasLtHandle_t handle)
    : api_(api), library_(std::move(library)), handle_(handle) {}

Matmul::~Matmul() { api_.cublasLtDestroy(handle_); }

std::unique_ptr<Matmul> Matmul::open(std::string* why) {
  const CublasLtLibrary& lib = load_cublaslt();
  if (lib.api == nullptr) {
    *why = lib.error;
    return nullptr;
  }
  cublasLtHandle_t handle = nullptr;
  const cublasStatus_t status = lib.api->cublasLtCreate(&handle);
  if (status != CUBLAS_STATUS_SUCCESS) {
    *why = "cublasLtCreate failed (" + status_text(*lib.api, status) + ") with " + lib.path;
    return nullptr;
  }
  return std::unique_ptr<Matmul>(new Matmul(*lib.api, lib.path, handle));
}

std::string Matmul::describe(const Key& key) {
  const char* kind = key.kind == Kind::kForward     ? "forward"
                     : key.kind == Kind::kInputGrad ? "backward (input gradient)"
                                                    : "backward (weight gradient)";
  return std::string(kind) + " N=" + std::to_string(key.N) + " C=" + std::to_string(key.C) +
         " OC=" + std::to_string(key.OC);
}

void Matmul::check_lt(cublasStatus_t status, const char* call, const Key& key) const {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(std::string("cuBLASLt ") + call + " failed (" + status_text(api_, status) +
              ") for " + describe(key));
}

const Matmul::Plan& Matmul::plan(const Key& key, const Operands& run) {
  const auto found = plans_.find(key);
  if (found != plans_.end()) return *found->second;

  // Stored (pre-op) shapes of A, B and D as column-major rows x cols, each packed (ld = rows).
  struct Dims {
    uint64_t rows, cols;
  };
  const uint64_t N = key.N, C = key.C, OC = key.OC;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  Dims a{C, OC}, b{OC, N}, d{C, N};  // kInputGrad
  cudaDataType_t d_type = CUDA_R_16BF;
  if (key.kind == Kind::kForward) {
    trans_a = CUBLAS_OP_T;
    b = {C, N};
    d = {OC, N};
  } else if (key.kind == Kind::kWeightGrad) {
    trans_b = CUBLAS_OP_T;
    a = {C, N};
    d = {C, OC};
    d_type = CUDA_R_32F;
  }

  auto p = std::make_unique<Plan>(api_);
  check_lt(api_.cublasLtMatmulDescCreate(&p->desc.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate", key);
  const auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t size) {
    check_lt(api_.cublasLtMatmulDescSetAttribute(p->desc.handle, attr, value, size),
             "cublasLtMatmulDescSetAttribute", key);
  };
  const int32_t ta = trans_a, tb = trans_b;
  set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  const auto layout = [&](Owned<cublasLtMatrixLayout_t>& l, cudaDataType_t type, Dims dims) {
    check_lt(api_.cublasLtMatrixLayoutCreate(&l.handle, type, dims.rows, dims.cols,
                                             int64_t(dims.rows)),
             "cublasLtMatrixLayoutCreate", key);
  };
  layout(p->a, CUDA_R_16BF, a);
  layout(p->b, CUDA_R_16BF, b);
  layout(p->d, d_type, d);

  Owned<cublasLtMatmulPreference_t> pref(api_.cublasLtMatmulPreferenceDestroy);
  check_lt(api_.cublasLtMatmulPreferenceCreate(&pref.handle), "cublasLtMatmulPreferenceCreate",
           key);
  const auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* value,
                          size_t size) {
    check_lt(api_.cublasLtMatmulPreferenceSetAttribute(pref.handle, attr, value, size),
             "cublasLtMatmulPreferenceSetAttribute", key);
  };
  const uint64_t workspace = kWorkspaceBytes;
  prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a, sizeof key.align_a);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b, sizeof key.align_b);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_d, sizeof key.align_d);
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_d, sizeof key.align_d);

  // One candidate, the heuristic's first choice, unless this forward product is tuned.
  constexpr int kCandidates = 8;
  const bool tune = tuning_ && key.kind == Kind::kForward;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int returned = 0;
  check_lt(api_.cublasLtMatmulAlgoGetHeuristic(handle_, p->desc.handle, p->a.handle,
                                               p->b.handle, p->d.handle, p->d.handle,
                                               pref.handle, tune ? kCandidates : 1, results,
                                               &returned),
           "cublasLtMatmulAlgoGetHeuristic", key);
  if (returned == 0) {
    throw Error("cuBLASLt has no algorithm for matmul " + describe(key) +
                " (operand alignments in bytes: A " + std::to_string(key.align_a) + ", B " +
                std::to_string(key.align_b) + ", D " + std::to_string(key.align_d) + ")");
  }
  p->algo = tune ? tuned(key, *p, results, returned, run) : results[0].algo;
  return *plans_.emplace(key, std::move(p)).first->second;
}

bool Matmul::runs(const Plan& p, const cublasLtMatmulAlgo_t& algo) const {
  cublasLtMatmulHeuristicResult_t result{};
  const cublasStatus_t status =
      api_.cublasLtMatmulAlgoCheck(handle_, p.desc.handle, p.a.handle, p.b.handle, p.d.handle,
                                   p.d.handle, &algo, &result);
  return status == CUBLAS_STATUS_SUCCESS && result.workspaceSize <= kWorkspaceBytes;
}

cublasLtMatmulAlgo_t Matmul::tuned(const Key& key, const Plan& p,
                                   const cublasLtMatmulHeuristicResult_t* candidates, int count,
                                   const Operands& run) {
  Key range = key;
  range.N = 1;
  while (range.N < key.N) range.N *= 2;
  const auto known = tuned_.find(range);
  if (known != tuned_.end()) return runs(p, known->second) ? known->second : candidates[0].algo;
  // No timing while a graph is being recorded (the engine records shapes it ran before, so
  // this is a new N in a known range whose choice cuBLASLt did not accept).
  if (count <= 1 || capturing(run.stream)) return candidates[0].algo;

  const float alpha = 1.0f, beta = 0.0f;
  const auto product = [&](const cublasLtMatmulAlgo_t& algo) {
    return api_.cublasLtMatmul(handle_, p.desc.handle, &alpha, run.a, p.a.handle, run.b,
                               p.b.handle, &beta, run.d, p.d.handle, run.d, p.d.handle, &algo,
                               run.workspace, kWorkspaceBytes, run.stream) ==
           CUBLAS_STATUS_SUCCESS;
  };
  int best = -1;  // none ran: the heuristic's first, whose call then says why
  float best_ms = 0;
  for (int i = 0; i < count; i++) {
    const cublasLtMatmulAlgo_t& algo = candidates[i].algo;
    if (candidates[i].workspaceSize > kWorkspaceBytes) continue;
    const float ms = time_ms(run.stream, [&] { return product(algo); });
    if (ms >= 0 && (best < 0 || ms < best_ms)) {
      best = i;
      best_ms = ms;
    }
  }
  if (best < 0) return candidates[0].algo;
  tuned_.emplace(range, candidates[best].algo);
  return candidates[best].algo;
}

void Matmul::gemm(Kind kind, int N, int C, int OC, const void* a, const void* b, void* d,
                  float beta, void* workspace, cudaStream_t stream) {
  const Key key{kind, N, C, OC, alignment(a), alignment(b), alignment(d)};
  const Plan& p = plan(key, Operands{a, b, d, workspace, stream});
  const float alpha = 1.0f;
  check_lt(api_.cublasLtMatmul(handle_, p.desc.handle, &alpha, a, p.a.handle, b, p.b.handle,
                               &beta, d, p.d.handle, d, p.d.handle, &p.algo, workspace,
                               kWorkspaceBytes, stream),
           "cublasLtMatmul", key);
}

bool Matmul::gemv_faster(int N, int C, int OC, const Operands& run) {
  if (gemv_ != Gemv::kTimed) return gemv_ == Gemv::kAlways;
  const std::tuple<int, int, int> shape{N, C, OC};
  const auto known = gemv_faster_.find(shape);
  if (known != gemv_faster_.end()) return known->second;
  if (capturing(run.stream)) return false;  // untimed: cuBLASLt, without keeping the choice
  auto* out = static_cast<bf16*>(run.d);
  const auto* inp = static_cast<const bf16*>(run.b);
  const auto* w = static_cast<const bf16*>(run.a);
  const float gemv_ms = time_ms(run.stream, [&] {
    gemv(out, inp, w, nullptr, N, C, OC, run.stream);
    return true;
  });
  const float gemm_ms = time_ms(run.stream, [&] {
    gemm(Kind::kForward, N, C, OC, w, inp, out, 0.0f, run.workspace, run.stream);
    return true;
  });
  return gemv_faster_[shape] = gemv_ms < gemm_ms;
}

void Matmul::forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C,
                     int OC, void* workspace, cudaStream_t stream) {
  if (N == 0) return;  // an empty batch: nothing to compute, and no zero-sized matrix to describe
  if (gemv_fits(inp, w, N, C) && gemv_faster(N, C, OC, Operands{w, inp, out, workspace, stream})) {
    gemv(out, inp, w, bias, N, C, OC, stream);  // adds the bias itself
    return;
  }
  gemm(Kind::kForward, N, C, OC, w, inp, out, 0.0f, workspace, stream);
  if (bias) {
    const size_t total = static_cast<size_t>(N) * OC;
    const unsigned blocks = static_cast<unsigned>(std::min<size_t>((total + 255) / 256, 65536));
    add_bias_kernel<<<blocks, 256, 0, stream>>>(out, bias, N, OC);
    check_launch("add_bias_kernel");
  }
}

bool Matmul::forward_swiglu(bf16* act, bf16* gu, const bf16* inp, const bf16* w, int N, int C,
                            int I, void* workspace, cudaStream_t stream) {
  if (N == 0 || !gemv_fits(inp, w, N, C) ||
      !gemv_faster(N, C, 2 * I, Operands{w, inp, gu, workspace, stream})) {
    return false;
  }
  gemv_swiglu(act, inp, w, N, C, I, stream);
  return true;
}

void Matmul::backward(bf16* dinp, float* dw, float* dbias, const bf16* dout, const bf16* inp,
                      const bf16* w, int N, int C, int OC, bool accumulate_dinp, void* workspace,
                      cudaStream_t stream) {
  if (N == 0) return;  // as in forward
  if (dinp) {
    gemm(Kind::kInputGrad, N, C, OC, w, dout, dinp, accumulate_dinp ? 1.0f : 0.0f, workspace,
         stream);
  }
  if (dw) gemm(Kind::kWeightGrad, N, C, OC, inp, dout, dw, 1.0f, workspace, stream);
  if (dbias) {
    const int blocks = (OC + kCols - 1) / kCols;
    bias_backward_kernel<<<blocks, dim3(kCols, kRows), 0, stream>>>(dbias, dout, N, OC);
    check_launch("bias_backward_kernel");
  }
}

}  // namespace sr1::cuda
