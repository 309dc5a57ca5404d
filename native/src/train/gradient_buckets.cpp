#include "train/gradient_buckets.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace sr1 {

namespace {

// Floats of the widest region but the last (whose bucket is its own).
size_t widest_of(const std::vector<std::pair<size_t, size_t>>& regions) {
  size_t widest = 0;
  for (size_t r = 0; r + 1 < regions.size(); r++) {
    widest = std::max(widest, regions[r].second - regions[r].first);
  }
  return widest;
}

}  // namespace

GradientBuckets::GradientBuckets(Backend& backend,
                                 const std::vector<std::pair<size_t, size_t>>& regions)
    : be_(backend), whole_pass_(regions.back()), widest_(widest_of(regions)) {}

GradientBuckets::~GradientBuckets() { release(); }

float* GradientBuckets::open(size_t begin, size_t end) {
  if (shared_ == nullptr) {
    shared_ = be_.alloc(widest_);
    own_ = be_.alloc(whole_pass_.second - whole_pass_.first);
  }
  float* bucket = std::make_pair(begin, end) == whole_pass_ ? own_ : shared_;
  if (bucket == shared_ && end - begin > widest_) {
    throw Error("gradient region [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") wider than its bucket (a bug)");
  }
  be_.zero(bucket, end - begin);
  return bucket;
}

void GradientBuckets::release() {
  if (shared_ == nullptr) return;
  be_.synchronize();
  be_.release(shared_);
  be_.release(own_);
  shared_ = own_ = nullptr;
}

size_t GradientBuckets::bytes() const {
  return (widest_ + whole_pass_.second - whole_pass_.first) * sizeof(float);
}

size_t GradientBuckets::bytes(const std::vector<std::pair<size_t, size_t>>& regions) {
  return (widest_of(regions) + regions.back().second - regions.back().first) * sizeof(float);
}

}  // namespace sr1
