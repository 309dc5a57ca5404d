#include "model/hf_folder.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "util/error.h"
#include "util/json.h"

namespace fs = std::filesystem;

namespace sr1 {

OutputFolder::OutputFolder(std::string path, bool overwrite)
    : path_(std::move(path)), overwrite_(overwrite) {
  while (!path_.empty() && path_.size() > 1 && path_.back() == '/') path_.pop_back();
  // The rule every searchr1 command follows: an existing output (anything but an empty
  // folder) is a usage error naming it and --overwrite.
  std::error_code probe;
  const bool empty_dir = fs::is_directory(path_, probe) && fs::is_empty(path_, probe) && !probe;
  if (fs::exists(path_) && !empty_dir && !overwrite_) {
    throw UsageError(path_ + ": already exists; pass --overwrite to replace it");
  }
  partial_ = path_ + ".partial-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(partial_, ec);
  if (!fs::create_directories(partial_, ec) || ec) {
    throw Error(partial_ + ": cannot create folder: " + ec.message());
  }
}

OutputFolder::~OutputFolder() {
  if (done_) return;
  std::error_code ec;
  fs::remove_all(partial_, ec);
}

void OutputFolder::copy_model_files(const std::string& model_dir) {
  for (const fs::directory_entry& e : fs::directory_iterator(model_dir)) {
    const std::string name = e.path().filename().string();
    const bool weights = name.find(".safetensors") != std::string::npos ||
                         name.find(".bin") != std::string::npos ||
                         name.find(".pt") != std::string::npos;
    if (!e.is_regular_file() || weights) continue;
    std::error_code ec;
    fs::copy_file(e.path(), fs::path(partial_) / name, ec);
    if (ec) throw Error(e.path().string() + ": cannot copy: " + ec.message());
  }
}

void OutputFolder::commit() {
  std::error_code ec;
  if (fs::exists(path_)) {
    const std::string old = path_ + ".old-" + std::to_string(::getpid());
    fs::rename(path_, old, ec);
    if (!ec) fs::rename(partial_, path_, ec);
    if (!ec) fs::remove_all(old, ec);
  } else {
    fs::rename(partial_, path_, ec);
  }
  if (ec) throw Error(path_ + ": cannot move the finished folder into place: " + ec.message());
  done_ = true;
}

static const char* torch_dtype_name(DType d) {
  return d == DType::F32 ? "float32" : d == DType::BF16 ? "bfloat16" : "float16";
}

// The copied config.json names the dtype the weights were saved in, under the key(s) it
// already has: `dtype` (transformers 5), `torch_dtype` (4.x), or torch_dtype when neither.
// A critic's says what transformers needs to load it: a token-classification model with one
// label (AutoModelForTokenClassification, as verl's critic).
static void write_config(const std::string& dir, DType dtype, const ModelConfig& c, Head head) {
  const std::string path = dir + "/config.json";
  json::Value config = json::parse_file(path);
  const bool has_dtype = config.find("dtype") != nullptr;
  if (has_dtype) config.set("dtype", json::Value(torch_dtype_name(dtype)));
  if (!has_dtype || config.find("torch_dtype") != nullptr) {
    config.set("torch_dtype", json::Value(torch_dtype_name(dtype)));
  }
  if (head == Head::Value) {
    const std::string arch = c.model_type == "llama" ? "LlamaForTokenClassification"
                                                     : "Qwen2ForTokenClassification";
    config.set("architectures", json::Value::array({json::Value(arch)}));
    config.set("id2label", json::Value::object({{"0", "LABEL_0"}}));
    config.set("label2id", json::Value::object({{"LABEL_0", 0}}));
    config.set("classifier_dropout", 0.0);
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw Error(path + ": cannot write");
  const std::string text = config.dump_pretty() + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw Error(path + ": cannot write");
}

void write_hf_model(OutputFolder& out, Qwen2Model& model, const std::string& source_dir,
                    DType dtype, uint64_t max_shard_bytes, const float* host) {
  out.copy_model_files(source_dir);
  write_config(out.dir(), dtype, model.config(), model.head_kind());
  model.save_weights(out.dir(), dtype, max_shard_bytes, host);
}

}  // namespace sr1
