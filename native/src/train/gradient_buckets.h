// ZeRO stage 2's gradient buckets: the device buffers a backward pass computes its gradient
// into, one region of the parameters at a time (Qwen2Model::GradientSink), before the learner
// sums each region onto the ranks' shards (train/learner.h). DeepSpeed's reduce_bucket_size
// (deepspeed/runtime/zero/stage_1_and_2.py), one region wide: the pass's last region (the
// embeddings, which a tied head adds to first) has a bucket of its own for the whole pass,
// and the others share one as wide as the widest of them, one region at a time.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace sr1 {

class GradientBuckets {
 public:
  // `regions`: [begin, end) of each region a pass hands over, in order
  // (Qwen2Model::gradient_regions()). Nothing is allocated until the first open().
  GradientBuckets(Backend& backend, const std::vector<std::pair<size_t, size_t>>& regions);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // A zeroed bucket for the gradient of region [begin, end); the first call allocates both.
  float* open(size_t begin, size_t end);
  // Frees both buckets (after the work queued on them); the next open() allocates them again.
  void release();
  // Device bytes of the two buckets, allocated or not (what a pass holds).
  size_t bytes() const;
  // The same for `regions`, without a backend (the memory plan).
  static size_t bytes(const std::vector<std::pair<size_t, size_t>>& regions);

 private:
  Backend& be_;
  std::pair<size_t, size_t> whole_pass_;  // the region whose bucket stays open all pass
  size_t widest_ = 0;                     // floats of the widest other region
  float* shared_ = nullptr;
  float* own_ = nullptr;  // whole_pass_'s
};

}  // namespace sr1
