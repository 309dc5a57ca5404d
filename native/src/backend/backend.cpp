#include "backend/backend.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

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

void* Backend::alloc_host(size_t bytes) {
  void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
  if (p == nullptr) {
    throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes");
  }
  return p;
}

void Backend::release_host(void* p) { std::free(p); }

namespace {

// The host's clock: right for a backend whose operations return when they are done.
class HostTimer final : public DeviceTimer {
 public:
  void begin() override { start_ = Clock::now(); }
  void end() override {
    ms_.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start_).count());
  }
  std::vector<double> read() override {
    std::vector<double> out;
    out.swap(ms_);
    return out;
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
  std::vector<double> ms_;
};

}  // namespace

std::unique_ptr<DeviceTimer> Backend::timer() const { return std::make_unique<HostTimer>(); }

void Backend::add_rmsnorm_forward(XPtr sum, XPtr out, float* rstd, XPtr a, XPtr b, XPtr w,
                                  int N, int C, float eps) {
  add(sum, a, b, static_cast<size_t>(N) * C);
  rmsnorm_forward(out, rstd, sum, w, N, C, eps);
}

void Backend::matmul_swiglu_forward(XPtr act, XPtr gu, XPtr inp, XPtr w, int N, int C, int I) {
  matmul_forward(gu, inp, w, {}, N, C, 2 * I);
  swiglu_forward(act, gu, N, I);
}

void Backend::begin_capture() { throw Error(name() + " backend: no graphs (can_capture)"); }

std::unique_ptr<DeviceGraph> Backend::end_capture() {
  throw Error(name() + " backend: no graphs (can_capture)");
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
