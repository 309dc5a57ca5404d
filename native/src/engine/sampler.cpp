#include "engine/sampler.h"

namespace sr1 {

SampleRow backend_row(const SamplingParams& p, TokenRng& rng) {
  if (p.greedy()) return SampleRow{};
  return SampleRow{p.temperature, rng.uniform(), p.top_p, p.top_k, p.min_p};
}

}  // namespace sr1
