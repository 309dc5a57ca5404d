// A set of device buffers allocated from one backend and released together (the
// activations of one batch shape). The same code that lays a set out also counts its bytes:
// a counting set (no backend) allocates nothing, so the memory plan (searchr1-trainer plan)
// reads the sizes from the allocation code itself.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace sr1 {

class DeviceBuffers {
 public:
  // Allocates from `backend`.
  explicit DeviceBuffers(Backend& backend) : be_(&backend), x_elem_(backend.x_elem()) {}
  // Allocates from `backend`, or with none counts only: every buffer is null, and bytes() is
  // what they would take with compute-type elements of `x_elem` bytes (2: bf16 on CUDA, 4:
  // fp32 on the CPU).
  DeviceBuffers(Backend* backend, size_t x_elem) : be_(backend), x_elem_(x_elem) {}
  ~DeviceBuffers() {
    for (void* p : owned_) be_->release(p);
  }
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  float* f(size_t n) {
    bytes_ += n * sizeof(float);
    return be_ != nullptr ? keep(be_->alloc(n)) : nullptr;
  }
  int32_t* i(size_t n) {
    bytes_ += n * sizeof(int32_t);
    return be_ != nullptr ? keep(be_->alloc_i32(n)) : nullptr;
  }
  XPtr x(size_t n) {
    bytes_ += n * x_elem_;
    if (be_ == nullptr) return XPtr{nullptr, x_elem_};
    const XPtr p = be_->alloc_x(n);
    keep(p.p);
    return p;
  }
  // Bytes of every buffer taken so far, allocated or counted.
  size_t bytes() const { return bytes_; }

 private:
  template <typename T>
  T* keep(T* p) {
    owned_.push_back(p);
    return p;
  }
  Backend* be_ = nullptr;
  size_t x_elem_;
  size_t bytes_ = 0;
  std::vector<void*> owned_;
};

}  // namespace sr1
