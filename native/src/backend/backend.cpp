#include "backend/backend.h"

#include "util/error.h"

namespace sr1 {

std::unique_ptr<Backend> make_cpu_backend();

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") {
    throw UsageError("--device cuda: this build has no CUDA backend (use --device cpu)");
  }
  throw UsageError("--device: unknown device '" + device + "' (expected cpu or cuda)");
}

}  // namespace sr1
