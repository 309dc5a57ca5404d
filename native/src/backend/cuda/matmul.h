// The CUDA backend's matmuls, on cuBLASLt (opened at run time, see cublaslt_api.h): bf16
// operands, fp32 accumulation and scaling. All matrices are row-major; cuBLASLt is column-major,
// so each call hands it the transposed view (a row-major R x K matrix is a column-major K x R
// one with ld K) as set out in matmul.cu.
//
// Not thread-safe: one Matmul serves one backend, whose calls come from one thread.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "backend/cuda/cublaslt_api.h"
#include "backend/cuda/kernels.h"

namespace sr1::cuda {

class Matmul {
 public:
  // Size of the `workspace` every call takes (device memory, 256-byte aligned as cudaMalloc
  // returns it).
  static constexpr size_t kWorkspaceBytes = kMatmulWorkspaceBytes;

  // Loads cuBLASLt and creates a handle; nullptr and *why set when it cannot.
  static std::unique_ptr<Matmul> open(std::string* why);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  const std::string& library() const { return library_; }  // the file that was loaded

  // How products of up to kGemvRows rows pick gemv.cu or cuBLASLt ($SEARCHR1_GEMV): always
  // cuBLASLt (off, the default: the path that has run on a GPU), timed per shape (auto), or
  // always gemv.cu (on). gemv.cu has not run on a GPU yet (docs/gpu-status.md); the CUDA
  // tests run each choice.
  enum class Gemv { kNever, kTimed, kAlways };
  void set_gemv(Gemv choice) { gemv_ = choice; }
  // Whether forward products time cuBLASLt's heuristic candidates (tuned) instead of taking
  // its first choice, as the GPU runs so far did ($SEARCHR1_MATMUL_TUNING=on|off).
  void set_tuning(bool on) { tuning_ = on; }

  // out[N,OC] = inp[N,C] . w[OC,C]^T (+ bias[OC] when bias != nullptr). The bias is added by
  // a kernel after the product, not by cuBLASLt's BIAS epilogue: with it the heuristic chose
  // kernels 20-40x slower than the plain product (an H200: 2.1 ms against ~0.05 ms for
  // N=16,384, 896 -> 1,152, Qwen2's qkv projection; 32 us at one row).
  void forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int N, int C, int OC,
               void* workspace, cudaStream_t stream);
  // act[N,I] = silu(gate) * up of gu = inp[N,C] . w[2I,C]^T (swiglu_forward's rounding), in one
  // gemv.cu kernel where gemv_faster says so for the product (then gu is left unwritten);
  // otherwise false, and the caller runs the product into gu and SwiGLU after it.
  bool forward_swiglu(bf16* act, bf16* gu, const bf16* inp, const bf16* w, int N, int C, int I,
                      void* workspace, cudaStream_t stream);
  // dinp[N,C] = (or += with accumulate_dinp) dout[N,OC] . w[OC,C]; dw[OC,C] += dout^T . inp;
  // dbias[OC] += column sums of dout. dw and dbias are fp32. Any of dinp, dw, dbias may be null
  // to skip it.
  void backward(bf16* dinp, float* dw, float* dbias, const bf16* dout, const bf16* inp,
                const bf16* w, int N, int C, int OC, bool accumulate_dinp, void* workspace,
                cudaStream_t stream);

 private:
  enum class Kind { kForward, kInputGrad, kWeightGrad };

  // What the descriptors and the heuristic's choice depend on. The operands' alignments are
  // part of it because callers pass offsets into buffers, and an algorithm chosen for
  // 256-byte-aligned pointers may not run on others.
  struct Key {
    Kind kind;
    int N, C, OC;
    uint32_t align_a, align_b, align_d;
    auto tie() const { return std::tie(kind, N, C, OC, align_a, align_b, align_d); }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
  };
  struct Plan;  // the descriptors and algorithm of one Key
  // The operands of the call a plan is made for, which a forward plan's tuning runs on.
  struct Operands {
    const void *a, *b;
    void* d;
    void* workspace;
    cudaStream_t stream;
  };

  Matmul(const CublasLt& api, std::string library, cublasLtHandle_t handle);
  void gemm(Kind kind, int N, int C, int OC, const void* a, const void* b, void* d, float beta,
            void* workspace, cudaStream_t stream);
  const Plan& plan(const Key& key, const Operands& run);
  // The fastest of the heuristic's candidates for a forward product (whose D the call
  // overwrites, so candidates may run on the call's own operands), timed once per Key with
  // N rounded up to a power of two and reused, where cuBLASLt accepts it, for the other N
  // of that range. With the heuristic's first choice alone, the qkv projection ran 10-40x
  // below the other projections' rate in an H200's profile (commit 7c89cf4); the tuned
  // choice has not run on a GPU yet (docs/gpu-status.md), so it is taken only with
  // set_tuning(true).
  cublasLtMatmulAlgo_t tuned(const Key& key, const Plan& p,
                             const cublasLtMatmulHeuristicResult_t* candidates, int count,
                             const Operands& run);
  // Whether gemv.cu's kernel beats cuBLASLt on a product of N <= kGemvRows rows: both timed
  // on the shape's first call (never while a graph records; then cuBLASLt runs) and kept.
  // Timed eagerly, so each side's launch cost counts, as it does outside graphs.
  bool gemv_faster(int N, int C, int OC, const Operands& run);
  // cuBLASLt runs `algo` on this plan's problem within our workspace.
  bool runs(const Plan& p, const cublasLtMatmulAlgo_t& algo) const;
  static std::string describe(const Key& key);  // "forward N=.. C=.. OC=..", for errors
  // Throws sr1::Error naming `call`, the status and the shape unless `status` is success.
  void check_lt(cublasStatus_t status, const char* call, const Key& key) const;

  const CublasLt& api_;
  std::string library_;
  cublasLtHandle_t handle_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<Key, cublasLtMatmulAlgo_t> tuned_;  // by Key with N rounded up to a power of two
  std::map<std::tuple<int, int, int>, bool> gemv_faster_;  // by (N, C, OC)
  Gemv gemv_ = Gemv::kNever;
  bool tuning_ = false;
};

}  // namespace sr1::cuda
