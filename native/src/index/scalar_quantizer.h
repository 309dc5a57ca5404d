// faiss's ScalarQuantizer (faiss/impl/ScalarQuantizer.h, .cpp; scalar_quantizer/training.cpp
// train_NonUniform; quantizers.h QuantizerTemplate NON_UNIFORM; codecs.h Codec8bit) for the
// two types index_factory's "SQ8" and "SQfp16" make:
//   QT_8bit (qtype 0), rangestat RS_minmax (0), rangestat_arg 0: trained on all the vectors
//     as min and max per dimension, stored as `trained` = [vmin (d), vdiff = vmax - vmin (d)];
//     a component is coded as int(255 · clamp((x - vmin) / vdiff, 0, 1)) (0 where vdiff is 0)
//     and decoded as vmin + (code + 0.5) / 255 · vdiff;
//   QT_fp16 (qtype 4): each component as an IEEE half; nothing trained.
// One code is code_size bytes: d for QT_8bit, 2d for QT_fp16.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sr1 {

enum class SqType : int32_t { QT_8bit = 0, QT_fp16 = 4 };  // faiss's QuantizerType values

struct ScalarQuantizer {
  SqType qtype = SqType::QT_8bit;
  int32_t rangestat = 0;     // RS_minmax
  float rangestat_arg = 0;   // no widening of the range
  int d = 0;
  std::vector<float> trained;  // QT_8bit: vmin then vdiff; QT_fp16: empty

  uint64_t code_size() const { return qtype == SqType::QT_fp16 ? 2 * uint64_t(d) : uint64_t(d); }
  // "SQ8" / "SQfp16"
  const char* factory_name() const { return qtype == SqType::QT_fp16 ? "SQfp16" : "SQ8"; }

  // QT_8bit: widens the running per-dimension [min, max] (held in `trained` as vmin and
  // vmax until finish_training) with n rows; call with every row, then finish_training.
  void observe(const float* rows, int64_t n);
  void finish_training();

  void encode(const float* x, uint8_t* code) const;
  // Decodes a code (at any address) into d floats.
  void decode(const unsigned char* code, float* x) const;
};

}  // namespace sr1
