#include "model/batch.h"

#include "util/error.h"

namespace sr1 {
namespace {

void check_token_shape(const TensorView& t, int B, int T) {
  if (t.shape.size() != 2 || (B >= 0 && (t.shape[0] != B || t.shape[1] != T))) {
    const std::string want = B >= 0 ? shape_str({B, T}) : "[B, T]";
    throw Error(t.file + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) +
                "; expected " + want);
  }
}

// position = (real tokens up to and including this one) - 1, floored at 0: the same
// position ids verl and Hugging Face derive from the attention mask.
void fill_positions(Batch& batch) {
  batch.positions.assign(batch.ids.size(), 0);
  for (int b = 0; b < batch.B; b++) {
    int seen = 0;
    for (int t = 0; t < batch.T; t++) {
      const size_t i = static_cast<size_t>(b) * batch.T + t;
      seen += batch.mask[i];
      batch.positions[i] = seen > 0 ? seen - 1 : 0;
    }
  }
}

}  // namespace

Batch Batch::rows(int b0, int b1) const {
  Batch out;
  out.B = b1 - b0;
  out.T = T;
  const size_t from = static_cast<size_t>(b0) * T, to = static_cast<size_t>(b1) * T;
  out.ids.assign(ids.begin() + from, ids.begin() + to);
  out.mask.assign(mask.begin() + from, mask.begin() + to);
  out.positions.assign(positions.begin() + from, positions.begin() + to);
  return out;
}

Batch read_batch(const SafetensorsFile& file, int vocab_size) {
  const TensorView* ids = file.find("input_ids");
  if (ids == nullptr) throw Error(file.path() + ": tensor 'input_ids' is missing");
  check_token_shape(*ids, -1, -1);
  if (ids->dtype != DType::I32 && ids->dtype != DType::I64) {
    throw Error(file.path() + ": tensor 'input_ids' has dtype " + dtype_name(ids->dtype) +
                "; expected I32 or I64");
  }
  Batch batch;
  batch.B = static_cast<int>(ids->shape[0]);
  batch.T = static_cast<int>(ids->shape[1]);
  if (batch.B == 0 || batch.T == 0) {
    throw Error(file.path() + ": tensor 'input_ids' is empty " + shape_str(ids->shape));
  }
  const std::vector<int64_t> raw_ids = read_i64(*ids);
  std::vector<int64_t> raw_mask(raw_ids.size(), 1);
  if (const TensorView* mask = file.find("attention_mask")) {
    check_token_shape(*mask, batch.B, batch.T);
    raw_mask = read_i64(*mask);
  }
  batch.ids.resize(raw_ids.size());
  batch.mask.resize(raw_ids.size());
  for (size_t i = 0; i < raw_ids.size(); i++) {
    const std::string at = " at [" + std::to_string(i / batch.T) + ", " +
                            std::to_string(i % batch.T) + "]";
    if (raw_mask[i] != 0 && raw_mask[i] != 1) {
      throw Error(file.path() + ": tensor 'attention_mask' holds " +
                  std::to_string(raw_mask[i]) + at + "; expected 0 or 1");
    }
    batch.mask[i] = static_cast<int32_t>(raw_mask[i]);
    if (batch.mask[i] && (raw_ids[i] < 0 || raw_ids[i] >= vocab_size)) {
      throw Error(file.path() + ": tensor 'input_ids' holds token " +
                  std::to_string(raw_ids[i]) + at + ", outside the vocabulary [0, " +
                  std::to_string(vocab_size) + ")");
    }
    batch.ids[i] = batch.mask[i] ? static_cast<int32_t>(raw_ids[i]) : 0;
  }
  fill_positions(batch);
  return batch;
}

std::vector<float> read_token_values(const SafetensorsFile& file, const std::string& name,
                                     const Batch& batch, bool required) {
  const TensorView* t = file.find(name);
  if (t == nullptr) {
    if (required) throw Error(file.path() + ": tensor '" + name + "' is missing");
    return {};
  }
  check_token_shape(*t, batch.B, batch.T);
  return read_as_f32(*t);
}

}  // namespace sr1
