// Writing a model as a Hugging Face folder (what sft, export and checkpoints produce), into
// an output folder that only appears once complete.
#pragma once
#include <cstdint>
#include <string>

#include "io/safetensors.h"
#include "model/qwen2.h"

namespace sr1 {

// A Hugging Face output folder built at `<path>.partial-<pid>` and renamed to `path` by
// commit(); removed if destroyed before. An existing `path` (other than an empty folder) is
// a UsageError unless overwrite is set; it is then replaced only by commit().
class OutputFolder {
 public:
  OutputFolder(std::string path, bool overwrite);
  ~OutputFolder();
  const std::string& dir() const { return partial_; }
  // Copies config.json, tokenizer and generation files (not weights) from `model_dir`.
  void copy_model_files(const std::string& model_dir);
  void commit();

 private:
  std::string path_, partial_;
  bool overwrite_, done_ = false;
};

// The largest safetensors shard written unless asked otherwise: transformers' 5GB.
constexpr uint64_t kMaxShardBytes = 5000000000ULL;

// Fills `out` with a Hugging Face folder of the model: config.json (its dtype field set to
// `dtype`), the tokenizer and generation files of `source_dir`, and the weights in `dtype`.
// `host`: the fp32 weights to write instead of the model's own (Qwen2Model::save_weights).
void write_hf_model(OutputFolder& out, Qwen2Model& model, const std::string& source_dir,
                    DType dtype, uint64_t max_shard_bytes, const float* host = nullptr);

}  // namespace sr1
