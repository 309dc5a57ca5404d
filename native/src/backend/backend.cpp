#include "backend/backend.h"

#include <algorithm>
#include <cstdio>

#include "util/error.h"

namespace sr1 {

std::unique_ptr<Backend> make_cpu_backend();
#ifdef SR1_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend();  // backend/cuda/cuda_backend.cu
#else
CudaStatus cuda_status() {
  CudaStatus s;
  s.reason =
      "this build has no CUDA backend (nvcc was not found when it was built, or it was "
      "configured with SEARCHR1_CUDA=OFF)";
  return s;
}
#endif

void Backend::track_alloc(void* p, size_t bytes) {
  sizes_[p] = bytes;
  live_ += bytes;
  peak_ = std::max(peak_, live_);
}

void Backend::track_release(void* p) {
  const auto it = sizes_.find(p);
  if (it == sizes_.end()) return;
  live_ -= it->second;
  sizes_.erase(it);
}

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
  if (device != "cuda" && device != "auto") {
    throw UsageError("--device: unknown device '" + device + "' (expected auto, cpu or cuda)");
  }
  const CudaStatus cuda = cuda_status();
#ifdef SR1_HAVE_CUDA
  if (cuda.available) return make_cuda_backend();
#endif
  if (device == "cuda") throw UsageError("--device cuda: " + cuda.reason);
  std::fprintf(stderr, "searchr1: note: running on the CPU (%s)\n", cuda.reason.c_str());
  return make_cpu_backend();
}

}  // namespace sr1
