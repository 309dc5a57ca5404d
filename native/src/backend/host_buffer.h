// Bytes of host memory from Backend::alloc_host (page-locked on CUDA), given back when the
// buffer goes: what a learner or a model keeps off the device; and the copies of floats that
// lie in host memory or on the device to and from the host.
#pragma once
#include <cstddef>
#include <cstring>
#include <utility>

#include "backend/backend.h"

namespace sr1 {

class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(Backend& backend, size_t bytes)
      : be_(&backend), p_(backend.alloc_host(bytes)), bytes_(bytes) {}
  ~HostBuffer() {
    if (p_ != nullptr) be_->release_host(p_);
  }
  HostBuffer(HostBuffer&& o) noexcept
      : be_(o.be_), p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    std::swap(be_, o.be_);
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }

  void* data() const { return p_; }
  float* floats() const { return static_cast<float*>(p_); }
  size_t bytes() const { return bytes_; }
  bool empty() const { return p_ == nullptr; }

 private:
  Backend* be_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// n floats into host memory from `src`, which lies in host memory (`on_host`) or on the
// device; and back (the backend's copies take device memory on one side).
inline void read_floats(Backend& be, float* dst, const float* src, size_t n, bool on_host) {
  if (on_host) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    be.download(dst, src, n);
  }
}
inline void write_floats(Backend& be, float* dst, const float* src, size_t n, bool on_host) {
  if (on_host) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    be.upload(dst, src, n);
  }
}

}  // namespace sr1
