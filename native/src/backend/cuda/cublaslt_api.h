// The part of cuBLASLt the CUDA backend uses, declared here so that the build needs neither
// cuBLAS headers nor a link against it: the library is opened at run time (load_cublaslt) and
// its functions are called through a table of pointers.
//
// Values and layouts were read from cublasLt.h and cublas_api.h of cuBLAS 12.6.4 (CUDA 12.6.3)
// and cross-checked against Modular's cuBLASLt bindings for CUDA 13
// (max/kernels/src/_cublas/cublaslt.mojo, cublas.mojo, result.mojo) and against how PyTorch
// (aten/src/ATen/cuda/CUDABlas.cpp) and TransformerEngine set the same attributes. They are
// part of cuBLAS's ABI, which NVIDIA keeps from release to release, so they hold for
// libcublasLt.so.12 and .so.13 alike. The data types (CUDA_R_16BF = 14, CUDA_R_32F = 0) come
// from the toolkit's own library_types.h.
//
// Where the library is looked for, in order (the first file that loads and has every
// function below wins):
//  1. $SEARCHR1_CUBLAS_PATH: the library file itself, or a folder that holds it;
//  2. the pip wheels under $VIRTUAL_ENV and then $CONDA_PREFIX:
//     lib/python3*/site-packages/nvidia/cu13/lib (CUDA 13 wheels: nvidia-cublas) and
//     .../nvidia/cublas/lib (CUDA 12 wheels: nvidia-cublas-cu12), then $CONDA_PREFIX/lib
//     (conda's libcublas package);
//  3. $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64 and the library folder of the
//     toolkit this build was compiled with;
//  4. the system's search (LD_LIBRARY_PATH, the ldconfig cache).
// In each folder the names tried are libcublasLt.so.13, libcublasLt.so.12, libcublasLt.so.
#pragma once
#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace sr1::cuda {

enum cublasStatus_t : int32_t {
  CUBLAS_STATUS_SUCCESS = 0,
};

enum cublasOperation_t : int32_t {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
};

enum cublasComputeType_t : int32_t {
  CUBLAS_COMPUTE_32F = 68,
};

// Attribute values are passed by address with their size, which cuBLASLt checks: the comment
// on each names the type it expects.
enum cublasLtMatmulDescAttributes_t : int32_t {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,  // int32_t (cublasOperation_t)
  CUBLASLT_MATMUL_DESC_TRANSB = 4,  // int32_t (cublasOperation_t)
};

enum cublasLtMatmulPreferenceAttributes_t : int32_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,    // uint64_t, default 0
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,  // uint32_t, default 256
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

// Opaque objects, only ever handled through pointers.
struct cublasLtContext;
struct cublasLtMatmulDescOpaque_t;
struct cublasLtMatrixLayoutOpaque_t;
struct cublasLtMatmulPreferenceOpaque_t;
using cublasLtHandle_t = cublasLtContext*;
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;

// Semi-opaque: we hold these by value, so their size must match the library's.
struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};

struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

static_assert(sizeof(cublasLtMatmulAlgo_t) == 64, "cublasLtMatmulAlgo_t is uint64_t[8]");
static_assert(sizeof(cublasLtMatmulHeuristicResult_t) == 96,
              "cublasLtMatmulHeuristicResult_t is algo, size_t, int, float, int[4]");

// The functions we call, named after their symbols.
struct CublasLt {
  cublasStatus_t (*cublasLtCreate)(cublasLtHandle_t* handle);
  cublasStatus_t (*cublasLtDestroy)(cublasLtHandle_t handle);
  const char* (*cublasLtGetStatusName)(cublasStatus_t status);
  cublasStatus_t (*cublasLtMatmulDescCreate)(cublasLtMatmulDesc_t* desc,
                                             cublasComputeType_t compute_type,
                                             cudaDataType_t scale_type);
  cublasStatus_t (*cublasLtMatmulDescDestroy)(cublasLtMatmulDesc_t desc);
  cublasStatus_t (*cublasLtMatmulDescSetAttribute)(cublasLtMatmulDesc_t desc,
                                                   cublasLtMatmulDescAttributes_t attr,
                                                   const void* buf, size_t size);
  cublasStatus_t (*cublasLtMatrixLayoutCreate)(cublasLtMatrixLayout_t* layout,
                                               cudaDataType_t type, uint64_t rows,
                                               uint64_t cols, int64_t ld);
  cublasStatus_t (*cublasLtMatrixLayoutDestroy)(cublasLtMatrixLayout_t layout);
  cublasStatus_t (*cublasLtMatmulPreferenceCreate)(cublasLtMatmulPreference_t* pref);
  cublasStatus_t (*cublasLtMatmulPreferenceDestroy)(cublasLtMatmulPreference_t pref);
  cublasStatus_t (*cublasLtMatmulPreferenceSetAttribute)(
      cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
      const void* buf, size_t size);
  cublasStatus_t (*cublasLtMatmulAlgoGetHeuristic)(
      cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
      cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
      cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t* results,
      int* returned);
  // Whether `algo` runs this problem, and the workspace it needs then (result->workspaceSize).
  cublasStatus_t (*cublasLtMatmulAlgoCheck)(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                            cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                            cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                            const cublasLtMatmulAlgo_t* algo,
                                            cublasLtMatmulHeuristicResult_t* result);
  // D = alpha * op(A) * op(B) + beta * C, column-major
  cublasStatus_t (*cublasLtMatmul)(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                   const void* alpha, const void* a,
                                   cublasLtMatrixLayout_t a_layout, const void* b,
                                   cublasLtMatrixLayout_t b_layout, const void* beta,
                                   const void* c, cublasLtMatrixLayout_t c_layout, void* d,
                                   cublasLtMatrixLayout_t d_layout,
                                   const cublasLtMatmulAlgo_t* algo, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream);
};

struct CublasLtLibrary {
  const CublasLt* api = nullptr;  // null when no library could be loaded
  std::string path;               // the file that was loaded
  std::string error;              // why none was, naming every place looked in
};

// Searches for and opens libcublasLt on the first call (thread-safe); later calls return the
// same result. The library stays loaded for the life of the process.
const CublasLtLibrary& load_cublaslt();

}  // namespace sr1::cuda
