// A batch of token sequences as the model consumes it, read from a safetensors batch file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace sr1 {

struct Batch {
  int B = 0, T = 0;
  std::vector<int32_t> ids;        // [B*T]; padded positions hold 0
  // [B*T]; 0 = padding, else the id of the token's sequence: 1 in a batch file, 1, 2, ... in
  // a packed micro-batch, whose rows hold several sequences end to end (the attention
  // contract in backend/backend.h).
  std::vector<int32_t> mask;
  std::vector<int32_t> positions;  // [B*T]; rotary position = real tokens before it

  // Token (b, t) is predicted (gets a log-prob) when the token before it is a real token of
  // the same sequence.
  bool predicted(int b, int t) const {
    const size_t i = static_cast<size_t>(b) * T + t;
    return t >= 1 && mask[i] != 0 && mask[i - 1] == mask[i];
  }
  // Rows [b0, b1) as a batch of their own (a micro-batch).
  Batch rows(int b0, int b1) const;
};

// Builds a batch from `input_ids` ([B, T], int32 or int64) and the optional
// `attention_mask` ([B, T], 0/1; left or right padding) of a safetensors file. Throws
// sr1::Error naming the file and tensor for a bad shape, dtype, mask value or token id.
Batch read_batch(const SafetensorsFile& file, int vocab_size);

// A per-token tensor ([B, T], any numeric dtype) of the same file as float32. When
// `required` is false a missing tensor gives an empty vector.
std::vector<float> read_token_values(const SafetensorsFile& file, const std::string& name,
                                     const Batch& batch, bool required);

}  // namespace sr1
