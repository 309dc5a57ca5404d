#include "engine/kv_budget.h"

#include <algorithm>
#include <string>

#include "model/paged.h"
#include "util/error.h"

namespace sr1 {
namespace {

// What is left of u × the GPU's memory after the weights (the backend's live bytes) and a
// step's buffers, at most what is free.
size_t utilization_bytes(double u, const DeviceMemory& device, size_t step_bytes,
                         size_t per_block) {
  if (!(u > 0 && u <= 1)) throw UsageError("--gpu-memory-utilization must be in (0, 1]");
  const double budget = u * static_cast<double>(device.total);
  const double taken = static_cast<double>(device.live + step_bytes);
  const double left = budget - taken;
  if (left < static_cast<double>(per_block)) {
    throw UsageError("--gpu-memory-utilization " + std::to_string(u) + ": " +
                     std::to_string(static_cast<long long>(budget / (1 << 20))) +
                     " MiB of the GPU leave no room for a KV cache after the weights and "
                     "the buffers of a step (" +
                     std::to_string(static_cast<long long>(taken) >> 20) +
                     " MiB); raise it, or lower --chunk-tokens");
  }
  return std::min(static_cast<size_t>(left), device.free);
}

// The cache's bytes when cache_mb is not given.
size_t budget_bytes(const KvBudget& b, const DeviceMemory& device, size_t per_block) {
  const size_t full = static_cast<size_t>(b.max_running) *
                      ((b.context + b.block_size - 1) / b.block_size + 1) * per_block;
  size_t bytes;
  if (!device.cpu && b.gpu_memory_utilization) {
    bytes = utilization_bytes(*b.gpu_memory_utilization, device, b.step_bytes, per_block);
  } else {
    const double share = device.cpu ? 0.25 : 0.8;
    const size_t free = device.free;
    bytes = static_cast<size_t>(share * static_cast<double>(free - std::min(free, b.step_bytes)));
  }
  return std::min(bytes, full);
}

}  // namespace

int kv_blocks_for(const KvBudget& budget, const Backend& backend, const ModelConfig& config) {
  return kv_blocks_for(budget,
                       DeviceMemory{backend.name() == "cpu", backend.total_bytes(),
                                    backend.live_bytes(), backend.free_bytes(), backend.x_elem()},
                       config);
}

int kv_blocks_for(const KvBudget& budget, const DeviceMemory& device, const ModelConfig& config) {
  const size_t per_block = PagedKvCache::bytes_per_block(config, budget.block_size, device.x_elem);
  const size_t bytes = budget.cache_mb
                           ? static_cast<size_t>(*budget.cache_mb * 1024 * 1024)
                           : budget_bytes(budget, device, per_block);
  const size_t blocks = bytes / per_block;
  if (blocks < 1) {
    throw UsageError("--kv-cache-mb: too small for one block of " +
                     std::to_string(budget.block_size) + " tokens (" +
                     std::to_string(per_block) + " bytes)");
  }
  return static_cast<int>(std::min<size_t>(blocks, 1 << 30));
}

}  // namespace sr1
