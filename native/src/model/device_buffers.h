// A set of device buffers allocated from one backend and released together (the
// activations of one batch shape).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace sr1 {

class DeviceBuffers {
 public:
  explicit DeviceBuffers(Backend& backend) : be_(backend) {}
  ~DeviceBuffers() {
    for (void* p : owned_) be_.release(p);
  }
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  float* f(size_t n) { return keep(be_.alloc(n)); }
  int32_t* i(size_t n) { return keep(be_.alloc_i32(n)); }
  XPtr x(size_t n) {
    const XPtr p = be_.alloc_x(n);
    keep(p.p);
    return p;
  }

 private:
  template <typename T>
  T* keep(T* p) {
    owned_.push_back(p);
    return p;
  }
  Backend& be_;
  std::vector<void*> owned_;
};

}  // namespace sr1
