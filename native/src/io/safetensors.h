// safetensors files: memory-mapped reading (single files and sharded folders with
// model.safetensors.index.json), dtype conversion to float32, and atomic writing.
// Format: u64 LE header length N, N bytes of JSON (space-padded to a multiple of 8),
// then the little-endian row-major data; data_offsets are relative to the data start.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace sr1 {

enum class DType { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

const char* dtype_name(DType dtype);  // "BF16", "F32", ...
size_t dtype_size(DType dtype);
// Throws sr1::Error naming `where` for an unknown or unsupported dtype string.
DType dtype_from_name(const std::string& name, const std::string& where);
// A floating-point dtype as a user or config.json spells it, in any case: bf16 | bfloat16,
// fp16 | float16 | f16, fp32 | float32 | f32 (commands print bf16, fp16, fp32). Returns
// false for anything else.
bool float_dtype_from_text(const std::string& text, DType* out);

float bf16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float v);  // round to nearest even; NaN stays NaN
float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float v);  // round to nearest even; overflow gives inf

std::string shape_str(const std::vector<int64_t>& shape);  // "[4, 16]"

struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data;  // points into the mapped file
  size_t nbytes;
  std::string file;  // path of the file holding it, for error messages
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps the file and validates the header (JSON, dtypes, offsets inside the buffer, byte
  // counts matching shapes). Throws sr1::Error naming the path on any problem.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }  // header order
  const TensorView* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a Hugging Face folder: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json` (its weight_map decides which file holds each name).
class SafetensorsSet {
 public:
  // Throws sr1::Error naming the folder when neither layout is present, or naming the
  // index or shard when one is malformed or missing.
  static SafetensorsSet open_dir(const std::string& dir);
  static SafetensorsSet open_file(const std::string& path);

  const TensorView* find(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // Where tensors come from, for error messages: the folder or the single file.
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> by_name_;
};

// Throws sr1::Error naming the file and tensor when the dtype is not a float type or the
// shape differs from `expected_shape` (what read_f32 would throw, without reading).
void check_f32(const TensorView& t, const std::vector<int64_t>& expected_shape);
// Copies a tensor into float32, converting from F32, F16 or BF16 (F64 too), after check_f32.
void read_f32(const TensorView& t, const std::vector<int64_t>& expected_shape, float* dst);
// Copies an integer or bool tensor (BOOL, U8, I8, I16, I32, I64, U32) into int64.
std::vector<int64_t> read_i64(const TensorView& t);
// Copies any numeric tensor into float32 (floats as above; integers converted).
std::vector<float> read_as_f32(const TensorView& t);

struct TensorOut {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // numel(shape) * dtype_size(dtype) bytes, already in `dtype`
};

// Writes one safetensors file atomically (a temporary name beside it, then rename).
// Tensors are laid out in the order given; header padded with spaces to a multiple of 8.
void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes the weights of a Hugging Face folder into `dir` (which must exist): a single
// `model.safetensors` when the total fits in `max_shard_bytes`, otherwise
// `model-0000k-of-0000n.safetensors` shards (tensors kept in order, a shard closed before
// it would exceed the limit) and `model.safetensors.index.json` with metadata.total_size.
// The other layout's entry file (a stale index or model.safetensors) is removed, since
// loaders would prefer it. Returns the file names written.
std::vector<std::string> write_model_weights(const std::string& dir,
                                             const std::vector<TensorOut>& tensors,
                                             uint64_t max_shard_bytes);

}  // namespace sr1
