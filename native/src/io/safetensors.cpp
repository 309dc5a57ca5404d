#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "util/error.h"
#include "util/json.h"

namespace sr1 {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string errno_text() { return std::strerror(errno); }

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// numel * element size, or max() when it overflows.
size_t byte_count(const std::vector<int64_t>& shape, size_t elem) {
  size_t n = elem;
  for (int64_t d : shape) {
    auto dim = static_cast<size_t>(d);
    if (dim != 0 && n > std::numeric_limits<size_t>::max() / dim) {
      return std::numeric_limits<size_t>::max();
    }
    n *= dim;
  }
  return n;
}

// --- header parsing --------------------------------------------------------------------

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

int64_t get_int(const json::Value& v, const std::string& where) {
  if (!v.is_number()) throw Error(where + " must be an integer");
  try {
    return v.as_int();
  } catch (const Error&) {
    throw Error(where + " must be an integer; got " + v.dump());
  }
}

const json::Value& member(const json::Value& obj, const char* key, const std::string& where) {
  const json::Value* v = obj.find(key);
  if (v == nullptr) throw Error(where + ": missing \"" + key + "\"");
  return *v;
}

Entry parse_entry(const std::string& name, const json::Value& v, const std::string& path) {
  std::string where = path + ": tensor '" + name + "'";
  if (!v.is_object()) throw Error(where + ": entry must be an object");
  Entry e;
  e.name = name;
  const json::Value& dtype = member(v, "dtype", where);
  if (!dtype.is_string()) throw Error(where + ": \"dtype\" must be a string");
  e.dtype = dtype_from_name(dtype.as_string(), where);

  const json::Value& shape = member(v, "shape", where);
  if (!shape.is_array()) throw Error(where + ": \"shape\" must be an array of integers");
  for (const auto& d : shape.as_array()) e.shape.push_back(get_int(d, where + ": shape entry"));
  for (int64_t d : e.shape) {
    if (d < 0) throw Error(where + ": shape " + shape_str(e.shape) + " has a negative dimension");
  }

  const json::Value& offs = member(v, "data_offsets", where);
  if (!offs.is_array() || offs.as_array().size() != 2) {
    throw Error(where + ": \"data_offsets\" must be [begin, end]");
  }
  int64_t begin = get_int(offs.as_array()[0], where + ": data_offsets begin");
  int64_t end = get_int(offs.as_array()[1], where + ": data_offsets end");
  std::string offs_text =
      "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (begin < 0 || end < begin) throw Error(where + ": " + offs_text + " are not an ordered range");
  e.begin = static_cast<uint64_t>(begin);
  e.end = static_cast<uint64_t>(end);
  size_t need = byte_count(e.shape, dtype_size(e.dtype));
  if (e.end - e.begin != need) {
    std::string need_text =
        need == std::numeric_limits<size_t>::max() ? "more than 2^64" : std::to_string(need);
    throw Error(where + ": " + offs_text + " hold " + std::to_string(e.end - e.begin) +
                " bytes but " + dtype_name(e.dtype) + " " + shape_str(e.shape) + " needs " +
                need_text);
  }
  return e;
}

std::map<std::string, std::string> parse_metadata(const json::Value& v, const std::string& path) {
  std::string where = path + ": \"__metadata__\"";
  if (!v.is_object()) throw Error(where + " must be an object of strings");
  std::map<std::string, std::string> out;
  for (const auto& [k, val] : v.as_object()) {
    if (!val.is_string()) throw Error(where + ": value of '" + k + "' must be a string");
    out[k] = val.as_string();
  }
  return out;
}

// The tensors must tile the data buffer exactly: no overlap, no gap, nothing after the end.
void check_coverage(std::vector<const Entry*> entries, uint64_t data_size,
                    const std::string& path) {
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : entries) {
    std::string where = path + ": tensor '" + e->name + "'";
    if (e->end > data_size) {
      throw Error(where + ": data_offsets end " + std::to_string(e->end) +
                  " is past the end of the data (" + std::to_string(data_size) + " bytes)");
    }
    if (e->begin < cursor) {
      throw Error(where + ": data overlaps tensor '" + prev->name + "'");
    }
    if (e->begin > cursor) {
      throw Error(where + ": data starts at " + std::to_string(e->begin) +
                  " leaving a gap after byte " + std::to_string(cursor));
    }
    cursor = e->end;
    prev = e;
  }
  if (cursor != data_size) {
    throw Error(path + ": tensors cover " + std::to_string(cursor) + " of the " +
                std::to_string(data_size) + " data bytes");
  }
}

// --- writing helpers -------------------------------------------------------------------

void write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(errno_text());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

using Parts = std::vector<std::pair<const void*, size_t>>;

// Writes `parts` to a temporary file beside `path` and renames it into place; the
// temporary is removed on any failure.
void write_atomic(const std::string& path, const Parts& parts) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path + ": cannot write: " + errno_text());
  try {
    for (const auto& [data, n] : parts) write_all(fd, data, n);
    if (::close(fd) != 0) {
      fd = -1;
      throw Error(errno_text());
    }
    fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw Error(errno_text());
  } catch (const Error& e) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(path + ": cannot write: " + e.what());
  }
}

// Names unique and not "__metadata__", no negative dimension, data present.
void check_outputs(const std::vector<TensorOut>& tensors, const std::string& path) {
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    std::string where = path + ": cannot write tensor '" + t.name + "': ";
    if (t.name == "__metadata__") throw Error(where + "the name is reserved");
    if (!seen.insert(t.name).second) throw Error(where + "the name is repeated");
    for (int64_t d : t.shape) {
      if (d < 0) throw Error(where + "shape " + shape_str(t.shape) + " has a negative dimension");
    }
    size_t n = byte_count(t.shape, dtype_size(t.dtype));
    if (n == std::numeric_limits<size_t>::max()) throw Error(where + "it is too large");
    if (t.data == nullptr && n > 0) throw Error(where + "no data");
  }
}

std::string header_json(const std::vector<TensorOut>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  json::Value header = json::Value::object();
  if (!metadata.empty()) {
    json::Value meta = json::Value::object();
    for (const auto& [k, v] : metadata) meta.set(k, v);
    header.set("__metadata__", std::move(meta));
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    json::Value shape = json::Value::array();
    for (int64_t d : t.shape) shape.push(d);
    uint64_t end = offset + byte_count(t.shape, dtype_size(t.dtype));
    json::Value entry = json::Value::object({{"dtype", dtype_name(t.dtype)}, {"shape", shape}});
    entry.set("data_offsets", json::Value::array({static_cast<int64_t>(offset),
                                                   static_cast<int64_t>(end)}));
    // Names were checked unique; set() would rescan the members for each tensor.
    header.as_object().emplace_back(t.name, std::move(entry));
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

// --- SafetensorsFile -------------------------------------------------------------------

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot read: " + errno_text());
  struct stat st;
  std::string why;
  if (::fstat(fd, &st) != 0) {
    why = errno_text();
  } else if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
  }
  if (!why.empty()) {
    ::close(fd);
    throw Error(path + ": cannot read: " + why);
  }
  auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw Error(path + ": file is " + std::to_string(size) +
                " bytes, too short for a safetensors header");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) throw Error(path + ": cannot map: " + std::strerror(map_errno));
  f->map_ = map;
  f->map_size_ = size;

  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    throw Error(path + ": header length " + std::to_string(header_len) + " exceeds the limit of " +
                std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (header_len > size - 8) {
    throw Error(path + ": header length " + std::to_string(header_len) +
                " runs past the end of the " + std::to_string(size) + "-byte file");
  }
  json::Value header;
  try {
    header = json::parse(std::string(reinterpret_cast<const char*>(bytes + 8), header_len));
  } catch (const Error& e) {
    throw Error(path + ": header: " + e.what());
  }
  if (!header.is_object()) throw Error(path + ": header is not a JSON object");

  std::vector<Entry> entries;
  for (const auto& [name, v] : header.as_object()) {
    if (name == "__metadata__") {
      f->metadata_ = parse_metadata(v, path);
    } else {
      entries.push_back(parse_entry(name, v, path));
    }
  }
  std::vector<const Entry*> ptrs;
  for (const auto& e : entries) ptrs.push_back(&e);
  uint64_t data_start = 8 + header_len;
  check_coverage(ptrs, size - data_start, path);

  for (auto& e : entries) {
    f->index_[e.name] = f->tensors_.size();
    f->tensors_.push_back(TensorView{e.name, e.dtype, std::move(e.shape),
                                     bytes + data_start + e.begin,
                                     static_cast<size_t>(e.end - e.begin), path});
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// --- SafetensorsSet --------------------------------------------------------------------

SafetensorsSet SafetensorsSet::open_file(const std::string& path) {
  SafetensorsSet set;
  set.source_ = path;
  set.files_.push_back(SafetensorsFile::open(path));
  for (const auto& t : set.files_.back()->tensors()) set.by_name_[t.name] = &t;
  return set;
}

SafetensorsSet SafetensorsSet::open_dir(const std::string& dir) {
  std::string index_path = join(dir, kIndexFile);
  if (!file_exists(index_path)) {
    std::string single = join(dir, kSingleFile);
    if (!file_exists(single)) {
      throw Error(dir + ": no " + kSingleFile + " or " + kIndexFile);
    }
    SafetensorsSet set = open_file(single);
    set.source_ = dir;
    return set;
  }

  json::Value index = json::parse_file(index_path);
  const json::Value* map = index.find("weight_map");
  if (map == nullptr || !map->is_object()) {
    throw Error(index_path + ": missing \"weight_map\" object");
  }
  SafetensorsSet set;
  set.source_ = dir;
  std::map<std::string, const SafetensorsFile*> shards;
  for (const auto& [name, shard] : map->as_object()) {
    if (!shard.is_string()) {
      throw Error(index_path + ": weight_map entry '" + name + "' must be a file name");
    }
    const std::string& file = shard.as_string();
    auto it = shards.find(file);
    if (it == shards.end()) {
      std::string shard_path = join(dir, file);
      if (!file_exists(shard_path)) {
        throw Error(index_path + ": shard '" + file + "' (for '" + name + "') not found: " +
                    shard_path);
      }
      set.files_.push_back(SafetensorsFile::open(shard_path));
      it = shards.emplace(file, set.files_.back().get()).first;
    }
    const TensorView* t = it->second->find(name);
    if (t == nullptr) {
      throw Error(index_path + ": tensor '" + name + "' is mapped to '" + file +
                  "' but that shard does not contain it");
    }
    set.by_name_[name] = t;
  }
  return set;
}

const TensorView* SafetensorsSet::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, _] : by_name_) out.push_back(name);
  return out;
}

// --- conversion ------------------------------------------------------------------------

namespace {

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool is_float(DType d) {
  return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64;
}

// Float dtypes only; the caller checks the dtype. Unaligned-safe (memcpy loads).
void floats_to_f32(const TensorView& t, float* dst) {
  size_t n = static_cast<size_t>(t.numel());
  const uint8_t* p = t.data;
  switch (t.dtype) {
    case DType::F32: std::copy_n(p, n * 4, reinterpret_cast<uint8_t*>(dst)); break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load<uint16_t>(p + 2 * i));
      break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load<uint16_t>(p + 2 * i));
      break;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load<double>(p + 8 * i));
      break;
    default: break;
  }
}

// Integer dtypes only; returns false for any other dtype. U64 values above INT64_MAX throw.
bool ints_to_i64(const TensorView& t, int64_t* dst) {
  size_t n = static_cast<size_t>(t.numel());
  const uint8_t* p = t.data;
  switch (t.dtype) {
    case DType::BOOL:
      for (size_t i = 0; i < n; ++i) dst[i] = p[i] != 0;
      return true;
    case DType::U8:
      for (size_t i = 0; i < n; ++i) dst[i] = p[i];
      return true;
    case DType::I8:
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<int8_t>(p[i]);
      return true;
    case DType::I16:
      for (size_t i = 0; i < n; ++i) dst[i] = load<int16_t>(p + 2 * i);
      return true;
    case DType::U16:
      for (size_t i = 0; i < n; ++i) dst[i] = load<uint16_t>(p + 2 * i);
      return true;
    case DType::I32:
      for (size_t i = 0; i < n; ++i) dst[i] = load<int32_t>(p + 4 * i);
      return true;
    case DType::U32:
      for (size_t i = 0; i < n; ++i) dst[i] = load<uint32_t>(p + 4 * i);
      return true;
    case DType::I64:
      std::copy_n(p, n * 8, reinterpret_cast<uint8_t*>(dst));  // memcpy rejects null when empty
      return true;
    case DType::U64:
      for (size_t i = 0; i < n; ++i) {
        auto v = load<uint64_t>(p + 8 * i);
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          throw Error(t.file + ": tensor '" + t.name + "': U64 value " + std::to_string(v) +
                      " does not fit in int64");
        }
        dst[i] = static_cast<int64_t>(v);
      }
      return true;
    default: return false;
  }
}

}  // namespace

void check_f32(const TensorView& t, const std::vector<int64_t>& expected_shape) {
  if (!is_float(t.dtype)) {
    throw Error(t.file + ": tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) +
                "; expected a floating-point dtype (F32, F16, BF16)");
  }
  if (t.shape != expected_shape) {
    throw Error(t.file + ": tensor '" + t.name + "' has shape " + shape_str(t.shape) +
                "; expected " + shape_str(expected_shape));
  }
}

void read_f32(const TensorView& t, const std::vector<int64_t>& expected_shape, float* dst) {
  check_f32(t, expected_shape);
  floats_to_f32(t, dst);
}

std::vector<int64_t> read_i64(const TensorView& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  if (!ints_to_i64(t, out.data())) {
    throw Error(t.file + ": tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) +
                "; expected an integer or bool dtype");
  }
  return out;
}

std::vector<float> read_as_f32(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (is_float(t.dtype)) {
    floats_to_f32(t, out.data());
    return out;
  }
  std::vector<int64_t> ints = read_i64(t);
  for (size_t i = 0; i < ints.size(); ++i) out[i] = static_cast<float>(ints[i]);
  return out;
}

// --- writing ---------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  check_outputs(tensors, path);
  std::string header = header_json(tensors, metadata);
  uint8_t len_bytes[8];  // little-endian u64
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  Parts parts = {{len_bytes, 8}, {header.data(), header.size()}};
  for (const auto& t : tensors) {
    parts.emplace_back(t.data, byte_count(t.shape, dtype_size(t.dtype)));
  }
  write_atomic(path, parts);
}

std::vector<std::string> write_model_weights(const std::string& dir,
                                             const std::vector<TensorOut>& tensors,
                                             uint64_t max_shard_bytes) {
  check_outputs(tensors, dir);  // up front, so no shard is written for a bad list
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const auto& t : tensors) {
    sizes.push_back(byte_count(t.shape, dtype_size(t.dtype)));
    total += sizes.back();
  }
  std::string index_path = join(dir, kIndexFile);
  std::string single_path = join(dir, kSingleFile);

  if (total <= max_shard_bytes) {
    write_safetensors(single_path, tensors);
    // A stale index would win over the new file in open_dir (and in transformers).
    ::unlink(index_path.c_str());
    return {kSingleFile};
  }

  // Greedy split in order: close a shard before a tensor would push it past the limit.
  std::vector<std::vector<TensorOut>> shards;
  uint64_t used = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (shards.empty() || (used > 0 && used + sizes[i] > max_shard_bytes)) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(tensors[i]);
    used += sizes[i];
  }

  std::vector<std::string> written;
  std::map<std::string, std::string> weight_map;  // sorted by name, as transformers writes it
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    write_safetensors(join(dir, name), shards[s]);
    for (const auto& t : shards[s]) weight_map[t.name] = name;
    written.push_back(name);
  }

  json::Value wm = json::Value::object();
  for (const auto& [k, v] : weight_map) wm.as_object().emplace_back(k, v);
  json::Value index = json::Value::object(
      {{"metadata", json::Value::object({{"total_size", static_cast<int64_t>(total)}})},
       {"weight_map", std::move(wm)}});
  std::string text = index.dump_pretty() + "\n";
  write_atomic(index_path, {{text.data(), text.size()}});
  written.push_back(kIndexFile);
  // transformers prefers model.safetensors over the index, so a stale one must go.
  ::unlink(single_path.c_str());
  return written;
}

}  // namespace sr1
