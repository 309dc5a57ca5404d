// How many KV-cache blocks the engine gets (searchr1-engine's --kv-cache-mb and
// --gpu-memory-utilization, the latter vLLM's CacheConfig.gpu_memory_utilization).
#pragma once
#include <cstddef>
#include <optional>

#include "backend/backend.h"
#include "model/config.h"

namespace sr1 {

struct KvBudget {
  std::optional<double> cache_mb;                // the cache's size, when given
  std::optional<double> gpu_memory_utilization;  // on a GPU: weights and cache's share of it
  int context = 0;                               // longest prompt + output
  int max_running = 0;                           // most sequences in one step
  int block_size = 0;                            // positions per block
  size_t step_bytes = 0;  // the buffers of the engine's largest step (Engine::largest_step_bytes)
};

// The cache gets cache_mb; or on a GPU with a gpu_memory_utilization U, what is left of U ×
// the GPU's memory once the engine's weights and the buffers of its largest step are counted
// (the trainer on the same GPU keeps the rest); or by default a share of the memory left
// after them (a quarter on the CPU, which the rest of the machine shares; 80 % of a GPU's).
// Without cache_mb, no more than max_running sequences of full context use. Throws
// UsageError, naming the option, when that leaves no room for one block.
int kv_blocks_for(const KvBudget& budget, const Backend& backend, const ModelConfig& config);

// What the budget reads of a device: the backend's, or a planned one's (searchr1-trainer plan).
struct DeviceMemory {
  bool cpu = false;
  size_t total = 0;  // the device's memory
  size_t live = 0;   // taken when the cache is sized: the weights, the cuBLASLt workspace
  size_t free = 0;   // free then
  size_t x_elem = 0;  // bytes of a compute-type element
};
int kv_blocks_for(const KvBudget& budget, const DeviceMemory& device, const ModelConfig& config);

}  // namespace sr1
