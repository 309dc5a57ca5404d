#include "index/scalar_quantizer.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "io/safetensors.h"

namespace sr1 {

namespace {

// faiss's encode_fp16 as faiss 1.7.3 runs it (faiss/utils/fp16-inl.h, after F. Giesen's
// float_to_half_fast3): the 12 low mantissa bits dropped, the exponent rebased by a float
// multiply by 2^-112 (which rounds half-precision subnormals to nearest-even at the float's
// granularity), then half an ulp added before the 13 low bits go: ties round away from
// zero, not to even as F16C does, so 0.007% of e5 components differ by an ulp from
// f32_to_f16's. Overflow gives inf, NaN a quiet NaN.
uint16_t faiss_fp16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t sign = bits & 0x80000000u, magnitude = bits ^ sign;
  constexpr uint32_t kInf = 255u << 23;
  uint32_t half = magnitude > kInf ? 0x7e00u : 0x7c00u;
  if (magnitude < kInf) {
    const uint32_t kept = magnitude & ~0xfffu;
    float v, scale, largest;
    const uint32_t scale_bits = 15u << 23, largest_bits = (31u << 23) - 0x1000u;
    std::memcpy(&v, &kept, 4);
    std::memcpy(&scale, &scale_bits, 4);
    std::memcpy(&largest, &largest_bits, 4);
    v = std::min(v * scale, largest);
    uint32_t scaled;
    std::memcpy(&scaled, &v, 4);
    half = (scaled + 0x1000u) >> 13;
  }
  return static_cast<uint16_t>(half | (sign >> 16));
}

}  // namespace

void ScalarQuantizer::observe(const float* rows, int64_t n) {
  if (qtype != SqType::QT_8bit) return;
  if (trained.empty()) {
    trained.assign(size_t(2) * d, 0.f);
    std::fill(trained.begin(), trained.begin() + d, std::numeric_limits<float>::infinity());
    std::fill(trained.begin() + d, trained.end(), -std::numeric_limits<float>::infinity());
  }
  float* vmin = trained.data();
  float* vmax = trained.data() + d;
  for (int64_t i = 0; i < n; i++) {
    const float* x = rows + i * d;
    for (int j = 0; j < d; j++) {
      if (x[j] < vmin[j]) vmin[j] = x[j];
      if (x[j] > vmax[j]) vmax[j] = x[j];
    }
  }
}

void ScalarQuantizer::finish_training() {
  if (qtype != SqType::QT_8bit) return;
  float* vmin = trained.data();
  float* vmax = trained.data() + d;
  for (int j = 0; j < d; j++) {  // rangestat_arg 0: the range as observed
    const float widen = (vmax[j] - vmin[j]) * rangestat_arg;
    vmin[j] -= widen;
    vmax[j] += widen;
    vmax[j] = vmax[j] - vmin[j];  // now vdiff
  }
}

void ScalarQuantizer::encode(const float* x, uint8_t* code) const {
  if (qtype == SqType::QT_fp16) {
    for (int j = 0; j < d; j++) {
      const uint16_t h = faiss_fp16(x[j]);
      std::memcpy(code + 2 * j, &h, 2);
    }
    return;
  }
  const float* vmin = trained.data();
  const float* vdiff = trained.data() + d;
  for (int j = 0; j < d; j++) {
    float u = 0;
    if (vdiff[j] != 0) {
      u = (x[j] - vmin[j]) / vdiff[j];
      if (u < 0) u = 0;
      if (u > 1.0f) u = 1.0f;
    }
    code[j] = static_cast<uint8_t>(static_cast<int>(255 * u));
  }
}

void ScalarQuantizer::decode(const unsigned char* code, float* x) const {
  if (qtype == SqType::QT_fp16) {
    for (int j = 0; j < d; j++) {
      uint16_t h;
      std::memcpy(&h, code + 2 * j, 2);
      x[j] = f16_to_f32(h);
    }
    return;
  }
  const float* vmin = trained.data();
  const float* vdiff = trained.data() + d;
  for (int j = 0; j < d; j++) x[j] = vmin[j] + ((code[j] + 0.5f) / 255.0f) * vdiff[j];
}

}  // namespace sr1
