// Finds and opens libcublasLt at run time (search order in cublaslt_api.h, the search itself in
// library_search.h), so one build runs with whichever cuBLAS 12 or 13 the machine has: a pip
// wheel, conda or the CUDA toolkit.
#include <dlfcn.h>

#include "backend/cuda/cublaslt_api.h"
#include "backend/cuda/library_search.h"

namespace sr1::cuda {
namespace {

template <typename F>
bool resolve(void* lib, const char* name, F* fn, const char** missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) *missing = name;
  return *fn != nullptr;
}

// Fills `api` from `lib`; returns the first function it lacks, or null.
const char* resolve_all(void* lib, CublasLt* api) {
  const char* missing = nullptr;
#define SR1_RESOLVE(f) resolve(lib, #f, &api->f, &missing)
  const bool ok = SR1_RESOLVE(cublasLtCreate) && SR1_RESOLVE(cublasLtDestroy) &&
                  SR1_RESOLVE(cublasLtGetStatusName) && SR1_RESOLVE(cublasLtMatmulDescCreate) &&
                  SR1_RESOLVE(cublasLtMatmulDescDestroy) &&
                  SR1_RESOLVE(cublasLtMatmulDescSetAttribute) &&
                  SR1_RESOLVE(cublasLtMatrixLayoutCreate) &&
                  SR1_RESOLVE(cublasLtMatrixLayoutDestroy) &&
                  SR1_RESOLVE(cublasLtMatmulPreferenceCreate) &&
                  SR1_RESOLVE(cublasLtMatmulPreferenceDestroy) &&
                  SR1_RESOLVE(cublasLtMatmulPreferenceSetAttribute) &&
                  SR1_RESOLVE(cublasLtMatmulAlgoGetHeuristic) &&
                  SR1_RESOLVE(cublasLtMatmulAlgoCheck) && SR1_RESOLVE(cublasLtMatmul);
#undef SR1_RESOLVE
  return ok ? nullptr : missing;
}

CublasLtLibrary search(CublasLt* table) {
  LibrarySearch what;
  what.names = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  what.env = "SEARCHR1_CUBLAS_PATH";
  what.wheels = {"cu13", "cublas"};  // CUDA 13's nvidia-cublas, CUDA 12's nvidia-cublas-cu12
  what.none_there = "no libcublasLt there";
  what.lacking = "(too old a cuBLASLt?)";
  what.resolve = [table](void* lib) {
    CublasLt api{};  // into the table only when complete
    const char* missing = resolve_all(lib, &api);
    if (missing == nullptr) *table = api;
    return missing;
  };
  const FoundLibrary found = find_library(what);
  CublasLtLibrary loaded;
  if (!found.path.empty()) {
    loaded.api = table;
    loaded.path = found.path;
    return loaded;
  }
  loaded.error = "cuBLASLt could not be loaded (tried libcublasLt.so.13, .so.12 and .so): " +
                 found.notes +
                 ". Install it (pip install nvidia-cublas, or nvidia-cublas-cu12, or the CUDA "
                 "toolkit) or set SEARCHR1_CUBLAS_PATH to libcublasLt or its folder";
  return loaded;
}

}  // namespace

const CublasLtLibrary& load_cublaslt() {
  static CublasLt table{};
  static const CublasLtLibrary loaded = search(&table);
  return loaded;
}

}  // namespace sr1::cuda
